"""Kernel → runtime launch → innermost enclosing op, and op nesting.

Nesting is per host thread: an op's parent is the innermost op on the same
(pid, tid) whose span contains it. A launch's op is found by the same rule,
climbing the nesting already built instead of joining the stack walk. Kernels reach their launch by
correlation id; one launch (a CUDA graph) may produce many kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

from traceflops.core.trace import Coded, Trace, name_matches, thread_order
from traceflops.core.vocab import DEVICE_SIDE_LAUNCH

# Slack for float-rounded ends: a child may end a few ns after its parent.
_EPS_US = 1e-3


def nesting(thread: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent index (or -1) of each interval: the latest-starting earlier interval on its thread still open.

    Intervals must be pre-sorted by (thread, ts, -dur); `thread` is an integer
    code per (pid, tid). "Still open" means ending after the start (plus a
    rounding slack), which is what a stack walk finds, partial overlaps
    included: an interval the walk has popped ended by an earlier start, so the
    walk's answer is the latest earlier interval still open, on the stack or not.
    Starts are in order, so interval j is open exactly for the intervals from
    j + 1 up to the first one starting at or after its end (`d`, one search per
    thread): each interval's parent is the largest j whose range [j + 1, d_j)
    holds it. Those ranges are painted largest j winning, each as two blocks of
    a power of two, the blocks then halved level by level: no per-event loop,
    about log2(the longest range) passes over the intervals (pointer jumping
    took 23 rounds at 587 k ops, long runs of siblings the most: twice the time).
    """
    q = ts + _EPS_US
    n = len(ts)
    same_thread = thread[1:] == thread[:-1]
    if n == 0 or np.isnan(q).any() or np.isnan(end).any() or (same_thread & (q[1:] < q[:-1])).any():
        return _nesting_by_jumping(thread, ts, end)  # a time missing or out of order: nothing to search
    first = np.flatnonzero(np.r_[True, ~same_thread])
    d = np.empty(n, dtype=np.int64)
    for lo, hi in zip(first.tolist(), [*first[1:].tolist(), n]):
        d[lo:hi] = lo + np.searchsorted(q[lo:hi], end[lo:hi], side="left")
    j = np.arange(n, dtype=np.int64)
    span = d - j - 1  # the intervals j is open for: j + 1 ... j + span
    has = span > 0
    j, span = j[has], span[has]
    level = np.frexp(span.astype(np.float64))[1].astype(np.int64) - 1  # 2**level <= span < 2**(level + 1)
    order = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[order], np.arange(int(level.max(initial=0)) + 2))
    parent = None  # per interval, the largest j of a block of the level above starting there
    for lev in range(len(bounds) - 2, -1, -1):
        at = order[bounds[lev] : bounds[lev + 1]]
        here = np.full(n, -1, dtype=np.int64)
        np.maximum.at(here, np.r_[j[at] + 1, j[at] + 1 + span[at] - (1 << lev)], np.r_[j[at], j[at]])
        if parent is not None:  # a block of the level above is two of this one
            half = 1 << lev
            np.maximum(here, parent, out=here)
            np.maximum(here[half:], parent[:-half], out=here[half:])
        parent = here
    return parent if parent is not None else np.full(n, -1, dtype=np.int64)


