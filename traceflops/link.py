"""Kernel → runtime launch → innermost enclosing op, and op nesting.

Nesting is per host thread: an op's parent is the innermost op on the same
(pid, tid) whose span contains it. Launches are nested the same way, which
gives each launch its innermost enclosing op. Kernels reach their launch by
correlation id; one launch (a CUDA graph) may produce many kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .model import Trace

# Slack for float-rounded ends: a child may end a few ns after its parent.
_EPS_US = 1e-3


def nesting(thread: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent index (or -1) of each interval, innermost container on the same thread.

    Intervals must be pre-sorted by (thread, ts, -dur); `thread` is an integer
    code per (pid, tid). A stack walk is the one per-event loop in the
    pipeline; it runs over plain Python lists of host events.
    """
    n = len(ts)
    parent = [-1] * n
    stack: list[int] = []
    thread_l, ts_l, end_l = thread.tolist(), ts.tolist(), end.tolist()
    prev_thread = None
    for i in range(n):
        thread = thread_l[i]
        if thread != prev_thread:
            stack.clear()
            prev_thread = thread
        t = ts_l[i]
        while stack and end_l[stack[-1]] <= t + _EPS_US:
            stack.pop()
        if stack and end_l[i] <= end_l[stack[-1]] + _EPS_US:
            parent[i] = stack[-1]
        elif stack:
            # Partial overlap (clock rounding or a broken trace): treat as sibling of the
            # innermost op that contains its start.
            parent[i] = stack[-1]
        stack.append(i)
    return np.asarray(parent, dtype=np.int64)


def nearest(parent: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Index of the nearest ancestor-or-self where `mask` holds (or -1), by pointer jumping."""
    n = len(parent)
    idx = np.arange(n)
    result = np.where(mask, idx, -1)
    jump = parent.copy()
    todo = (result < 0) & (jump >= 0)
    while todo.any():
        j = jump[todo]
        hit = mask[j]
        sel = np.flatnonzero(todo)
        result[sel[hit]] = j[hit]
        jump[sel] = np.where(hit, -1, parent[j])
        todo = (result < 0) & (jump >= 0)
    return result


@dataclass
class Linked:
    """Ops with their nesting, and kernels with their launch and launching op."""

    ops: pl.DataFrame  # + parent (row index into ops, -1 none), depth
    kernels: pl.DataFrame  # + launch_name, launch_tid, launch_ts, op_row (row index into ops or null)
    launches: pl.DataFrame  # + op_row


def link(trace: Trace) -> Linked:
    ops = trace.ops.sort(["pid", "tid", "ts", "dur", "op_id"], descending=[False, False, False, True, False])
    ops = ops.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64), kind=pl.lit(0, pl.Int8))
    launches = trace.launches.with_row_index("launch_row").with_columns(pl.col("launch_row").cast(pl.Int64))

    # Nest ops and launches together: a launch's parent is its innermost enclosing op.
    both = pl.concat(
        [
            ops.select("pid", "tid", "ts", "dur", pl.col("row").alias("ref"), "kind"),
            launches.select("pid", "tid", "ts", "dur", pl.col("launch_row").alias("ref"), kind=pl.lit(1, pl.Int8)),
        ]
    ).sort(["pid", "tid", "ts", "kind", "dur"], descending=[False, False, False, False, True])
    ts = both["ts"].to_numpy()
    end = ts + both["dur"].to_numpy()
    thread = both.select(pl.struct(pl.col("pid").fill_null(""), pl.col("tid").fill_null("")).rank("dense"))
    parent_pos = nesting(thread.to_series().to_numpy(), ts, end)
    refs = both["ref"].to_numpy()
    kinds = both["kind"].to_numpy()
    # Map parent positions (in `both`) to op rows; launches are never parents of ops.
    parent_is_op = (parent_pos >= 0) & (kinds[np.maximum(parent_pos, 0)] == 0)
    parent_ref = np.where(parent_is_op, refs[np.maximum(parent_pos, 0)], -1)
    is_op = kinds == 0
    op_parent = np.full(ops.height, -1, dtype=np.int64)
    op_parent[refs[is_op]] = parent_ref[is_op]
    launch_op = np.full(launches.height, -1, dtype=np.int64)
    launch_op[refs[~is_op]] = parent_ref[~is_op]

    ops = ops.with_columns(parent=pl.Series(op_parent), depth=pl.Series(_depth(op_parent))).drop("kind")
    launches = launches.with_columns(op_row=pl.Series(launch_op))
    launch_keys = (
        launches.filter(pl.col("correlation").is_not_null())
        .unique("correlation", keep="first")
        .select(
            "correlation",
            pl.col("name").alias("launch_name"),
            pl.col("tid").alias("launch_tid"),
            pl.col("ts").alias("launch_ts"),
            pl.col("dur").alias("launch_dur"),
            pl.when(pl.col("op_row") >= 0).then(pl.col("op_row")).alias("op_row"),
        )
    )
    kernels = trace.kernels.join(launch_keys, on="correlation", how="left")
    missing = kernels.filter(pl.col("launch_name").is_null() & pl.col("correlation").is_not_null()).height
    if missing:
        trace.warnings.add("device activities whose launch is not in the trace (no host op; phase 'other')", missing)
    return Linked(ops=ops, kernels=kernels, launches=launches)


def _depth(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), dtype=np.int64)
    cur = parent.copy()
    while (cur >= 0).any():
        live = cur >= 0
        depth[live] += 1
        cur[live] = parent[cur[live]]
    return depth
