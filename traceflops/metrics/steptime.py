"""Each step's time partition and loss budget over the devices that ran the program, and time totals over the analysed
steps.

With several devices (a JAX process's chips) a step's time classes are their
mean, so they still partition the step's window; the peak is then the
devices' together, and idle reasons are per device too.
"""

from __future__ import annotations

import polars as pl

from traceflops.core import sections
from traceflops.core.results import ModelOptions
from traceflops.core.sections import Totals
from traceflops.core.vocab import GAP_REASONS, OVERLAYS, PARTITION
from traceflops.metrics import budget as bd


def attach_time(steps: pl.DataFrame, part: pl.DataFrame, peak: float | None, devices: int) -> pl.DataFrame:
    """Each step's time partition, overlays (the mean over the program's `devices`, whose rows `part` holds) and loss
    budget against `peak` (all of them)."""
    mine = part.select(pl.exclude("start", "window", "device"))
    if devices > 1:
        mine = mine.group_by("step", maintain_order=True).agg(
            [pl.col(c).sum() / devices for c in mine.columns if c != "step"]
        )
    rows = mine.rename({c: f"time_{c}" for c in (*PARTITION, *OVERLAYS)})
    steps = steps.join(rows, on="step", how="left")
    return steps.with_columns(loss_budget=pl.Series(bd.step_budgets(steps, peak), dtype=pl.Object))


def idle_by_reason(gaps: pl.DataFrame | None, opt: ModelOptions, devices: int) -> dict[str, float] | None:
    """Why the program's devices sat idle, per device (the mean over the `devices` whose gaps `gaps` holds): each gap
    is explained by the first rule that decides it."""
    if gaps is None:
        return None
    use = gaps.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    got = dict(use.group_by("reason").agg(pl.col("dur").sum()).iter_rows())
    return {r: float(got.get(r, 0.0)) / devices for r in GAP_REASONS}


def memory_bound_us(bound: pl.DataFrame, opt: ModelOptions, devices: int) -> float:
    """Device time during which a memory-bound kernel ran (union over streams, within the analysed steps; per
    device): `bound` is `roofline.memory_bound_partition` on the program's `devices`."""
    if bound.height == 0:
        return 0.0
    mb = bound.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    return float((mb["window"] - mb["idle"]).sum()) / devices


def attach_launch_stats(steps: pl.DataFrame, stats: pl.DataFrame | None) -> pl.DataFrame:
    """Each step's kernel count, median kernel time and median launch delay (device traces only)."""
    if stats is None:
        return steps
    return steps.join(
        stats.select(
            "step",
            pl.col("kernels").alias("launch_kernels"),
            pl.col("median_dur").alias("launch_median_kernel_us"),
            pl.col("median_launch_delay").alias("launch_median_delay_us"),
        ),
        on="step",
        how="left",
    )


def without_device_time(steps: pl.DataFrame, totals: Totals) -> tuple[pl.DataFrame, Totals]:
    """A trace that names a device but holds none of its activity (`timeline.device_not_captured`): each step's and
    the totals' time classes, loss budget, MFU and HFU unknown (null), never numbers made from host op durations."""
    cols = [
        c
        for c in (*(f"time_{c}" for c in (*PARTITION, *OVERLAYS)), "mfu", "mfu_no_attention", "hfu")
        if c in steps.columns
    ]
    steps = steps.with_columns([pl.lit(None, steps.schema[c]).alias(c) for c in cols])
    if "loss_budget" in steps.columns:
        steps = steps.with_columns(loss_budget=pl.Series([None] * steps.height, dtype=pl.Object))
    unknown = (
        "mfu",
        "mfu_no_attention",
        "hfu",
        "time_us",
        "overlay_us",
        "loss_budget",
        "flops_coverage",
        "idle_us_by_reason",
    )
    # no device time: no matmul time whose FLOPs could be known or not (coverage unknown, not partial)
    return steps, sections.replace(totals, **dict.fromkeys(unknown), flops_lower_bound=False, unknown_matmul_kernels=[])