def _nesting_by_jumping(thread: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`nesting` where a time is missing (NaN) or out of order, by pointer jumping: the parent of i is the first
    interval on the ancestor chain of i-1 that is still open at i's start; every interval searches that chain at
    once, and one whose search meets an earlier interval's unfinished search takes over its position. A few
    vectorized rounds, about log(the longest run of siblings) of them."""
    n = len(ts)
    q = ts + _EPS_US
    cur = np.arange(n, dtype=np.int64) - 1
    if n:
        cur[np.r_[True, thread[1:] != thread[:-1]]] = -1
    parent = np.full(n, -1, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    todo = np.arange(n, dtype=np.int64)
    while len(todo):
        c = cur[todo]
        # Nothing earlier on the thread (-1) settles a search as "no parent" (the parent it takes); end[-1] is read
        # there but not used. One mask, no masked sub-selection: 30% less time than filtering the live ones first.
        hit = (c < 0) | (end[c] > q[todo])
        settled = todo[hit]
        parent[settled] = c[hit]
        done[settled] = True
        todo, c = todo[~hit], c[~hit]
        cur[todo] = np.where(done[c], parent[c], cur[c])
    return parent


def nearest(parent: np.ndarray, mask: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
    """Index of the nearest ancestor-or-self where `mask` holds (or -1): each op climbs until it finds one; for the
    ops `at` only (in their order), if given.

    Only the ops still climbing are touched in a round, so the work is the sum
    of the distances climbed, not the depth times every op.
    """
    rows = np.arange(len(parent)) if at is None else np.asarray(at, dtype=np.int64)
    hit = mask if at is None else mask[rows]
    result = np.where(hit, rows, -1)
    if not mask.any():  # nothing marked (often: no checkpoint, no hook, no compiled region): nothing to climb to
        return result
    todo = np.flatnonzero(~hit & (parent[rows] >= 0))
    up = parent[rows[todo]]
    while len(todo):
        hit = mask[up]
        result[todo[hit]] = up[hit]
        nxt = parent[up]  # read for all, then one filter: a fifth to a third less time than two rounds of filtering
        going = ~hit & (nxt >= 0)
        todo, up = todo[going], nxt[going]
    return result


def nearest_each(parent: np.ndarray, masks: list[np.ndarray]) -> list[np.ndarray]:
    """`nearest` for several masks over every op, in one climb: each op climbs until every mask has met an
    ancestor-or-self or it reaches a root.

    Phase tagging asks five questions of the same ancestors; climbing once for
    all of them reads each op's ancestors once instead of once per question.
    At most 8 masks (one bit each). For one mask `nearest` stays the faster climb (no bits: up to 30% less time).
    """
    if len(masks) > 8:
        raise ValueError("nearest_each takes at most 8 masks")
    n = len(parent)
    rows = np.arange(n)
    result = [np.where(m, rows, -1) for m in masks]
    live = [i for i, m in enumerate(masks) if m.any()]  # a mask marking nothing has nothing to climb to
    if not live:
        return result
    bits = np.zeros(n, dtype=np.uint8)
    for i in live:
        bits |= masks[i].astype(np.uint8) << i
    need = np.uint8(sum(1 << i for i in live)) & ~bits  # per op, the masks it has not met yet
    todo = np.flatnonzero((need != 0) & (parent >= 0))
    need, up = need[todo], parent[todo]
    while len(todo):
        got = bits[up] & need
        if got.any():
            for i in live:
                hit = ((got >> i) & 1).astype(bool)
                result[i][todo[hit]] = up[hit]
            need &= ~got
        nxt = parent[up]
        going = (need != 0) & (nxt >= 0)
        todo, up, need = todo[going], nxt[going], need[going]
    return result


def check_row_order(ops: pl.DataFrame) -> None:
    r = ops["row"]
    if r.len() and not (r[0] == 0 and r[-1] == r.len() - 1 and r.is_sorted()):
        raise ValueError("linked ops are out of row order; this is a bug in traceflops")


def row_index(rows) -> pl.Series:
    """Op rows as a gather index: a null or negative row (no op) gathers a null."""
    rows = pl.Series(rows) if not isinstance(rows, pl.Series) else rows
    return pl.select(pl.when(rows >= 0).then(rows.cast(pl.Int64))).to_series()


def by_row(ops: pl.DataFrame, rows, *columns: str) -> pl.DataFrame:
    """`columns` of the linked ops (or of a frame with their `row` column) at op rows.

    Linked ops are stored with `row` equal to their position, so this is a
    gather: no hash join, and no copy of the frame the result is added to.
    """
    check_row_order(ops)
    return ops.select([pl.col(c).gather(row_index(rows)) for c in columns])


def spread(values: pl.DataFrame, n: int, at: pl.Series | None = None) -> pl.DataFrame:
    """Columns given for some op rows (a `row` column, each row once), laid over all n rows (nulls elsewhere), or
    read at the op rows `at` (a null or negative row: nulls) without laying them over all rows first."""
    pos = np.full(n, -1, dtype=np.int64)
    pos[values["row"].to_numpy()] = np.arange(values.height)
    if at is not None:
        rows = at.cast(pl.Int64).fill_null(-1).to_numpy()
        pos = np.append(pos, -1)[np.where(rows >= 0, rows, n)]  # position n: none
    return values.drop("row").select(pl.all().gather(row_index(pos)))


@dataclass
class Linked:
    """Ops with their nesting, and kernels with their launch and launching op."""

    ops: pl.DataFrame  # + parent (row index into ops, -1 none), depth
    kernels: pl.DataFrame  # + launch_name, launch_tid, launch_ts, op_row (row index into ops or null)
    launches: pl.DataFrame  # + op_row

    @cached_property
    def op_names(self) -> Coded:
        """The ops' names coded once, for the patterns phase tagging runs over them."""
        return Coded.of(self.ops["name"], keep=True)  # the stages after read the same names


def thread_codes(ops: pl.DataFrame) -> np.ndarray:
    """An integer per (pid, tid), increasing along the ops' thread order."""
    same = (
        pl.col("pid").eq_missing(pl.col("pid").shift(1)) & pl.col("tid").eq_missing(pl.col("tid").shift(1))
    ).fill_null(False)
    return ops.select((~same).cum_sum())[:, 0].to_numpy().astype(np.int64)


def enclosing_op(
    parent: np.ndarray, op_thread: np.ndarray, op_ts: np.ndarray, op_end: np.ndarray, thread: np.ndarray, ts: np.ndarray
) -> np.ndarray:
    """Innermost op (row, or -1) whose span contains each instant, on its thread.

    The answer lies on the ancestor chain of the last op started at or before the
    instant (the same rule as `nesting`), so every query climbs that chain at
    once: no per-event loop, and launches need not join the stack walk.
    """
    cur = np.full(len(ts), -1, dtype=np.int64)
    by_thread = np.argsort(thread, kind="stable")
    groups = np.flatnonzero(np.diff(thread[by_thread])) + 1
    for sel in np.split(by_thread, groups) if len(ts) else []:
        t = thread[sel[0]]
        lo, hi = np.searchsorted(op_thread, t, side="left"), np.searchsorted(op_thread, t, side="right")
        if hi > lo:
            # the last op of the thread starting at or before the instant (ops are in start order)
            k = np.searchsorted(op_ts[lo:hi], ts[sel], side="right") - 1
            cur[sel] = np.where(k >= 0, k + lo, -1)
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        out = op_end[cur[todo]] <= ts[todo] + _EPS_US
        todo = todo[out]
        cur[todo] = parent[cur[todo]]
        todo = todo[cur[todo] >= 0]
    return cur


def link(trace: Trace) -> Linked:
    ops = thread_order(trace.ops)
    ops = ops.with_columns(row=pl.int_range(ops.height, dtype=pl.Int64))
    ts = ops["ts"].to_numpy()
    end = ts + ops["dur"].to_numpy()
    thread = thread_codes(ops)
    op_parent = nesting(thread, ts, end)
    ops = ops.with_columns(parent=pl.Series(op_parent), depth=pl.Series(_depth(op_parent)))

    # A launch's op: the innermost op of its thread containing its start.
    launches = trace.launches.with_row_index("launch_row").with_columns(pl.col("launch_row").cast(pl.Int64))
    # each thread's code, from its first op: ops come by thread, so a thread's ops are one run (no hash of every op)
    first = np.flatnonzero(np.r_[True, thread[1:] != thread[:-1]]) if len(thread) else np.zeros(0, dtype=np.int64)
    codes = ops.select("pid", "tid")[first].with_columns(_thread=pl.Series(thread[first]))
    on_thread = launches.select("pid", "tid", "ts").join(
        codes, on=["pid", "tid"], how="left", nulls_equal=True, maintain_order="left"
    )
    known = on_thread["_thread"].is_not_null().to_numpy()
    launch_op = np.full(launches.height, -1, dtype=np.int64)
    if known.any():
        launch_op[known] = enclosing_op(
            op_parent,
            thread,
            ts,
            end,
            on_thread["_thread"].to_numpy()[known].astype(np.int64),
            on_thread["ts"].to_numpy()[known],
        )
    launches = launches.with_columns(op_row=pl.Series(launch_op))
    launch_keys = (  # the columns kept only, before the filter and the distinct keys: not the launches' every one
        launches.select("correlation", "name", "tid", "ts", "dur", "op_row")
        .filter(pl.col("correlation").is_not_null() & pl.col("correlation").is_first_distinct())  # the first launch
        .select(
            "correlation",
            pl.col("name").alias("launch_name"),
            pl.col("tid").alias("launch_tid"),
            pl.col("ts").alias("launch_ts"),
            pl.col("dur").alias("launch_dur"),
            pl.when(pl.col("op_row") >= 0).then(pl.col("op_row")).alias("op_row"),
        )
    )
    # Each kernel's launch found by its key alone (a join of the keys and their positions), then gathered: the kernels'
    # own columns are not copied.
    at = _key_positions(launch_keys["correlation"], trace.kernels["correlation"])
    kernels = trace.kernels.with_columns(launch_keys.drop("correlation").select(pl.all().gather(at)))
    missing = kernels.select((pl.col("launch_name").is_null() & pl.col("correlation").is_not_null()).sum()).item()
    if missing:
        trace.warnings.add("device activities whose launch is not in the trace (no host op; phase 'other')", missing)
    implausible_links(launches, kernels, launch_keys.height, trace.warnings)
    return Linked(ops=ops, kernels=kernels, launches=launches)


def _key_positions(keys: pl.Series, wanted: pl.Series) -> pl.Series:
    """Per value of `wanted`, the position of the equal value in `keys` (distinct, no null), or null (none, or null).

    The keys sorted and searched: correlation ids come nearly in order, so the sort is a few ms (a hash join of the
    keys was twice the time at 423 k launches)."""
    k = keys.cast(pl.Int64).to_numpy()
    w = wanted.cast(pl.Int64)
    if len(k) == 0:
        return pl.Series([None] * w.len(), dtype=pl.Int64)
    order = np.argsort(k, kind="stable")
    ranked = k[order]
    want = w.fill_null(0).to_numpy()
    at = np.minimum(np.searchsorted(ranked, want), len(k) - 1)
    hit = (ranked[at] == want) & w.is_not_null().to_numpy()
    return row_index(np.where(hit, order[at], -1))


# A device activity cannot start before the host launched it; clock sync between host and device is good to a few µs.
_EARLY_US = 1000.0
# Runtime calls that launch exactly one kernel (CUDA runtime and driver, HIP).
_ONE_ACTIVITY_LAUNCH_RE = r"^(cuda|hip|cu|hipExt)(Launch(Cooperative)?Kernel|ModuleLaunchKernel)(ExC|Ex|_v\d+)?$"


def implausible_links(launches: pl.DataFrame, kernels: pl.DataFrame, distinct_keys: int, warnings) -> None:
    """Count the links a real profiler never writes: launches sharing a correlation id (`distinct_keys`: how many
    distinct ids the launches hold), kernels that start before their launch."""
    shared = launches.height - launches["correlation"].null_count() - distinct_keys
    if shared:
        warnings.add(
            "runtime launches share a correlation id with an earlier launch (their device activities are "
            "linked to the first; phases and step assignment may be wrong)",
            shared,
        )
    # One kernel launch (cudaLaunchKernel and kin; not a graph launch) makes one device activity: a second one with
    # its correlation id is another launch's, whose op then loses its FLOPs.
    once = kernels["correlation"].filter(name_matches(kernels["launch_name"], _ONE_ACTIVITY_LAUNCH_RE))
    collided = once.len() - once.n_unique()  # the one column filtered, not the kernels' every one
    if collided:
        warnings.add(
            "device activities carry the correlation id of a launch that makes one activity, already taken by "
            "another (corrupt or merged correlation ids: their ops' FLOPs and phases may be wrong)",
            collided,
        )
    # A device op's own anchor (TPU: no host launch recorded, placed inside the op) is not a launch time.
    early = kernels.select(
        ((pl.col("ts") < pl.col("launch_ts") - _EARLY_US) & (pl.col("launch_name") != DEVICE_SIDE_LAUNCH)).sum()
    ).item()
    if early:
        warnings.add(
            f"device activities start more than {_EARLY_US:.0f} us before the launch their correlation id names "
            "(inconsistent clocks or correlation ids; linked anyway)",
            early,
        )


def _depth(parent: np.ndarray) -> np.ndarray:
    """Ancestors per op, counted as each op climbs: only the ops still climbing are touched in a round (the depth
    times every op was a quarter more)."""
    depth = np.zeros(len(parent), dtype=np.int64)
    at = np.flatnonzero(parent >= 0)
    up = parent[at]
    while len(at):
        depth[at] += 1
        up = parent[up]
        going = up >= 0
        at, up = at[going], up[going]
    return depth
