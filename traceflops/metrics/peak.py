"""Which hardware and which peak: the device from the trace or the user, the precision that carries the matmul FLOPs."""

from __future__ import annotations

import re

import orjson
import polars as pl

from traceflops.core import hardware as hw
from traceflops.core.dtypes import dtype_of
from traceflops.core.results import ModelOptions
from traceflops.core.sections import Hardware, Totals
from traceflops.core.trace import Trace

# TF32 GEMM kernels: cuBLAS/xmma name it, CUTLASS Ampere kernels say s1688 / tensorop_s (fp32 I/O on tensor cores).
TF32_RE = re.compile(r"tf32|s1688|tensorop_s\d|xmma_gemm_f32f32_tf32", re.IGNORECASE)


def tf32_share(kernels: pl.DataFrame) -> float:
    """Share of matmul kernel time spent in TF32 kernels (fp32 tensors on tensor cores)."""
    mm = kernels.filter(pl.col("cls") == "matmul")
    total = float(mm["dur"].sum())
    return float(mm.filter(pl.col("name").str.contains(TF32_RE.pattern))["dur"].sum()) / total if total else 0.0


def choose_hardware(trace: Trace, ops: pl.DataFrame, kernels: pl.DataFrame, opt: ModelOptions, warnings: list[str]):
    precision = opt.precision
    widened = widened_dots(ops) if trace.meta.get("format") == "xplane" and kernels.height == 0 else None
    dtype = dominant_dtype(ops, widened)
    if widened is not None and widened.height and dtype != dominant_dtype(ops) and precision is None:
        warnings.append(
            f"XLA:CPU computes {dtype} dots in f32: {widened.height} f32 dot executions read {dtype} values it "
            f"converted to f32 (a convert of the same shape), so the program's precision is {dtype}, and its peak"
        )
    guessed = precision is None and dtype is None
    if precision is None:
        precision = dtype or "bf16"
        if precision == "fp32" and tf32_share(kernels) > 0.5:
            precision = "tf32"
    if opt.peak_tflops:
        given = hw.custom(opt.peak_tflops, precision)
        return hardware_row(given, precision, "--peak-tflops"), opt.peak_tflops * 1e12, precision
    detected, why = detect_device(trace, kernels)
    if opt.hardware:
        h = hw.lookup(opt.hardware)
        if h is None:
            warnings.append(
                f"unknown hardware '{opt.hardware}': give --peak-tflops (known: {', '.join(sorted(hw.HARDWARE))})"
            )
        elif detected is not None and detected.name != h.name:
            warnings.append(
                f"--hardware {opt.hardware} ({h.name}) is not the trace's device ({detected.name}): "
                f"MFU and HFU are against the {h.name} peak as asked"
            )
    else:
        h = detected
        if h is None:
            what = why or (
                "no device in the trace (a CPU trace)" if not kernels.height else "no deviceProperties in the trace"
            )
            warnings.append(f"hardware unknown: {what}; give --hardware NAME or --peak-tflops N to get MFU and HFU")
        elif "assumed" in why:  # a variant the trace cannot tell apart (hw.detect says which it took)
            warnings.append(f"hardware variant assumed: {why}; give --hardware NAME if it is another")
    if h is None:
        return None, None, precision
    if guessed:
        precision = next((p for p in ("bf16", "fp16", "fp32") if h.peak(p)), precision)
        why = (
            "the profile's ops carry no element types"
            if trace.meta.get("format") == "xplane"
            else "no Input type in the trace"
        )
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


def hardware_row(h, precision: str, source: str) -> Hardware:
    """The hardware section of one device (the pipeline sets `devices` when it knows the program's)."""
    return Hardware(
        name=h.name, precision=precision, sparse=False, peak_flops=h.peak(precision), devices=1, source=source
    )


