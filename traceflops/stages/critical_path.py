"""What bounded each step: the chain of dependent work, walked back from the step's end, whose length is the step.

The graph is what the trace records: stream order on the device (a kernel waits
for the one before it on its stream), launch → kernel (correlation: a kernel
cannot start before its runtime call enqueued it), host order on each thread (a
launch happens when the thread gets to it), host synchronisation (a synchronizing
call returns when the device work it waited for ends), and, where no recorded edge
explains a kernel's start, a wait on another stream of the device (a kernel of
another stream ended just before it started: what `cudaStreamWaitEvent` does; the
events themselves are not in Kineto traces).

The walk starts at the step's end: the last step's last device activity, or the
next step's first one (whose predecessor filled the end of this step's window).
At each kernel the binding predecessor is the one that became ready last; the
gap between it and the kernel is launch latency (after a launch), a cross-stream
wait (`sync`) or `idle` (nothing recorded explains it). At a launch the walk goes
to the host thread: back to the latest synchronizing call that returned before
it (then to the device work that call waited for), or to the window's start. So
the path is a contiguous chain of segments from the window's start to its end:
its length is the window by construction, and what no edge explains is `idle`.

Vectorized where it counts: a stream's back-to-back kernels whose binding
predecessor is the kernel before them form a run, emitted in one slice; the
Python loop steps only from run to run (a launch, a synchronisation, a wait).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceflops.core.contract import PATH_PREFIX
from traceflops.core.trace import Coded, name_matches, sort_codes
from traceflops.core.vocab import DEVICE_SIDE_LAUNCH, PATH_KINDS, PROFILER_STEP_RE
from traceflops.stages.idle import sync_calls

KINDS = PATH_KINDS  # what a segment of the path ran through
BETWEEN_OPS = "between ops (Python)"  # host time on the path outside every op the profiler recorded
_DEVICE_KIND = {
    "matmul": "device_matmul",
    "other_compute": "device_other",
    "memcpy": "memcpy",
    "memset": "memcpy",
    "communication": "communication",
}
# The path kinds of device work, as codes index them: each kernel's kind is read for the runs the path meets only.
_KIND_NAMES = np.array(sorted(set(_DEVICE_KIND.values())), dtype=object)
_KIND_CODE = {kind: i for i, kind in enumerate(_KIND_NAMES)}
_EPS = 0.5  # µs: ready this much after a start still counts as ready (timestamp rounding)
_CROSS_WINDOW = 50.0  # µs: another stream's kernel ending this close before a start explains it

SEGMENT_SCHEMA = {
    "step": pl.Int64,
    "start": pl.Float64,
    "end": pl.Float64,
    "dur": pl.Float64,
    "kind": pl.Utf8,
    "name": pl.Utf8,
}

_STREAM, _LAUNCH, _CROSS, _NONE = 0, 1, 2, 3


class _At:
    """A column's value per kernel in the graph's order, read one kernel at a time: the launch's thread and name are
    read at the heads of the runs the path meets, a few per step (an object array of every kernel's was a tenth of
    this stage)."""

    def __init__(self, values: pl.Series | None, pos: np.ndarray, default) -> None:
        self.values, self.pos, self.default = values, pos, default

    def __getitem__(self, i: int):
        got = None if self.values is None else self.values[int(self.pos[i])]
        return self.default if got is None else got


@dataclass
class _Graph:
    """Kernels in (device, stream, ts) order with each one's binding predecessor, and the host's synchronizing calls."""

    ts: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # int8: a position in _KIND_NAMES
    name: np.ndarray  # int64: a position in `names`
    names: np.ndarray  # object: the kernels' distinct names, then None
    pred: np.ndarray  # _STREAM | _LAUNCH | _CROSS | _NONE
    cross: np.ndarray  # the other stream's kernel, for _CROSS
    ready: np.ndarray  # when the binding predecessor was ready
    run_head: np.ndarray  # first kernel of the stream run this one ends
    launch_ts: np.ndarray
    launch_tid: _At  # read at a run's head only
    launch_name: _At
    by_end: np.ndarray  # kernel indices sorted by end
    by_start: np.ndarray  # kernel indices sorted by start
    ends_sorted: np.ndarray
    syncs: dict  # tid -> (starts, ends, names) sorted by end


def _graph(kernels: pl.DataFrame, launches: pl.DataFrame) -> _Graph:
    read = ("ts", "dur", "device", "stream", "launch_ts", "launch_dur", "launch_name", "launch_tid", "cls", "name")
    k = kernels.select([c for c in read if c in kernels.columns])  # the columns read below only
    # The timed kernels by device, stream and start (ties in file order), as positions `pos`: each column is read
    # through them, the texts as shared objects, so no kernel's name is moved (sorting them took most of this stage).
    streams = sort_codes(k["stream"].cast(pl.Utf8).fill_null(""))  # no stream and "": one stream, sorted as compared
    pos = (
        k.select("device", "ts", stream=streams, ok=pl.col("ts").is_not_null() & pl.col("dur").is_not_null())
        .with_row_index("_at")
        .filter("ok")
        .sort("device", "stream", "ts", maintain_order=True)["_at"]
        .to_numpy()
    )
    ts = k["ts"].to_numpy().astype(np.float64)[pos]
    end = ts + np.maximum(k["dur"].to_numpy().astype(np.float64)[pos], 0.0)
    dev = k["device"].fill_null(-1).to_numpy()[pos]
    stream = streams.to_numpy()[pos]
    same = np.zeros(len(ts), dtype=bool)
    if len(ts) > 1:
        same[1:] = (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])
    s_ready = np.where(same, np.r_[-np.inf, end[:-1]], -np.inf)

    has_launch = k["launch_ts"].is_not_null().to_numpy()[pos] if "launch_ts" in k.columns else np.zeros(len(ts), bool)
    if "launch_name" in k.columns:  # a link the parser made from a device op to itself is no host launch
        has_launch &= (k["launch_name"] != DEVICE_SIDE_LAUNCH).fill_null(True).to_numpy()[pos]
    lts = k["launch_ts"].fill_null(np.nan).to_numpy()[pos] if "launch_ts" in k.columns else np.full(len(ts), np.nan)
    ldur = k["launch_dur"].fill_null(0.0).to_numpy()[pos] if "launch_dur" in k.columns else np.zeros(len(ts))
    l_ready = np.where(has_launch, np.minimum(lts + ldur, ts), -np.inf)

    # The latest end of any kernel of the same device at or before each start (+ rounding): another stream's wait.
    order = np.lexsort((end, dev))
    d_sorted, e_sorted = dev[order], end[order]
    x_ready = np.full(len(ts), -np.inf)
    cross = np.full(len(ts), -1, dtype=np.int64)
    for d in np.unique(dev):
        lo, hi = np.searchsorted(d_sorted, d, "left"), np.searchsorted(d_sorted, d, "right")
        mine = np.flatnonzero(dev == d)
        at = np.searchsorted(e_sorted[lo:hi], ts[mine] + _EPS, "right") - 1
        ok = at >= 0
        idx = order[lo:hi][at[ok]]
        cross[mine[ok]] = idx
        x_ready[mine[ok]] = end[idx]
    # Only another stream's kernel that started before this one can be waited for.
    safe = np.maximum(cross, 0)
    bad = (cross < 0) | (stream[safe] == stream) | (ts[safe] >= ts)
    x_ready[bad], cross[bad] = -np.inf, -1
    explained = np.maximum(s_ready, l_ready)
    use_cross = (x_ready > explained + _EPS) & (x_ready >= ts - _CROSS_WINDOW)

    pred = np.where(use_cross, _CROSS, np.where(s_ready >= l_ready - _EPS, np.where(same, _STREAM, _NONE), _LAUNCH))
    pred = np.where((pred == _LAUNCH) & ~has_launch, _NONE, pred)
    ready = np.select([pred == _STREAM, pred == _LAUNCH, pred == _CROSS], [s_ready, l_ready, x_ready], -np.inf)
    head_mark = np.where(pred != _STREAM, np.arange(len(ts)), 0)
    run_head = np.maximum.accumulate(head_mark) if len(ts) else head_mark

    syncs: dict = {}
    sync = launches.filter(sync_calls(launches["name"]) & pl.col("ts").is_not_null() & pl.col("dur").is_not_null())
    for (tid,), g in (
        sync.with_columns(_end=pl.col("ts") + pl.col("dur")).sort("_end").group_by("tid", maintain_order=True)
    ):
        syncs[tid] = (g["ts"].to_numpy(), g["_end"].to_numpy(), g["name"].to_list())

    by_end = np.argsort(end, kind="stable")
    # each kernel's path kind as a code, by a comparison per class (another class, or none: other compute)
    kinds = np.full(k.height, _KIND_CODE[_DEVICE_KIND["other_compute"]], dtype=np.int8)
    for c, kind in _DEVICE_KIND.items() if "cls" in k.columns else ():
        kinds[(k["cls"] == c).fill_null(False).to_numpy()] = _KIND_CODE[kind]
    names = Coded.of(k["name"].fill_null(""))
    return _Graph(
        ts=ts,
        end=end,
        kind=kinds[pos],
        name=names.codes[pos],
        names=np.array([*names.distinct.to_list(), None], dtype=object),
        pred=pred,
        cross=cross,
        ready=ready,
        run_head=run_head,
        launch_ts=lts,
        launch_tid=_At(k["launch_tid"] if "launch_tid" in k.columns else None, pos, None),
        launch_name=_At(k["launch_name"] if "launch_name" in k.columns else None, pos, "launch"),
        by_end=by_end,
        ends_sorted=end[by_end],
        by_start=np.argsort(ts, kind="stable"),
        syncs=syncs,
    )


class _Path:
    """Segments emitted from the end backwards; `cur` is where the next (earlier) one must end."""

    def __init__(self, step: int, lo: float, hi: float):
        self.step, self.lo, self.cur = step, lo, hi
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.kinds: list[str] = []
        self.names: list[str] = []
        self.tids: list = []  # the host thread of a host segment (None elsewhere)

    @property
    def done(self) -> bool:
        return self.cur <= self.lo

    def add(self, start: float, kind: str, name: str, tid=None) -> None:
        start = min(max(start, self.lo), self.cur)
        if start < self.cur:
            self.starts.append(start)
            self.ends.append(self.cur)
            self.kinds.append(kind)
            self.names.append(name)
            self.tids.append(tid)
        self.cur = start

    def add_run(self, starts: np.ndarray, kinds: np.ndarray, names: np.ndarray) -> None:
        """`add` over many segments at once, in emission order: the cursor is a running minimum, floored at `lo`."""
        cur = np.maximum(self.lo, np.minimum.accumulate(np.r_[self.cur, starts]))
        keep = cur[1:] < cur[:-1]
        self.starts += cur[1:][keep].tolist()
        self.ends += cur[:-1][keep].tolist()
        self.kinds += kinds[keep].tolist()
        self.names += names[keep].tolist()
        self.tids += [None] * int(keep.sum())
        self.cur = float(cur[-1])


def _walk_run(g: _Graph, i: int, p: _Path) -> int:
    """Emit the stream run ending at kernel i (busy time and the idle gaps between), back to its head; return the
    head."""
    h = int(g.run_head[i])
    # Only the run's tail that ends after the window's start matters.
    first = max(h + int(np.searchsorted(g.end[h : i + 1], p.lo, "right")), h)
    js = np.arange(i, first - 1, -1)
    # Emission order, from the end back: kernel i, the gap before it, kernel i-1, ..., kernel `first` (no gap before h).
    gaps = js[js > h]
    starts = np.empty(len(js) + len(gaps))
    starts[0::2] = g.ts[js]
    starts[1::2] = g.end[gaps - 1]
    kinds = np.empty(len(starts), dtype=object)
    names = np.empty(len(starts), dtype=object)
    kinds[0::2], names[0::2] = _KIND_NAMES[g.kind[js]], g.names[g.name[js]]  # objects for the run's kernels only
    kinds[1::2] = names[1::2] = "idle"
    p.add_run(starts, kinds, names)
    return h


def _host(g: _Graph, tid, t: float, p: _Path) -> int | None:
    """From a launch at t on thread tid back to the sync call before it; the kernel that sync waited for, if any."""
    while not p.done:
        s = g.syncs.get(tid)
        k = -1 if s is None else int(np.searchsorted(s[1], t + _EPS, "right")) - 1
        while s is not None and k >= 0 and s[0][k] >= t:  # a sync that starts at the launch is not before it
            k -= 1
        if s is None or k < 0 or s[1][k] <= p.lo:  # no sync before it
            p.add(p.lo, "host", "host", tid)
            return None
        s_ts, s_end, s_name = float(s[0][k]), float(s[1][k]), s[2][k]
        p.add(min(s_end, t), "host", "host", tid)
        # The device work the sync waited for: the latest kernel that ended while it blocked.
        at = int(np.searchsorted(g.ends_sorted, s_end + _EPS, "right")) - 1
        if at >= 0 and g.ends_sorted[at] >= s_ts - _EPS:
            kernel = int(g.by_end[at])
            p.add(min(g.end[kernel], p.cur), "sync", s_name)
            return kernel
        p.add(s_ts, "sync", s_name)  # it returned without waiting: host time spent in the call
        t = s_ts
    return None


def _walk(g: _Graph, start_kernel: int, p: _Path, skip_busy: bool) -> None:
    i: int | None = start_kernel
    guard = 4 * len(g.ts) + 16
    while i is not None and not p.done and guard > 0:
        guard -= 1  # every round moves `cur` back or to an earlier kernel; the guard only bounds a bug
        if skip_busy:  # the next step's first kernel: only what it waited for lies in this window
            h, skip_busy = i, False
        else:
            h = _walk_run(g, i, p)
            if p.done:
                return
        kind = int(g.pred[h])
        if kind == _STREAM:  # a run head in the middle of a stream only after skip_busy
            p.add(g.end[h - 1], "idle", "idle")
            i = h - 1
        elif kind == _LAUNCH:  # one segment per launch: the runtime call and its latency until the kernel starts
            p.add(g.launch_ts[h], "launch", g.launch_name[h])
            i = _host(g, g.launch_tid[h], float(g.launch_ts[h]), p)
        elif kind == _CROSS:
            p.add(g.ready[h], "sync", "wait on another stream")
            i = int(g.cross[h])
        else:  # nothing recorded explains the run's start: idle back to the window's start
            p.add(p.lo, "idle", "idle")
            i = None
    if not p.done:
        p.add(p.lo, "idle", "idle")


def critical_path(
    kernels: pl.DataFrame, launches: pl.DataFrame, ops: pl.DataFrame, steps: pl.DataFrame
) -> pl.DataFrame:
    """Segments of every step's critical path (SEGMENT_SCHEMA), contiguous over the step's device window.

    `kernels` carry `cls`, `step` and their launch (`launch_ts`, `launch_dur`,
    `launch_tid`, `launch_name`); `ops` name the host segments; `steps` carry `step`, `start`, `window`.
    """
    if kernels.height == 0 or steps.height == 0:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    g = _graph(kernels, launches)
    win = steps.filter(pl.col("start").is_not_null() & pl.col("window").is_not_null()).sort("start")
    if win.height == 0:
        return pl.DataFrame(schema=SEGMENT_SCHEMA)
    # Where each step's walk starts, for all steps at once: its last device activity, or the next step's first one.
    lo_all = win["start"].to_numpy().astype(np.float64)
    hi_all = lo_all + win["window"].to_numpy().astype(np.float64)
    n = len(g.ts)
    if n:
        at_all = np.searchsorted(g.ends_sorted, hi_all + _EPS, "right") - 1
        first_all = np.searchsorted(
            g.ts, hi_all - _EPS, "left", sorter=g.by_start
        )  # the first kernel starting at the end
        nxt_all = g.by_start[np.minimum(first_all, n - 1)]
        has_nxt = (first_all < n) & (g.ts[nxt_all] <= hi_all + _EPS)
        end_at = np.where(at_all >= 0, g.ends_sorted[np.maximum(at_all, 0)], -np.inf)
        from_next = has_nxt & ((at_all < 0) | (end_at < hi_all - _EPS))
        start_kernel = np.where(from_next, nxt_all, np.where(at_all >= 0, g.by_end[np.maximum(at_all, 0)], -1))
    else:
        from_next, start_kernel = np.zeros(len(lo_all), bool), np.full(len(lo_all), -1)
    # One set of columns for every step (a frame per step cost more than the walk on traces of many small steps).
    p = _Path(0, 0.0, 0.0)
    counts = []
    for step, lo, hi, k, skip in zip(
        win["step"].to_list(), lo_all.tolist(), hi_all.tolist(), start_kernel.tolist(), from_next.tolist()
    ):
        before = len(p.starts)
        p.step, p.lo, p.cur = step, lo, hi
        if k >= 0:
            _walk(g, k, p, skip_busy=skip)
        if not p.done:
            p.add(lo, "idle", "idle")
        counts.append(len(p.starts) - before)
    step_col = win["step"].gather(np.repeat(np.arange(win.height), counts))
    frame = pl.DataFrame(
        {"step": step_col, "start": p.starts, "end": p.ends, "kind": p.kinds, "name": p.names, "tid": p.tids},
        schema={**_BASE, "tid": launches.schema.get("tid", pl.Utf8)},
    )
    seg = _name_host(frame, ops)
    return seg.with_columns(dur=pl.col("end") - pl.col("start")).select(list(SEGMENT_SCHEMA)).sort("step", "start")


_BASE = {k: v for k, v in SEGMENT_SCHEMA.items() if k != "dur"}


def outer_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """Each host thread's outermost ops below the step annotation: what a stretch of host time was running."""
    if ops is None or ops.height == 0 or "parent" not in ops.columns:
        return pl.DataFrame(schema={"tid": pl.Utf8, "ts": pl.Float64, "end": pl.Float64, "name": pl.Utf8})
    marker = name_matches(ops["name"], PROFILER_STEP_RE).to_numpy()
    parent = ops["parent"].to_numpy()
    top = (parent < 0) | np.where(parent >= 0, marker[np.maximum(parent, 0)], False)
    return (
        ops.select("tid", "ts", end=pl.col("ts") + pl.col("dur").fill_null(0.0), name="name")  # then filtered
        .filter(pl.Series(top & ~marker) & pl.col("ts").is_not_null())
        .sort("tid", "ts")
    )


