"""Each step's time partition and loss budget (of the rank's busiest device), and time totals over the analysed steps."""

from __future__ import annotations

import polars as pl

from traceflops.core.results import ModelOptions
from traceflops.core.vocab import GAP_REASONS, OVERLAYS, PARTITION
from traceflops.metrics import budget as bd
from traceflops.stages import roofline
from traceflops.stages import timeline as tl


def attach_time(steps: pl.DataFrame, part: pl.DataFrame, peak: float | None) -> pl.DataFrame:
    """Each step's time partition, overlays and loss budget (of its primary device)."""
    rows = tl.on_device(part, tl.busiest_device(part)).select(pl.exclude("start", "window", "device")).rename(
        {c: f"time_{c}" for c in (*PARTITION, *OVERLAYS)}
    )
    steps = steps.join(rows, on="step", how="left")
    budgets = []
    for r in steps.iter_rows(named=True):
        time = {"window": r["window"], **{c: r.get(f"time_{c}") or 0.0 for c in (*PARTITION, *OVERLAYS)}}
        budgets.append(bd.loss_budget(bd.inputs_from_row(r, time, peak)))
    return steps.with_columns(loss_budget=pl.Series(budgets, dtype=pl.Object))


def idle_by_reason(gaps: pl.DataFrame | None, opt: ModelOptions) -> dict[str, float] | None:
    """Why the device sat idle: each gap is explained by the first rule that decides it."""
    if gaps is None:
        return None
    use = gaps.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    got = dict(use.group_by("reason").agg(pl.col("dur").sum()).iter_rows())
    return {r: float(got.get(r, 0.0)) for r in GAP_REASONS}


def memory_bound_us(kernels: pl.DataFrame, roof: pl.DataFrame, steps: pl.DataFrame, opt: ModelOptions) -> float:
    """Device time during which a memory-bound kernel ran (union over streams, within the analysed steps)."""
    bound = kernels.filter(roofline.memory_bound_overlay(roof))
    if bound.height == 0:
        return 0.0
    mb = tl.partition(bound, steps.select("step", "name", "ts", "dur", "start", "window"))
    mb = mb.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    return float((mb["window"] - mb["idle"]).sum())


def attach_launch_stats(steps: pl.DataFrame, stats: pl.DataFrame | None) -> pl.DataFrame:
    """Each step's kernel count, median kernel time and median launch delay (device traces only)."""
    if stats is None:
        return steps
    return steps.join(
        stats.select("step", pl.col("kernels").alias("launch_kernels"), pl.col("median_dur").alias("launch_median_kernel_us"),
                     pl.col("median_launch_delay").alias("launch_median_delay_us")),
        on="step", how="left",
    )
