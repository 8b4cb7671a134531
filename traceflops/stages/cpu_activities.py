"""A CPU trace's activities (the host ops that are the work), and the warning for a trace whose device activity
was not captured."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core import fmt
from traceflops.core.trace import Trace
from traceflops.core.vocab import (
    HOST_COMM_WAIT_RE,
    HOST_COMM_WORK_RE,
    NO_DEVICE_ACTIVITY,
    PROFILE_THE_DEVICE,
    RANGE_PROFILER_CAPTURE,
)
from traceflops.stages.link import nearest
from traceflops.stages.steps import DEVICE_WORK_LAUNCH

# Host ops only a device job records: NCCL / RCCL collectives, a tensor handed to another device stream.
DEVICE_HOST_OPS_RE = r"^(nccl|rccl):|^aten::record_stream$"


def device_not_captured(trace: Trace) -> str | None:
    """The warning for a trace that names a device but holds none of its activity (no kernel, memcpy or memset), else
    None.

    The device is named by CUPTI range-profiler events (hardware counters, no timeline), `deviceProperties`,
    NCCL / RCCL or `aten::record_stream` ops, or runtime launches whose device activity is absent. Such a trace
    is not a CPU run: its host ops' durations are not device time, so MFU, HFU and the time classes stay unknown.
    """
    if trace.kernels.height:
        return None
    ranges = trace.meta.get("profiler_ranges") or 0
    if ranges:
        return (
            f"{RANGE_PROFILER_CAPTURE}: {ranges} profiled ranges with hardware counters, no kernel timeline; "
            f"MFU/HFU need a trace with ProfilerActivity.CUDA ({PROFILE_THE_DEVICE})"
        )
    props = [p for p in trace.meta.get("device_properties") or [] if isinstance(p, dict)]
    names = trace.ops["name"].drop_nulls().unique()
    named_ops = sorted(names.filter(names.str.contains(DEVICE_HOST_OPS_RE)).to_list())
    launches = trace.launches.filter(pl.col("name").str.contains(DEVICE_WORK_LAUNCH)).height
    seen = []
    if props:
        gpus = sorted({fmt.short(p["name"], 60) for p in props if isinstance(p.get("name"), str)})
        seen.append(f"deviceProperties lists {len(props)} device(s){': ' + ', '.join(gpus[:3]) if gpus else ''}")
    if named_ops:
        seen.append(
            f"{', '.join(fmt.short(n, 60) for n in named_ops[:3])}{' and more' if len(named_ops) > 3 else ''} ops"
        )
    if launches:
        seen.append(f"{launches} device launches")
    if not seen:
        return None
    how = (
        "the file is cut before its device activity"
        if trace.meta.get("truncated")
        else "its device activity was not recorded"
        if launches
        else "captured with CPU activity only"
    )
    return (
        f"{NO_DEVICE_ACTIVITY}: the trace names a device ({'; '.join(seen)}) but holds no kernel, memcpy or memset "
        f"({how}), so MFU, HFU and the device time breakdown are unknown (host op durations are not device time); "
        f"add ProfilerActivity.CUDA: {PROFILE_THE_DEVICE}"
    )


def cpu_activities(ops: pl.DataFrame) -> pl.DataFrame:
    """On a CPU trace the ops are the work: leaf matmuls, every other top-level op, and collectives as they ran
    (`gloo:*`).

    XLA:CPU runs the program's ops (`xla_op`) on its worker threads: every one that ran is work, its collectives
    (the parser names their opcode in `collective`) communication, each on the op's `device` (a program over
    several XLA:CPU devices; null on one).
    """
    parent = ops["parent"].to_numpy()
    is_op = ops["cat"].is_in(["cpu_op", "xla_op"]).to_numpy()
    top = is_op & ((parent < 0) | ~is_op[np.maximum(parent, 0)])
    mm = ops["matmul"].to_numpy() & ops["ran"].to_numpy()
    is_comm = pl.col("name").str.contains(HOST_COMM_WORK_RE)
    if "collective" in ops.columns:
        is_comm = is_comm | ((pl.col("cat") == "xla_op") & pl.col("collective").is_not_null())
    comm = ops.select(is_comm.fill_null(False)).to_series().to_numpy()
    is_wait = pl.col("name").str.contains(HOST_COMM_WAIT_RE)
    wait = ops.select(is_wait.fill_null(False)).to_series().to_numpy() & is_op
    acts = (
        ops.with_columns(_row=pl.int_range(pl.len()))
        .filter(pl.Series(mm | top | comm | wait))
        .with_columns(
            cls=pl.when(pl.col("matmul") & pl.col("ran"))
            .then(pl.lit("matmul"))
            .when(is_comm | is_wait)
            .then(pl.lit("communication"))
            .otherwise(pl.lit("other_compute")),
            device=pl.col("device").cast(pl.Int64) if "device" in ops.columns else pl.lit(None, pl.Int64),
            stream=pl.col("tid"),
            flops=pl.when(pl.col("matmul") & pl.col("ran")).then(pl.col("flops").cast(pl.Float64)),
            op_row=pl.col("_row").cast(pl.Int64),
        )
    )
    host_comm = ops.select(pl.col("name").str.contains(HOST_COMM_WORK_RE).fill_null(False)).to_series().to_numpy()
    acts = without_blocked(acts, ops, nearest(parent, top), wait | host_comm)
    return acts.select("name", "device", "stream", "ts", "dur", "cls", "phase", "step", "flops", "op_row")


def without_blocked(acts: pl.DataFrame, ops: pl.DataFrame, top_of: np.ndarray, blocking: np.ndarray) -> pl.DataFrame:
    """A top-level op's activity less the time its thread blocked, inside it, in a collective.

    A thread blocked in a collective's wait (`_c10d_functional::wait_tensor`)
    or in gloo's send or recv (run inside their `c10d::` call) waits for
    other ranks: that time is the collective's (communication, an activity of
    its own), not compute of the op around it. The op keeps the pieces of its
    span outside them. `acts` carries each activity's op row as `_row`;
    `top_of` is each op's top-level op (or itself, or -1).
    """
    rows = np.arange(len(top_of))
    inner = np.flatnonzero(blocking & (top_of >= 0) & (top_of != rows))
    if len(inner) == 0:
        return acts.drop("_row")
    start = ops["ts"].to_numpy()
    end = start + ops["dur"].to_numpy()
    tops = top_of[inner]
    # Interval algebra per top-level op: the blocked spans sorted by start; what was covered before each is the
    # running maximum of the earlier ends (or the op's start); a gap before a span, and the tail after the last, stay.
    b = pl.DataFrame(
        {"_row": tops, "s": start[inner], "e": np.minimum(end[inner], end[tops]), "lo": start[tops], "hi": end[tops]}
    ).sort("_row", "s")
    b = b.with_columns(at=pl.max_horizontal("lo", pl.col("e").cum_max().shift(1).over("_row")))
    gaps = b.filter(pl.col("s") > pl.col("at")).select("_row", _start="at", _end=pl.min_horizontal("s", "hi"))
    tails = (
        b.group_by("_row")
        .agg(pl.col("lo").first(), pl.col("hi").first(), pl.col("e").max())
        .select("_row", _start=pl.max_horizontal("lo", "e"), _end="hi")
        .filter(pl.col("_end") > pl.col("_start"))
    )
    pieces = pl.concat([gaps, tails]).with_columns(pl.col("_row").cast(pl.Int64))
    cut = pl.Series(np.unique(tops), dtype=pl.Int64)
    kept = (
        acts.with_columns(pl.col("_row").cast(pl.Int64))
        .join(pieces, on="_row")
        .with_columns(ts=pl.col("_start"), dur=pl.col("_end") - pl.col("_start"))
        .drop("_start", "_end")
    )
    whole = acts.with_columns(pl.col("_row").cast(pl.Int64)).filter(~pl.col("_row").is_in(cut.implode()))
    return pl.concat([whole, kept.select(whole.columns)]).sort("_row", "ts", maintain_order=True).drop("_row")