def _name_host(seg: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Host segments cut at the thread's outermost ops, each piece named by the op it ran (or BETWEEN_OPS).

    Per thread, sorted-array interval algebra: a segment's cuts are the op boundaries strictly inside it
    (two searchsorted), and a piece is the op's that starts at or before it and ends at or after it.
    """
    host = seg.filter(pl.col("kind") == "host")
    if host.height == 0:
        return seg.drop("tid")
    outer = outer_ops(ops).with_columns(pl.col("tid").cast(host.schema["tid"], strict=False))
    pieces = []
    for (tid,), h in host.group_by("tid", maintain_order=True):
        o = outer.filter(pl.col("tid").eq_missing(tid))
        ots, oend, oname = o["ts"].to_numpy(), o["end"].to_numpy(), o["name"].to_numpy()
        cuts = np.unique(np.r_[ots, oend])
        s, e = h["start"].to_numpy(), h["end"].to_numpy()
        lo, hi = np.searchsorted(cuts, s, "right"), np.searchsorted(cuts, e, "left")
        n = np.maximum(hi - lo, 0)
        inner = cuts[_concat_ranges(lo, lo + n)]
        seg_of = np.repeat(np.arange(len(s)), n + 1)
        first = np.r_[0, np.cumsum(n + 1)[:-1]]  # each segment's first piece
        starts, ends = np.empty(len(seg_of)), np.empty(len(seg_of))
        is_first = np.zeros(len(seg_of), bool)
        is_first[first] = True
        is_last = np.r_[is_first[1:], True]
        starts[is_first], ends[is_last] = s, e
        starts[~is_first], ends[~is_last] = inner, inner
        j = np.searchsorted(ots, starts, "right") - 1
        named = (j >= 0) & (oend[np.maximum(j, 0)] >= ends) if len(ots) else np.zeros(len(starts), bool)
        names = np.where(named, oname[np.maximum(j, 0)] if len(ots) else BETWEEN_OPS, BETWEEN_OPS)
        pieces.append(
            pl.DataFrame(
                {"step": h["step"].to_numpy()[seg_of], "start": starts, "end": ends, "kind": "host", "name": names},
                schema=_BASE,
            )
        )
    return pl.concat([seg.filter(pl.col("kind") != "host").drop("tid"), *pieces]).filter(
        pl.col("end") > pl.col("start")
    )


def _concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]), without the loop."""
    n = hi - lo
    if n.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(lo - np.r_[0, np.cumsum(n)[:-1]], n)
    return np.arange(int(n.sum())) + offsets


def breakdown(segments: pl.DataFrame) -> pl.DataFrame:
    """Per step, the path's µs by kind (every kind a column, zeros included) and its length."""
    wide = segments.group_by("step").agg([pl.col("dur").filter(pl.col("kind") == k).sum().alias(k) for k in KINDS])
    return wide.with_columns(length=pl.sum_horizontal(list(KINDS))).sort("step")


def top_segments(segments: pl.DataFrame, n: int = 5) -> pl.DataFrame:
    """Per step, the n longest (kind, name) pairs of the path, their µs summed over the path."""
    return (
        segments.group_by("step", "kind", "name")
        .agg(pl.col("dur").sum(), pl.len().alias("segments"))
        .sort(["step", "dur"], descending=[False, True])
        .group_by("step", maintain_order=True)
        .head(n)
    )


def with_path_columns(steps: pl.DataFrame, segments: pl.DataFrame | None) -> pl.DataFrame:
    """The steps with the path's µs by kind as `path_<kind>` columns (null where the trace has no path)."""
    cols = [f"{PATH_PREFIX}{k}" for k in KINDS]
    if segments is None or segments.height == 0:
        return steps.with_columns([pl.lit(None, pl.Float64).alias(c) for c in cols])
    per = breakdown(segments).select("step", *[pl.col(k).alias(f"{PATH_PREFIX}{k}") for k in KINDS])
    return steps.join(per, on="step", how="left", maintain_order="left")
