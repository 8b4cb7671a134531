"""The one value every rule and entry reads (`Ctx`: the counted steps, their window, kernels, gaps, time terms, MFU
and loss budget), how `build_context` builds it from an `Analysis`, and the thresholds and reads they share.

Built once per `advise` call so every rule and entry works from the same steps, device and budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceflops.core.results import Analysis
from traceflops.core.vocab import OVERLAYS, PARTITION
from traceflops.metrics import budget as bd
from traceflops.stages import timeline as tl
from traceflops.stages.cpu_activities import cpu_activities
from traceflops.stages.link import by_row
from traceflops.stages.steps import counted_steps
from traceflops.views.gemm_shapes import CONV_OPS

MIN_SHARE = 0.01
CONV_DOMINATES = (
    0.5  # from this share of matmul time in convolutions, the matmul and fusion remedies speak of convolutions
)
BUDGET_MIN_SHARE = 0.05  # a loss-budget term from this share of peak × step time gets an entry of its own
UNIT = "of step time at peak"  # the unit of every headline: a share of peak × step time, as the loss budget's terms
SHORT_KERNEL_US = 10.0  # a kernel shorter than this is mostly launch and ramp-up
TOP = 5
XLA_CONV_RE = r"(?i)^(convolution|cudnn-conv|conv[-_.])|conv_general"


@dataclass
class Ctx:
    a: Analysis
    steps: pl.DataFrame  # the steps counted (positive window, not excluded)
    ids: list[int]
    window: float  # µs, summed windows
    device: Any  # the device the partition's time terms are of (None: no device)
    kernels: pl.DataFrame  # kernels of those steps on that device, roofline columns attached
    gaps: pl.DataFrame | None  # idle gaps of those steps on that device
    time: dict[str, float]  # partition and overlays, µs
    mfu: float | None
    budget: dict[str, float | None] | None = None  # the loss budget of these steps (as the report's totals)
    conv: float | None = None  # share of matmul time in convolutions (`_conv_share`), once computed

    def share(self, us: float) -> float:
        return float(us) / self.window if self.window else 0.0


def build_context(a: Analysis, exclude_steps) -> Ctx | None:
    steps = counted_steps(a.steps, exclude_steps)
    window = float(steps["window"].sum()) if steps.height else 0.0
    if window <= 0:
        return None
    ids = steps["step"].to_list()
    device = tl.program_devices(a.partition.filter(pl.col("step").is_in(ids)))[0] if a.partition is not None else None
    k = a.kernels
    if a.roofline is not None and a.roofline.height == k.height:
        k = k.with_columns(a.roofline.select("bound", "recoverable_us", "achieved_bw_frac", "roof_bytes"))
    k = tl.on_devices(k.filter(pl.col("step").is_in(ids)), [device]) if k.height else k
    gaps = tl.on_devices(a.idle_gaps.filter(pl.col("step").is_in(ids)), [device]) if a.idle_gaps is not None else None
    time = {
        c: float(steps[f"time_{c}"].fill_null(0.0).sum()) if f"time_{c}" in steps.columns else 0.0
        for c in (*PARTITION, *OVERLAYS)
    }
    hardware = a.hardware
    peak = hardware.peak_flops if hardware else None
    peak = peak * (hardware.devices or 1) if hardware and peak else peak  # every device that ran the program
    mfu = None
    if peak and steps["model_flops"].null_count() == 0:
        mfu = float(steps["model_flops"].sum()) / (window * 1e-6 * peak)
    # the loss budget of these steps by the totals' own sum, so every term is the report's number
    return Ctx(a, steps, ids, window, device, k, gaps, time, mfu, bd.steps_budget(steps, peak))


def is_jax(ctx: Ctx) -> bool:
    """An XLA profile (JAX): remedies and what to record name JAX's tools, never PyTorch's."""
    return ctx.a.meta.get("format") == "xplane"


def activities(ctx: Ctx) -> pl.DataFrame:
    """What did the work in the counted steps: the device's kernels, or on a CPU trace the ops as the partition took
    them
    (those of the device the time terms are of, a program over several XLA:CPU devices)."""
    if ctx.kernels.height or ctx.a.ops.height == 0:
        return ctx.kernels
    return tl.on_devices(cpu_activities(ctx.a.ops).filter(pl.col("step").is_in(ctx.ids)), [ctx.device])


def _conv_share(ctx: Ctx) -> float:
    """The share of matmul time spent in convolutions: their kernels (device), or their ops (a CPU trace)."""
    if ctx.conv is not None:
        return ctx.conv
    share = 0.0
    if ctx.kernels.height and "matmul_row" in ctx.kernels.columns and ctx.a.ops.height:
        mm = ctx.kernels.select("matmul_row", "dur").filter(ctx.kernels["cls"] == "matmul")
        # The op's name at each kernel's matmul row, gathered by position (linked ops keep row == position): no join.
        mm = mm.with_columns(by_row(ctx.a.ops, mm["matmul_row"], "name").to_series().alias("_op"))
        tot = float(mm["dur"].sum())
        conv = pl.col("_op").is_in(list(CONV_OPS))
        if is_jax(ctx):  # HLO instructions: convolution.N, cudnn-conv.N (XLA's cuDNN / MIOpen call)
            conv = conv | pl.col("_op").str.contains(XLA_CONV_RE)
        share = float(mm.filter(conv)["dur"].sum()) / tot if tot else 0.0
    elif ctx.kernels.height:
        mm = ctx.kernels.filter(pl.col("cls") == "matmul")
        tot = float(mm["dur"].sum())
        share = float(mm.filter(pl.col("name").str.contains("(?i)conv"))["dur"].sum()) / tot if tot else 0.0
    else:
        mm = activities(ctx).filter(pl.col("cls") == "matmul") if ctx.a.ops.height else ctx.kernels
        tot = float(mm["dur"].sum()) if mm.height else 0.0
        conv = pl.col("name").is_in(list(CONV_OPS)) | pl.col("name").str.contains(XLA_CONV_RE)
        share = float(mm.filter(conv)["dur"].sum()) / tot if tot else 0.0
    ctx.conv = share
    return share


def conv_dominates(ctx: Ctx) -> bool:
    return _conv_share(ctx) >= CONV_DOMINATES
