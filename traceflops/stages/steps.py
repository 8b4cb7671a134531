"""Step windows and which step each op and kernel belongs to.

A kernel belongs to the step whose host span contains its launch, whatever
thread launched it (backward launches come from the autograd thread). On the
device, step N runs from its first device activity to step N+1's first device
activity, so host-side time between steps stays inside a step; the last step
ends at its last device activity. Without device work, the host span is the window.
Every step span has its own number: one that repeats an earlier span's is renumbered (see `distinct_steps`).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import polars as pl

from traceflops.core.results import ModelOptions
from traceflops.core.trace import Trace
from traceflops.core.vocab import OUTSIDE

_I64_MAX = (1 << 63) - 1


def distinct_steps(steps: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, list[int]], int]:
    """Step spans with distinct numbers: (spans, {repeated number: its later spans' new numbers}, spans left out).

    Two spans with one number (two profiler sessions in one file, a counter
    that restarted) are two stretches of work. Merging them would make one
    window cover whatever ran between them, other steps included; dropping one
    would move its work outside every step. So the first span in time keeps the
    number and each later one is numbered after the largest, in time order:
    every span is reported, under a number the warning maps back. A span
    whose new number would pass 64 bits is left out (its work outside every step).
    """
    if steps.height < 2 or steps["step"].n_unique() == steps.height:
        return steps, {}, 0
    # no number at all (every span unnumbered): count from 1
    top = int(steps["step"].max() or 0)  # type: ignore[arg-type]  # polars' stub
    room = _I64_MAX - top  # how many numbers are left after the largest
    ordered = (
        steps.with_row_index("_row")
        .sort("ts", "_row", nulls_last=True)
        .with_columns(_later=pl.int_range(pl.len()).over("step") > 0)
        .with_columns(_k=pl.col("_later").cast(pl.Int64).cum_sum())
    )
    kept = ordered.filter(~pl.col("_later") | (pl.col("_k") <= room))
    kept = kept.with_columns(
        _new=pl.when("_later").then(pl.lit(top, pl.Int64) + pl.col("_k")).otherwise(pl.col("step"))
    )
    mapping: dict[int, list[int]] = {}
    for old, num in kept.filter("_later").select("step", "_new").iter_rows():  # the few repeated spans only
        mapping.setdefault(old, []).append(num)
    out = kept.with_columns(step=pl.col("_new")).sort("_row").drop("_row", "_later", "_k", "_new")
    left_out = steps.height - out.height
    return out, mapping, left_out


def host_steps(trace: Trace) -> tuple[pl.DataFrame, str]:
    """Host spans of steps, and where they came from; repeated step numbers are renumbered, with a warning."""
    if trace.steps.height:
        spans, renumbered, left_out = distinct_steps(trace.steps.select("step", "name", "ts", "dur"))
        if renumbered:
            shown = "; ".join(
                f"{old} → {', '.join(map(str, nums[:3]))}{', …' if len(nums) > 3 else ''}"
                for old, nums in list(renumbered.items())[:5]
            )
            trace.warnings.add(
                f"step numbers used by more than one step span: the later spans renumbered after the largest ({shown})",
                sum(map(len, renumbered.values())),
            )
        trace.warnings.add(
            "step spans whose new number would pass 64 bits (left out: their work is outside every step)", left_out
        )
        return spans, "ProfilerStep"
    opt = trace.ops.filter(pl.col("name").str.starts_with("Optimizer.step#")).sort("ts")
    if opt.height:
        ends = (opt["ts"] + opt["dur"]).to_list()
        first = float(trace.ops["ts"].min())  # type: ignore[arg-type]  # polars' stub
        starts = [first] + ends[:-1]
        return (
            pl.DataFrame(
                {
                    "step": list(range(len(ends))),
                    "name": [f"Optimizer.step#{i}" for i in range(len(ends))],
                    "ts": starts,
                    "dur": [e - s for s, e in zip(starts, ends)],
                }
            ),
            "Optimizer.step",
        )
    t0 = min(x for x in [trace.ops["ts"].min(), trace.kernels["ts"].min()] if x is not None)
    t1 = max(
        x
        for x in [(trace.ops["ts"] + trace.ops["dur"]).max(), (trace.kernels["ts"] + trace.kernels["dur"]).max()]
        if x is not None
    )
    ts, dur = float(t0), float(t1 - t0)  # type: ignore[arg-type, operator]  # polars' stub
    return pl.DataFrame({"step": [0], "name": ["whole trace"], "ts": [ts], "dur": [dur]}), "whole trace"


def assign(times: pl.DataFrame, col: str, steps: pl.DataFrame) -> pl.Series:
    """Step id whose host span [ts, ts+dur) contains `times[col]`, else OUTSIDE.

    The latest step starting at or before each time (a binary search over the
    few step starts), kept if the time is before that step's end.
    """
    spans = (
        steps.filter(pl.col("ts").is_not_null())
        .select("ts", "step", (pl.col("ts") + pl.col("dur")).alias("_end"))
        .sort("ts", maintain_order=True)
    )
    starts = spans["ts"].cast(pl.Float64).to_numpy()
    ends = spans["_end"].cast(pl.Float64).to_numpy()
    ids = spans["step"].cast(pl.Int64).to_numpy()
    t = times[col].cast(pl.Float64).fill_null(np.nan).to_numpy()
    i = np.searchsorted(starts, t, side="right") - 1
    j = np.maximum(i, 0)
    inside = (i >= 0) & ~np.isnan(t) & (t < ends[j] if len(ends) else False)
    return pl.Series(np.where(inside, ids[j] if len(ids) else OUTSIDE, OUTSIDE), dtype=pl.Int64)


def kernel_steps(kernels: pl.DataFrame, ops: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    """Each device activity's step, by its launch; a device-only trace has no launches: by its own start."""
    return assign(kernels, "launch_ts" if ops.height else "ts", steps)


def window_work(kernels: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """The work whose first start opens a step's window: device activities, else XLA:CPU's ops (its device work)."""
    return kernels if kernels.height else ops.filter(pl.col("cat") == "xla_op")


def device_windows(steps: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """Add the device window (start, dur, last-flag) of each step."""
    if kernels.height == 0:
        return steps.with_columns(
            start=pl.col("ts"), window=pl.col("dur"), last=pl.lit(False), window_source=pl.lit("host")
        )
    per = (
        kernels.filter(pl.col("step") != OUTSIDE)
        .group_by("step")
        .agg(first=pl.col("ts").min(), last_end=(pl.col("ts") + pl.col("dur")).max())
    )
    s = steps.join(per, on="step", how="left").sort("ts")
    next_first = s["first"].shift(-1)
    s = s.with_columns(next_first=next_first)
    is_last = pl.col("next_first").is_null()
    return s.with_columns(
        start=pl.coalesce("first", "ts"),
        window=pl.when(pl.col("first").is_null())
        .then(pl.col("dur"))
        .when(is_last)
        .then(pl.col("last_end") - pl.col("first"))
        .otherwise(pl.max_horizontal(pl.col("next_first") - pl.col("first"), pl.lit(0.0))),
        last=is_last & pl.col("first").is_not_null(),
        window_source=pl.when(pl.col("first").is_null()).then(pl.lit("host")).otherwise(pl.lit("device")),
    ).drop("first", "last_end", "next_first")


# Runtime calls that put work on the device: each should have a device activity with its correlation.
DEVICE_WORK_LAUNCH = (
    r"LaunchKernel|LaunchCooperativeKernel|GraphLaunch|MemcpyAsync|MemsetAsync|MemcpyPeerAsync|ExtModuleLaunch"
)


def incomplete_steps(
    steps: pl.DataFrame, launches: pl.DataFrame, kernels: pl.DataFrame
) -> tuple[dict[int, int], set[int]]:
    """Steps of a cut trace whose numbers may differ from the whole file's.

    Returns (step → launches that lost their device activity, steps whose
    device window the cut may have moved). Kineto writes device activities
    after the host ops, so a cut can keep a step's host span but lose its
    kernels. A step's window ends at the next step's first device activity:
    it is unsure when the next step lost a launch made before its earliest
    surviving one. The last step is unsure too: later steps may have been cut away.
    """
    order = steps.sort("ts")["step"].to_list()
    unsure = {order[-1]} if order else set()
    work = launches.filter(pl.col("name").str.contains(DEVICE_WORK_LAUNCH) & pl.col("correlation").is_not_null())
    if work.height == 0:
        return {}, unsure
    found = kernels.select("correlation").unique()
    # Launches are written in time order: a step that ends after the last surviving launch lost its tail.
    last_launch = float(work["ts"].max())  # type: ignore[arg-type]  # polars' stub
    tail = steps.filter(pl.col("ts") + pl.col("dur") > last_launch)["step"].to_list()
    work = work.with_columns(step=assign(work, "ts", steps)).filter(pl.col("step") != OUTSIDE)
    lost = work.join(found, on="correlation", how="anti")
    cut = dict(lost.group_by("step").len().iter_rows())
    for st in tail:
        cut.setdefault(st, 0)
    if not cut:
        return {}, unsure
    first_kept = dict(
        work.join(found, on="correlation", how="semi").group_by("step").agg(pl.col("ts").min()).iter_rows()
    )
    first_lost = dict(lost.group_by("step").agg(pl.col("ts").min()).iter_rows())
    for prev, nxt in pairwise(order):
        if nxt in cut and (nxt not in first_kept or nxt not in first_lost or first_lost[nxt] <= first_kept[nxt]):
            unsure.add(prev)
    return cut, unsure - set(cut)


def leave_out_cut_steps(trace: Trace, host: pl.DataFrame, opt: ModelOptions) -> tuple[ModelOptions, list[str]]:
    """In a cut file, steps whose numbers could differ from the whole file's are left out of the report."""
    if not trace.meta.get("truncated"):
        return opt, []
    device_trace = trace.kernels.height or trace.launches.height or trace.meta.get("device_properties")
    if not device_trace:
        return opt, ["the file was cut: steps of a CPU-only trace cannot be checked for completeness"]
    if not trace.kernels.height:
        # a device trace cut before any device activity was written: no step can be checked
        cut, unbounded = {int(st): 0 for st in host["step"].to_list()}, set[int]()
    else:
        cut, unbounded = incomplete_steps(host, trace.launches, trace.kernels)
    notes = [
        f"step {st} is incomplete in the cut file ({n or 'all'} launches lost their device activity): left out"
        for st, n in sorted(cut.items())
    ]
    notes += [
        f"step {st} may end differently in the whole file (the cut may have taken what bounds it): left out"
        for st in sorted(unbounded)
    ]
    dropped = set(cut) | unbounded
    trace.meta["cut_steps"] = sorted(dropped)
    return replace(opt, exclude_steps=tuple(sorted(set(opt.exclude_steps) | dropped))), notes


def counted_steps(steps: pl.DataFrame, exclude_steps) -> pl.DataFrame:
    """The steps a report's totals and advice count: not left out, with a positive window."""
    return steps.filter(
        ~pl.col("step").is_in(list(exclude_steps)) & pl.col("window").is_not_null() & (pl.col("window") > 0)
    )


def leave_out_unbounded_last(steps: pl.DataFrame, opt: ModelOptions) -> tuple[ModelOptions, list[str]]:
    """The last step's window ends at its last device activity: it lacks the time up to a next step that every other
    window holds (the idle and host work before the next step's first kernel), so its MFU reads high. With other
    steps counted it is shown, marked, and left out of the totals (as Holistic Trace Analysis does by default)."""
    last = steps.filter(pl.col("last"))["step"].to_list()
    counted = [s for s in steps["step"].to_list() if s not in opt.exclude_steps]
    if opt.keep_last_step or not last or last[0] not in counted or len(counted) < 2:
        return opt, []
    n = last[0]
    note = (
        f"step {n}, the last, ends at its last device activity, without the time up to a next step that the others "
        f"hold: shown, left out of the totals (over the {len(counted) - 1} complete steps); --keep-last-step counts it"
    )
    return replace(opt, exclude_steps=tuple(sorted({*opt.exclude_steps, n}))), [note]


def excluded_steps(host: pl.DataFrame, opt: ModelOptions) -> list[str]:
    """A step asked to be left out that the trace does not have: said, not silently ignored."""
    have = set(host["step"].to_list())
    missing = sorted(set(opt.exclude_steps) - have)
    if not missing:
        return []
    shown = f"{min(have)}..{max(have)}" if have else "none"
    return [
        f"--exclude-step {', '.join(map(str, missing))}: no such step in the trace (its steps: {shown}); nothing left "
        "out for it"
    ]


def step_count(steps: pl.DataFrame, opt: ModelOptions) -> dict:
    """How many steps the trace has, which were left out (asked, or cut), and how many the totals count."""
    have = steps["step"].to_list()
    out = sorted(set(opt.exclude_steps) & set(have))
    return {"in_trace": len(have), "excluded": out, "counted": len(have) - len(out)}


def step_warnings(trace: Trace, steps: pl.DataFrame, step_source: str, cut_notes: list[str]) -> list[str]:
    """The trace's own warnings, then what the step windows showed: clamped windows, cut steps, the step markers
    used."""
    clamped = steps.filter((pl.col("window_source") == "device") & (pl.col("window") <= 0) & ~pl.col("last")).height
    if clamped:
        trace.warnings.add(
            "steps whose first device activity precedes the previous step's (clock or ordering problem): window set to "
            "0",
            clamped,
        )
    warnings = list(trace.warnings.lines()) + cut_notes
    if step_source != "ProfilerStep":
        warnings.append(f"no ProfilerStep markers: steps taken from {step_source}")
    return warnings


def by_execution(ops: pl.DataFrame, step: pl.Series, host: pl.DataFrame) -> pl.Series:
    """XLA ops that ran after their step's host span (asynchronous dispatch) put in the step whose execution they are.

    A program runs its executions in the order the steps dispatched them, and an
    instruction runs as often in each: the i-th run of an instruction, of c per
    step, is in the (i // c)-th step. Only instructions with a run outside every
    step are moved, and only when their runs divide evenly among the steps;
    the others stay where their start put them (outside every step: reported).
    """
    step = by_run(ops, step, host)
    xla = ops["cat"] == "xla_op"
    if host.height == 0 or not ((step == OUTSIDE) & xla).any():
        return step
    order = host.sort("ts")["step"].to_list()
    frame = pl.DataFrame(
        {"_i": pl.int_range(ops.height, eager=True), "name": ops["name"], "ts": ops["ts"], "xla": xla, "step": step}
    )
    moved = (
        frame.filter("xla")
        .with_columns(
            _out=(pl.col("step") == OUTSIDE).any().over("name"),
            _n=pl.len().over("name"),
            _k=pl.col("ts").rank("ordinal").over("name") - 1,
        )
        .filter(pl.col("_out") & (pl.col("_n") % len(order) == 0))
        .with_columns(_s=(pl.col("_k") // (pl.col("_n") // len(order))).cast(pl.Int64))
        .with_columns(step=pl.col("_s").replace_strict(dict(enumerate(order)), return_dtype=pl.Int64))
        .select("_i", "step")
    )
    if moved.height == 0:
        return step
    return (
        frame.join(moved, on="_i", how="left", suffix="_new")
        .sort("_i")
        .select(pl.coalesce("step_new", "step").alias(step.name))
        .to_series()
    )


def by_run(ops: pl.DataFrame, step: pl.Series, host: pl.DataFrame) -> pl.Series:
    """XLA ops that carry their execution's run id (`ext_id`, XLA:CPU's `run_id`) in the step that dispatched it.

    With asynchronous dispatch an execution runs after its step's host span, mostly
    inside the next one when that step reads the previous loss: its ops' start
    names the wrong step. A program's run ids increase in dispatch order and the
    steps dispatch in step order, so per program (its runs told apart by the set of
    op names they run) the k-th of its n runs belongs to step k // (n / steps).
    Only where its runs divide evenly among the steps and none starts before the
    span of the step it is given (no execution runs before its dispatch); the ops
    of any other program keep their step.
    """
    if host.height == 0 or "ext_id" not in ops.columns:
        return step
    runs_of = (ops["cat"] == "xla_op") & ops["ext_id"].is_not_null()
    if not runs_of.any():
        return step
    spans = host.sort("ts")
    m = spans.height
    order = pl.DataFrame(
        {"_k": pl.int_range(m, eager=True), "_to": spans["step"].cast(pl.Int64), "_start": spans["ts"].cast(pl.Float64)}
    )
    frame = pl.DataFrame(
        {
            "_i": pl.int_range(ops.height, eager=True),
            "_run": ops["ext_id"],
            "name": ops["name"],
            "ts": ops["ts"],
            "_x": runs_of,
        }
    ).filter("_x")
    runs = (
        frame.group_by("_run")
        .agg(_sig=pl.col("name").unique().sort().str.join("\n").hash(), _t0=pl.col("ts").min())
        .with_columns(_n=pl.len().over("_sig"), _r=pl.col("_run").rank("ordinal").over("_sig") - 1)
        .filter(pl.col("_n") % m == 0)
        .with_columns(_k=(pl.col("_r") // (pl.col("_n") // m)).cast(pl.Int64))
        .join(order, on="_k", how="left")
        .filter((pl.col("_t0") >= pl.col("_start")).all().over("_sig"))
        .select("_run", "_to")
    )
    if runs.height == 0:
        return step
    moved = frame.join(runs, on="_run", how="inner").select("_i", "_to")
    return (
        pl.DataFrame({"_i": pl.int_range(ops.height, eager=True), "step": step})
        .join(moved, on="_i", how="left")
        .sort("_i")
        .select(pl.coalesce("_to", "step").alias(step.name))
        .to_series()
    )
