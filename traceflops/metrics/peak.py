"""Which hardware and which peak: the device from the trace or the user, the precision that carries the matmul FLOPs."""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from traceflops.core import hardware as hw
from traceflops.core.results import ModelOptions
from traceflops.core.trace import Trace

# TF32 GEMM kernels: cuBLAS/xmma name it, CUTLASS Ampere kernels say s1688 / tensorop_s (fp32 I/O on tensor cores).
TF32_RE = re.compile(r"tf32|s1688|tensorop_s\d|xmma_gemm_f32f32_tf32", re.I)


def tf32_share(kernels: pl.DataFrame) -> float:
    """Share of matmul kernel time spent in TF32 kernels (fp32 tensors on tensor cores)."""
    mm = kernels.filter(pl.col("cls") == "matmul")
    total = mm["dur"].sum()
    return float(mm.filter(pl.col("name").str.contains(TF32_RE.pattern))["dur"].sum() / total) if total else 0.0


def choose_hardware(trace: Trace, ops: pl.DataFrame, kernels: pl.DataFrame, opt: ModelOptions, warnings: list[str]):
    precision = opt.precision
    dtype = dominant_dtype(ops)
    guessed = precision is None and dtype is None
    if precision is None:
        precision = dtype or "bf16"
        if precision == "fp32" and tf32_share(kernels) > 0.5:
            precision = "tf32"
    if opt.peak_tflops:
        h = hw.custom(opt.peak_tflops, precision)
        return hardware_row(h, precision, "--peak-tflops"), opt.peak_tflops * 1e12, precision
    detected, why = detect_device(trace, kernels)
    if opt.hardware:
        h = hw.lookup(opt.hardware)
        if h is None:
            warnings.append(f"unknown hardware '{opt.hardware}': give --peak-tflops (known: {', '.join(sorted(hw.HARDWARE))})")
        elif detected is not None and detected.name != h.name:
            warnings.append(f"--hardware {opt.hardware} ({h.name}) is not the trace's device ({detected.name}): "
                            f"MFU and HFU are against the {h.name} peak as asked")
    else:
        h = detected
        if h is None:
            what = why or ("no device in the trace (a CPU trace)" if not kernels.height else "no deviceProperties in the trace")
            warnings.append(f"hardware unknown: {what}; give --hardware NAME or --peak-tflops N to get MFU and HFU")
        elif "assumed" in why:  # a variant the trace cannot tell apart (hw.detect says which it took)
            warnings.append(f"hardware variant assumed: {why}; give --hardware NAME if it is another")
    if h is None:
        return None, None, precision
    if guessed:
        precision = next((p for p in ("bf16", "fp16", "fp32") if h.peak(p)), precision)
        why = "the profile's ops carry no element types" if trace.meta.get("format") == "xplane" else "no Input type in the trace"
        warnings.append(f"matmul dtypes unknown ({why}): assumed the {precision} peak; give --precision")
    peak = h.peak(precision)
    if peak is None:
        warnings.append(f"{h.name} has no dense {precision} peak in the table; give --precision or --peak-tflops")
    return hardware_row(h, precision, h.source), peak, precision


def detect_device(trace: Trace, kernels: pl.DataFrame):
    """The device the trace ran on (its deviceProperties, else the XLA device) and why it is not known, if not."""
    props = trace.meta.get("device_properties") or []
    dev_ids = kernels["device"].drop_nulls().unique().to_list() if kernels.height else []
    chosen = next((p for p in props if p.get("id") in dev_ids), props[0] if props else None)
    if chosen:
        return hw.detect(chosen)
    if trace.meta.get("xla_device"):
        return hw.detect_xla(trace.meta["xla_device"])
    return None, ""


def hardware_row(h, precision: str, source: str) -> dict[str, Any]:
    return {
        "name": h.name,
        "precision": precision,
        "sparse": False,
        "peak_flops": h.peak(precision),
        "devices": 1,
        "source": source,
    }


def other_peaks(hardware: dict, totals: dict, precision: str, opt: ModelOptions) -> dict[str, float] | None:
    """An FP8 run is shown against the bf16 peak too: the same clock, a different ceiling."""
    if precision != "fp8" or opt.peak_tflops or totals.get("mfu") is None:
        return None
    h = hw.lookup(hardware["name"])
    out = {}
    for p in ("fp8", "bf16"):
        peak = h.peak(p) if h else None
        if peak:
            out[p] = totals["mfu"] * hardware["peak_flops"] / peak
    return out


def dominant_dtype(ops: pl.DataFrame) -> str | None:
    """The dtype that carries the most executed matmul FLOPs: the default precision of the peak."""
    work = ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("flops").is_not_null() & pl.col("dtype").is_not_null())
    if work.height == 0:
        return None
    by = work.group_by("dtype").agg(pl.col("flops").sum()).sort(["flops", "dtype"], descending=[True, False])
    return by["dtype"][0]