def other_peaks(hardware: Hardware, totals: Totals, precision: str, opt: ModelOptions) -> dict[str, float] | None:
    """The MFU against other peaks of the same device, the run's own precision first: the same clock, a different
    ceiling.

    An FP8 run is shown against the bf16 peak too. An fp32 run against the tensor-core peaks it could use, TF32 and the
    faster of bf16 / fp16 (bf16 on a tie; fp16 on Volta and Turing, which have no bf16 tensor cores); a TF32 run against
    that 16-bit peak: the band grades the run's own peak, and these say how far the tensor cores are. None when there is
    no other peak, no MFU, or only a bare --peak-tflops.
    """
    if opt.peak_tflops or totals.mfu is None or not hardware.peak_flops:
        return None
    h = hw.lookup(hardware.name)
    if h is None:
        return None
    own = h.peak(precision) or hardware.peak_flops
    if precision == "fp8":
        keys = ["fp8", "bf16"]
    elif precision in ("fp32", "tf32"):
        half = max(("bf16", "fp16"), key=lambda p: h.peak(p) or 0.0)
        keys = [precision] + [
            p for p in (("tf32", half) if precision == "fp32" else (half,)) if (h.peak(p) or 0.0) > own
        ]
        if len(keys) == 1:
            return None
    else:
        return None
    out = {}
    for p in keys:
        peak = h.peak(p)
        if peak:
            out[p] = totals.mfu * hardware.peak_flops / peak
    return out


# 16-bit float types XLA:CPU widens to f32 before a dot (`convert`), as `Input type` spells them.
_NARROW = ("bf16", "fp16")


def widened_dots(ops: pl.DataFrame) -> pl.DataFrame:
    """The dots of an XLA:CPU program that XLA widened from a 16-bit type: columns row, dtype.

    XLA:CPU has no bf16 (or fp16) dot: it converts the operands to f32 (a `convert`, alone or in a fusion named for it:
    `wrapped_convert`, `convert_convert_fusion`, ...) and runs an f32 dot, so the dot's own operands say f32. A dot
    with all-f32 operands, one of which has the shape of a bf16 / fp16 operand of a convert in the same profile, reads
    a value XLA converted from that type: the program's matmuls are 16-bit. Read once per distinct shapes and types.
    """
    empty = pl.DataFrame(schema={"row": pl.Int64, "dtype": pl.Utf8})
    if ops.height == 0 or not {"dims", "types", "matmul", "name", "row"} <= set(ops.columns):
        return empty
    conv = (
        ops.filter(
            ~pl.col("matmul")
            & pl.col("name").str.contains("convert")
            & pl.col("dims").is_not_null()
            & pl.col("types").is_not_null()
        )
        .select("dims", "types")
        .unique()
    )
    narrow: dict[tuple, str] = {}
    for dims, types in conv.iter_rows():
        d, t = _json(dims), _json(types)
        for shape, ty in zip(d if isinstance(d, list) else [], t if isinstance(t, list) else []):
            dt = dtype_of(ty) if isinstance(ty, str) else None
            if dt in _NARROW and isinstance(shape, list) and len(shape) >= 2:
                narrow.setdefault(tuple(shape), dt)
    if not narrow:
        return empty
    mm = ops.filter(pl.col("matmul") & pl.col("dims").is_not_null() & pl.col("types").is_not_null())
    found: dict[tuple[str, str], str | None] = {}
    for dims, types in mm.select("dims", "types").unique().iter_rows():
        d, t = _json(dims), _json(types)
        if (
            not (isinstance(d, list) and isinstance(t, list))
            or not t
            or any(dtype_of(x) != "fp32" for x in t if isinstance(x, str))
        ):
            continue
        hits = [narrow[tuple(s)] for s in d if isinstance(s, list) and tuple(s) in narrow]
        if hits:
            found[(dims, types)] = hits[0]
    if not found:
        return empty
    keys = pl.DataFrame(
        {"dims": [k[0] for k in found], "types": [k[1] for k in found], "_w": list(found.values())},
        schema={"dims": pl.Utf8, "types": pl.Utf8, "_w": pl.Utf8},
    )
    return mm.join(keys, on=["dims", "types"], how="inner").select(
        pl.col("row").cast(pl.Int64), pl.col("_w").alias("dtype")
    )


def _json(text):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def dominant_dtype(ops: pl.DataFrame, widened: pl.DataFrame | None = None) -> str | None:
    """The dtype that carries the most executed matmul FLOPs: the default precision of the peak. `widened`
    (`widened_dots`): dots whose dtype is the one XLA widened them from."""
    work = ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("flops").is_not_null() & pl.col("dtype").is_not_null())
    if work.height == 0:
        return None
    if widened is not None and widened.height:
        work = (
            work.join(widened.rename({"dtype": "_w"}), on="row", how="left")
            .with_columns(dtype=pl.coalesce("_w", "dtype"))
            .drop("_w")
        )
    by = work.group_by("dtype").agg(pl.col("flops").sum()).sort(["flops", "dtype"], descending=[True, False])
    return by["dtype"][0]
