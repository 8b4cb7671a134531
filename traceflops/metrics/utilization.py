"""MFU, HFU and per-phase sums: pure functions of the tagged, counted frames."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.vocab import PHASES

HFU_SUSPECT = 0.85


def phase_flops(ops: pl.DataFrame) -> pl.DataFrame:
    """Per step: FLOPs and matmul counts by phase.

    The in-kernel score recompute of an attention backward is moved from the
    op's phase to 'recompute' (it is in HFU, not in MFU).
    """
    work = ops.filter(pl.col("matmul") & pl.col("ran"))
    rec = pl.col("recompute_flops").fill_null(0)
    own = pl.col("flops") - rec
    rows = []
    for p in PHASES:
        in_p = pl.col("phase") == p
        f = pl.when(in_p).then(pl.col("flops") if p == "recompute" else own).otherwise(0)
        if p == "recompute":
            f = f + pl.when(pl.col("phase") != "recompute").then(rec).otherwise(0)
        rows.append(f.sum().alias(f"flops_{p}"))
        rows.append(in_p.sum().cast(pl.Int64).alias(f"count_{p}"))
    return work.group_by("step").agg(
        *rows,
        flops_unknown_count=pl.col("flops").is_null().sum().cast(pl.Int64),
        effective_flops=pl.col("effective_flops").sum(),
        attention_full_flops=pl.when(pl.col("mask").is_not_null()).then(pl.col("flops")).otherwise(0).sum(),
        attention_effective_flops=pl.when(pl.col("mask").is_not_null()).then(pl.col("effective_flops")).otherwise(0).sum(),
        attention_model_flops=pl.when(pl.col("mask").is_not_null() & pl.col("phase").is_in(["forward", "backward"]))
        .then(own)
        .otherwise(0)
        .sum(),
    )


def utilization(flops: float | None, seconds: float | None, peak: float | None, devices: int = 1) -> float | None:
    if flops is None or not seconds or not peak or devices <= 0:
        return None
    return float(flops) / (seconds * peak * devices)


def suspect(mfu: float | None, hfu: float | None) -> list[str]:
    out = []
    if hfu is not None and hfu > HFU_SUSPECT:
        out.append(f"HFU {hfu:.1%} is above {HFU_SUSPECT:.0%}: likely a counting error (wrong peak, precision or FLOPs), not a fast run")
    if mfu is not None and hfu is not None and mfu > hfu * (1 + 1e-9):
        out.append(f"MFU {mfu:.1%} exceeds HFU {hfu:.1%}: the model FLOPs exceed what was executed; check the model description or tokens per step")
    return out


def dominant_dtype(ops: pl.DataFrame) -> str | None:
    work = ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("flops").is_not_null() & pl.col("dtype").is_not_null())
    if work.height == 0:
        return None
    by = work.group_by("dtype").agg(pl.col("flops").sum()).sort(["flops", "dtype"], descending=[True, False])
    return by["dtype"][0]


def coverage(times: np.ndarray, known: np.ndarray) -> float | None:
    total = float(times.sum())
    return None if total <= 0 else float(times[known].sum()) / total
