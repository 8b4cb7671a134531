"""Where device time went, per device and step: an exact partition, overlays, idle gaps.

One primitive does all the interval algebra: a sweep over sorted interval
endpoints. Every kernel contributes +1 at its start and -1 at its end to a few
count columns (one per class, plus overlay columns); a cumulative sum over the
endpoints sorted by (group, time) then gives, for every elementary segment
between two consecutive endpoints, how many kernels of each column are active.
Because the +1s and -1s of each group cancel, one global cumulative sum serves
all groups at once, and the segments of a group tile its window exactly, which
is what makes the partition sum to the window by construction (not by a fix-up).

A group is one (device, step window). Kernels are clipped to each window they
touch, so a kernel that spans a step boundary splits its time between steps.
Windows are taken as given by `steps.device_windows`; they may even overlap
(a step without device work keeps its host span), so a kernel is copied into
every window it touches rather than assigned to one.

Times are shifted to the earliest window start before any arithmetic:
absolute Kineto timestamps (~1e12 µs) keep only ~5e-4 µs of resolution, which
would cost the 1e-9 identity of the loss budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceflops.core import fmt
from traceflops.core.errors import ConservationError
from traceflops.core.trace import Trace
from traceflops.core.vocab import (
    BUSY_CLASSES,
    DEVICE_SIDE_LAUNCH,
    HOST_COMM_WAIT_RE,
    HOST_COMM_WORK_RE,
    NO_DEVICE_ACTIVITY,
    OUTSIDE,
    PARTITION,
    PROFILE_THE_DEVICE,
    RANGE_PROFILER_CAPTURE,
)
from traceflops.stages.link import nearest
from traceflops.stages.steps import DEVICE_WORK_LAUNCH

# Count columns of the sweep (see `_kernel_arrays`): the four busy classes of
# the partition in priority order, then the overlay columns.
_RECOMPUTE, _MM_KNOWN, _MM_UNKNOWN, _COLLECTIVE = 4, 5, 6, 7
_NCOLS = 8

# Gaps shorter than half a nanosecond are below Kineto's resolution (1 ns):
# rounding of absolute timestamps (a double near 1e12 µs keeps ~5e-4 µs), not
# time the device lost. Real 1 ns gaps (back-to-back ROCm kernels) are kept.
MIN_GAP_US = 5e-4

_NO_DEVICE = np.iinfo(np.int64).min  # stands for a null device id while in numpy


def is_sync_call(name: pl.Expr) -> pl.Expr:
    """Host calls that block the host until device work finishes (CUDA runtime and driver, HIP).

    A memcpy without "Async" in its name (cudaMemcpy, hipMemcpyWithStream,
    cuMemcpyDtoH) is synchronous with respect to the host.
    """
    memcpy = name.str.contains(r"^(cuda|hip|cu)Memcpy") & ~name.str.contains("Async")
    return name.str.contains(r"^(cuda|hip|cu)(Stream|Device|Event|Ctx)Synchronize") | memcpy


def is_dataloader(name: pl.Expr) -> pl.Expr:
    """Host ops of the input pipeline (`enumerate(DataLoader)#...__next__` and kin)."""
    return name.str.contains("DataLoader")


@dataclass(frozen=True)
class _Windows:
    """Step windows sorted by start, shifted so that the earliest starts at 0."""

    step: np.ndarray  # step id
    start: np.ndarray  # shifted start, µs
    end: np.ndarray  # shifted start + window: the window length survives exactly
    origin: float  # absolute time of shifted 0


@dataclass(frozen=True)
class _Sweep:
    """Elementary segments of every (device, window) group, in (group, time) order."""

    group: np.ndarray  # group id = device_code * n_windows + window index
    start: np.ndarray  # shifted segment start
    length: np.ndarray  # segment length (0 across group boundaries)
    count: np.ndarray  # active kernels per count column during the segment, (n, _NCOLS)
    devices: np.ndarray  # device id per device code
    windows: _Windows
    columns: np.ndarray  # which count columns each usable kernel adds to, (kernels, _NCOLS) bool
    pair: np.ndarray  # the kernel row (of the usable kernels) of each (kernel, window) pair
    first: np.ndarray  # each pair's first segment: the position of its start event
    stop: np.ndarray  # each pair's end event: its segments are first .. stop-1


# ---------------------------------------------------------------- primitives


def _windows(steps: pl.DataFrame) -> _Windows:
    """Step windows as sorted numpy arrays, shifted to a near-zero origin for precision."""
    w = (
        steps.select(
            pl.col("step").cast(pl.Int64),
            pl.col("start").cast(pl.Float64),
            pl.col("window").cast(pl.Float64).fill_null(0.0).clip(lower_bound=0.0),
        )
        .filter(pl.col("start").is_not_null())
        .sort("start", "step")
    )
    start = w["start"].to_numpy()
    origin = float(start[0]) if len(start) else 0.0
    shifted = start - origin
    return _Windows(w["step"].to_numpy(), shifted, shifted + w["window"].to_numpy(), origin)


def _device_codes(kernels: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes for the devices of `kernels`, and the device id of each code.

    A trace without device work still gets one (null) device, so that every
    step appears in the partition, all idle.
    """
    dev = kernels["device"].cast(pl.Int64).fill_null(_NO_DEVICE).to_numpy() if kernels.height else np.empty(0, np.int64)
    devices, codes = np.unique(dev, return_inverse=True)
    if len(devices) == 0:
        devices = np.array([_NO_DEVICE], np.int64)
    return devices, codes.astype(np.int64)


def _window_pairs(ks: np.ndarray, ke: np.ndarray, w: _Windows) -> tuple[np.ndarray, np.ndarray]:
    """(interval index, window index) for every interval and window that share time.

    Candidates come from two binary searches (windows are sorted by start; the
    running max of their ends is sorted too), so the work is proportional to
    the pairs, not to intervals × windows; an exact overlap test then drops
    the candidates that only the running max let in.
    """
    if len(ks) == 0 or len(w.start) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    reach = np.maximum.accumulate(w.end)
    lo = np.searchsorted(reach, ks, side="right")  # first window that may end after the start
    hi = np.searchsorted(w.start, ke, side="left")  # windows that start before the end
    n = np.maximum(hi - lo, 0)
    ki = np.repeat(np.arange(len(ks)), n)
    wi = np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    keep = np.minimum(ke[ki], w.end[wi]) > np.maximum(ks[ki], w.start[wi])
    return ki[keep], wi[keep]


def _kernel_arrays(kernels: pl.DataFrame, origin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shifted start and end of each kernel, and which count columns it adds to (bool, column-major)."""
    cls = pl.col("cls")
    compute = cls.is_in(["matmul", "other_compute"])
    phase = pl.col("phase") if "phase" in kernels.columns else pl.lit(None, pl.Utf8)
    known = pl.col("flops").is_not_null() if "flops" in kernels.columns else pl.lit(False)
    cols = [
        cls == "matmul",
        cls == "other_compute",
        cls.is_in(["memcpy", "memset"]),
        cls == "communication",
        compute & (phase == "recompute").fill_null(False),
        (cls == "matmul") & known,
        (cls == "matmul") & ~known,
        (cls == "communication") & ~pl.col("name").str.contains(HOST_COMM_WAIT_RE).fill_null(False),  # not a wait
    ]
    weight = kernels.select([c.alias(str(i)) for i, c in enumerate(cols)]).to_numpy(order="fortran")
    start = kernels["ts"].cast(pl.Float64).to_numpy() - origin
    end = start + np.maximum(kernels["dur"].cast(pl.Float64).to_numpy(), 0.0)
    return start, end, weight.astype(bool)


def _usable(kernels: pl.DataFrame) -> pl.DataFrame:
    """Device activities that can take time: known class, a start and a duration."""
    if kernels.height == 0:
        return kernels
    return kernels.filter(
        pl.col("ts").is_not_null() & pl.col("dur").is_not_null() & pl.col("cls").is_in(list(BUSY_CLASSES))
    )


def _sweep(kernels: pl.DataFrame, steps: pl.DataFrame) -> _Sweep:
    """Cut every (device, window) into segments of constant activity.

    Window starts and ends enter as zero-weight endpoints, so each group's
    segments run from its window start to its window end with no hole.
    """
    w = _windows(steps)
    k = _usable(kernels)
    devices, codes = _device_codes(k)
    nw, nd = len(w.start), len(devices)
    ks, ke, weight = (
        _kernel_arrays(k, w.origin) if k.height else (np.empty(0), np.empty(0), np.empty((0, _NCOLS), bool))
    )
    ki, wi = _window_pairs(ks, ke, w)
    kg = codes[ki] * nw + wi
    gid = np.arange(nd * nw)
    group = np.concatenate([kg, kg, gid, gid])
    time = np.concatenate(
        [np.maximum(ks[ki], w.start[wi]), np.minimum(ke[ki], w.end[wi]), np.tile(w.start, nd), np.tile(w.end, nd)]
    )
    order = np.lexsort((time, group))
    group, time = group[order], time[order]
    # event → (kernel row, +1 start / -1 end); window edges add nothing
    n_ev = 2 * len(ki)
    is_k = order < n_ev
    rows = np.r_[ki, ki][order[is_k]]
    sign = np.where(order[is_k] < len(ki), 1, -1).astype(np.int32)
    count = np.zeros((len(order), _NCOLS), np.int32, order="F")
    for c in range(_NCOLS):  # a loop over count columns, not events
        delta = np.zeros(len(order), np.int32)
        delta[is_k] = sign * weight[rows, c]
        count[:, c] = np.cumsum(delta)
    same = np.r_[group[1:] == group[:-1], False]
    length = np.where(same, np.r_[time[1:], 0.0] - time, 0.0)
    at = np.empty(len(order), np.int64)
    at[order] = np.arange(len(order))
    return _Sweep(group, time, length, count, devices, w, weight, ki, at[: len(ki)], at[len(ki) : n_ev])


def _group_sums(s: _Sweep, values: np.ndarray) -> np.ndarray:
    """Sum of per-segment values per group."""
    n = len(s.devices) * len(s.windows.start)
    return np.bincount(s.group, weights=values, minlength=n)


def _labels(count: np.ndarray) -> np.ndarray:
    """Partition class index per segment: the first busy class in priority order, else idle."""
    busy = count[:, :4] > 0
    return np.select([busy[:, 0], busy[:, 1], busy[:, 2], busy[:, 3]], [0, 1, 2, 3], default=4)


def _device_column() -> pl.Expr:
    """The device ids as a column, the null-device sentinel back to null."""
    return pl.when(pl.col("device") == _NO_DEVICE).then(None).otherwise(pl.col("device")).alias("device")


def _group_frame(s: _Sweep, cols: dict[str, np.ndarray]) -> pl.DataFrame:
    """One row per (device, step) with its window, and the given per-group columns."""
    nw = len(s.windows.start)
    g = np.arange(len(s.devices) * nw)
    wi = g % max(nw, 1)
    return pl.DataFrame(
        {
            "device": pl.Series(s.devices[g // max(nw, 1)], dtype=pl.Int64),
            "step": pl.Series(s.windows.step[wi], dtype=pl.Int64),
            "start": pl.Series(s.windows.start[wi] + s.windows.origin, dtype=pl.Float64),
            "window": pl.Series(s.windows.end[wi] - s.windows.start[wi], dtype=pl.Float64),
            **{name: pl.Series(v, dtype=pl.Float64) for name, v in cols.items()},
        }
    ).with_columns(_device_column())


# ---------------------------------------------------------------- partition


def partition(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per (device, step): the window cut into exclusive classes, plus overlays.

    Partition columns (µs, summing to `window`): matmul > other_compute >
    memcpy (memcpy and memset) > communication_exposed > idle, each instant
    going to the highest-priority class active on any stream of the device.
    Overlays (µs, not part of the sum):
      communication_overlapped: communication under matmul or other compute;
      communication_total: all communication (exposed + overlapped + under memcpy);
      recompute: time when a recompute-phase compute kernel runs (within compute);
      matmul_known / matmul_unknown: the matmul time, each segment split by the
        number of active matmul kernels with known and unknown FLOPs, so that
        each kernel gets the share of the matmul time it covers (its duration
        when matmuls do not overlap); they sum to `matmul`.
    """
    s = _sweep(kernels, steps)
    label = _labels(s.count)
    nw = len(s.windows.start)
    ng = len(s.devices) * nw
    parts = np.bincount(s.group * 5 + label, weights=s.length, minlength=ng * 5).reshape(ng, 5)
    c = s.count > 0
    compute = c[:, 0] | c[:, 1]
    mm = np.maximum(s.count[:, _MM_KNOWN] + s.count[:, _MM_UNKNOWN], 1)
    in_mm = np.where(label == 0, s.length, 0.0)
    cols = {name: parts[:, i] for i, name in enumerate(PARTITION)}
    cols.update(
        communication_overlapped=_group_sums(s, np.where(c[:, 3] & compute, s.length, 0.0)),
        communication_total=_group_sums(s, np.where(c[:, 3], s.length, 0.0)),
        recompute=_group_sums(s, np.where(c[:, _RECOMPUTE], s.length, 0.0)),
        matmul_known=_group_sums(s, in_mm * s.count[:, _MM_KNOWN] / mm),
        matmul_unknown=_group_sums(s, in_mm * s.count[:, _MM_UNKNOWN] / mm),
    )
    out = _group_frame(s, cols)
    check_partition(out)
    return out


def comm_exposure(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each communication activity's share of the step time it exposed and of the time compute hid, µs.

    The partition's `communication_exposed` and `communication_overlapped` are
    cut among the communication activities active in each segment, evenly (two
    concurrent collectives each get half), so the shares of a step's
    collectives add up to its partition totals. Returns one row per
    communication row of `kernels` (its position among them as `row`) and its
    shares of `communication_total`, `_exposed` and `_overlapped`: `total`,
    `exposed` and `overlapped` (the rest of `total` ran under a memcpy).
    """
    k = kernels.with_columns(row=pl.int_range(pl.len(), dtype=pl.Int64))
    k = _usable(k)
    comm = (k["cls"] == "communication").to_numpy() if k.height else np.zeros(0, bool)
    empty = pl.DataFrame(schema={"row": pl.Int64, "total": pl.Float64, "exposed": pl.Float64, "overlapped": pl.Float64})
    if not comm.any():
        return empty
    s = _sweep(k, steps)
    c = s.count > 0
    # a collective active shares the segment with the others active; a wait (the thread blocked on one) only
    # keeps what no collective in flight takes
    waits = ~c[:, _COLLECTIVE]
    n = np.where(waits, np.maximum(s.count[:, 3], 1), np.maximum(s.count[:, _COLLECTIVE], 1))
    label = _labels(s.count)
    measures = [c[:, 3], label == 3, c[:, 3] & (c[:, 0] | c[:, 1])]
    is_wait = ~s.columns[s.pair, _COLLECTIVE]
    mine = comm[s.pair]
    out = {}
    for name, m in zip(("total", "exposed", "overlapped"), measures):  # a loop over three measures, not events
        share = np.where(m, s.length, 0.0) / n
        for_all = np.r_[0.0, np.cumsum(share)]
        for_waits = np.r_[0.0, np.cumsum(np.where(waits, share, 0.0))]
        before = np.where(is_wait[:, None], for_waits[np.c_[s.first, s.stop]], for_all[np.c_[s.first, s.stop]])
        out[name] = (before[:, 1] - before[:, 0])[mine]
    rows = k["row"].to_numpy()[s.pair[mine]]
    return (
        pl.DataFrame({"row": rows, **out})
        .group_by("row")
        .agg(pl.col("total", "exposed", "overlapped").sum())
        .sort("row")
    )


def with_comm_exposure(frame: pl.DataFrame, activities: pl.DataFrame, steps: pl.DataFrame, by_op: bool) -> pl.DataFrame:
    """`frame` (the kernels, or on a CPU trace the ops) with each communication row's `comm_exposed` and
    `comm_overlapped` µs (`comm_exposure`); activities are the frame's rows themselves, or ops by `op_row`."""
    e = comm_exposure(activities, steps)
    if by_op:
        e = (
            e.join(
                activities.select("op_row").with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)), on="row"
            )
            .group_by("op_row")
            .agg(pl.col("exposed", "overlapped").sum())
            .rename({"op_row": "row"})
        )
    exposed = np.full(frame.height, np.nan)
    overlapped = np.full(frame.height, np.nan)
    at = e["row"].to_numpy()
    exposed[at], overlapped[at] = e["exposed"].to_numpy(), e["overlapped"].to_numpy()
    return frame.with_columns(
        comm_exposed=pl.Series(exposed).fill_nan(None), comm_overlapped=pl.Series(overlapped).fill_nan(None)
    )


def check_partition(frame: pl.DataFrame, rel: float = 1e-6) -> None:
    """Raise if any row's partition does not add up to its window.

    The sweep makes this hold by construction; the check guards the
    construction, since every later number (the loss budget) relies on it.
    """
    total = pl.sum_horizontal([pl.col(c) for c in PARTITION])
    err = frame.select(
        bad=((total - pl.col("window")).abs() > rel * pl.max_horizontal(pl.col("window"), pl.lit(1.0))).any(),
        split=(
            (pl.col("matmul_known") + pl.col("matmul_unknown") - pl.col("matmul")).abs()
            > rel * pl.max_horizontal(pl.col("window"), pl.lit(1.0))
        ).any(),
    )
    if frame.height and (err["bad"][0] or err["split"][0]):
        raise ConservationError(
            "time partition",
            "time partition does not sum to the step window; this is a bug in traceflops.stages.timeline",
        )


# ---------------------------------------------------------------- idle gaps


def _idle_runs(s: _Sweep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal idle intervals: (group, shifted start, length).

    Positive-length segments of a group tile its window in order, so two idle
    segments that follow each other in that order are adjacent in time.
    """
    pos = s.length > 0
    group, start, length = s.group[pos], s.start[pos], s.length[pos]
    idle = (s.count[pos, :4] == 0).all(axis=1)
    prev_idle = np.r_[False, idle[:-1] & (group[1:] == group[:-1])]
    first = idle & ~prev_idle
    run = np.cumsum(first) - 1
    idx = np.flatnonzero(first)
    dur = np.bincount(run[idle], weights=length[idle], minlength=len(idx))
    return group[idx], start[idx], dur


def merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted disjoint (start, end): sort, running max of ends, new run at a jump."""
    if len(starts) == 0:
        return starts, ends
    o = np.argsort(starts, kind="stable")
    s, reach = starts[o], np.maximum.accumulate(ends[o])
    new = np.r_[True, s[1:] > reach[:-1]]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(s) - 1]
    return s[new], reach[last]


def union_measure(starts: np.ndarray, ends: np.ndarray):
    """F(x): the length of the union of [starts, ends) up to x, as a vectorized function (sorted-array interval
    algebra); how much of [s, e) the union covers is F(e) - F(s)."""
    ms, me = merged(starts, ends)
    before = np.r_[0.0, np.cumsum(me - ms)][:-1] if len(ms) else np.zeros(0)

    def F(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ms, x, side="right") - 1
        ok = k >= 0
        out = np.zeros(len(x))
        out[ok] = before[k[ok]] + np.clip(x[ok] - ms[k[ok]], 0, me[k[ok]] - ms[k[ok]])
        return out

    return F


def _overlaps_any(gs: np.ndarray, ge: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each [gs, ge) shares time with any of the intervals [starts, ends)."""
    ms, me = merged(starts, ends)
    if len(ms) == 0:
        return np.zeros(len(gs), bool)
    j = np.searchsorted(ms, ge, side="left") - 1  # last merged interval starting before the gap ends
    return (j >= 0) & (me[np.maximum(j, 0)] > gs)


def _host_intervals(frame: pl.DataFrame | None, which, origin: float) -> tuple[np.ndarray, np.ndarray]:
    """Shifted [ts, ts+dur) of the host events whose name satisfies `which`."""
    if frame is None or frame.height == 0:
        return np.empty(0), np.empty(0)
    f = frame.filter(which(pl.col("name")) & pl.col("ts").is_not_null())
    s = f["ts"].to_numpy().astype(np.float64) - origin
    return s, s + f["dur"].fill_null(0.0).to_numpy().astype(np.float64)


def _next_kernels(kdev: np.ndarray, kt: np.ndarray, kl: np.ndarray, qdev: np.ndarray, qt: np.ndarray) -> np.ndarray:
    """Index of the first kernel on the same device starting at or after each query time (-1: none).

    Kernels and queries are sorted together by (device, time, queries first,
    launch time); a reverse running minimum of kernel positions then gives, at
    every position, the nearest kernel at or after it. Among kernels that
    start together, the one launched first is taken.
    """
    nk, n = len(kt), len(kt) + len(qt)
    dev, time = np.r_[kdev, qdev], np.r_[kt, qt]
    is_q = np.r_[np.zeros(nk, bool), np.ones(len(qt), bool)]
    order = np.lexsort((np.r_[kl, np.zeros(len(qt))], ~is_q, time, dev))
    kpos = np.where(is_q[order], n, np.arange(n))
    nxt = np.minimum.accumulate(kpos[::-1])[::-1]
    qpos = np.flatnonzero(is_q[order])
    cand = np.minimum(nxt[qpos], n - 1)
    ok = (nxt[qpos] < n) & (dev[order[cand]] == dev[order[qpos]])
    out = np.full(len(qt), -1, np.int64)
    out[order[qpos] - nk] = np.where(ok, order[cand], -1)
    return out


def _next_kernel_launch(
    kernels: pl.DataFrame, gdev: np.ndarray, ge: np.ndarray, origin: float
) -> tuple[np.ndarray, pl.Series]:
    """Launch time (NaN: none) and name (null: none) of the kernel that ends each gap (starts at or after its end)."""
    launch_ts = np.full(len(ge), np.nan)
    k = _usable(kernels)
    k = k.filter(pl.col("dur") > 0) if k.height else k  # an instant activity does not end a gap
    if k.height == 0 or len(ge) == 0:
        return launch_ts, pl.Series([None], dtype=pl.Utf8).new_from_index(0, len(ge))
    lt = k["launch_ts"].cast(pl.Float64) if "launch_ts" in k.columns else pl.Series(np.full(k.height, np.nan))
    if "launch_name" in k.columns:  # a device op's own anchor (TPU), not a host launch: when it was launched is unknown
        lt = k.select(pl.when(pl.col("launch_name") != DEVICE_SIDE_LAUNCH).then(lt))[:, 0]
    nxt = _next_kernels(
        k["device"].cast(pl.Int64).fill_null(_NO_DEVICE).to_numpy(),
        k["ts"].cast(pl.Float64).to_numpy() - origin,
        lt.fill_null(np.inf).to_numpy(),
        gdev,
        ge,
    )
    has = nxt >= 0
    launch_ts[has] = lt.fill_null(np.nan).to_numpy()[nxt[has]]
    # a gather keeps one copy of each kernel name, however many gaps it ends
    names = k["name"].gather(pl.select(pl.when(pl.Series(has)).then(pl.Series(nxt))).to_series())
    return launch_ts, names


def _gap_reasons(gs, ge, launch_ts, launches, ops, origin) -> np.ndarray:
    """The first matching rule per gap (see `idle_gaps`)."""
    known = ~np.isnan(launch_ts)
    queued = known & (launch_ts - origin <= gs)
    sync = _overlaps_any(gs, ge, *_host_intervals(launches, is_sync_call, origin))
    loader = _overlaps_any(gs, ge, *_host_intervals(ops, is_dataloader, origin))
    return np.select(
        [queued, sync, loader, known], ["launch_gap", "sync", "input_pipeline", "host_bound"], default="unknown"
    )


def idle_gaps(
    kernels: pl.DataFrame, launches: pl.DataFrame | None, ops: pl.DataFrame | None, steps: pl.DataFrame
) -> pl.DataFrame:
    """Every maximal idle interval of a device inside a step window, with why it was idle.

    Idle means no device activity of any class on any stream of the device.
    A gap is cut at step-window edges (each part belongs to its step); gaps
    shorter than MIN_GAP_US (0.5 ns) are timestamp rounding and left out.
    Reason, first rule that matches:
      launch_gap:     the kernel that ends the gap was launched before the gap
                      began: it was queued, so the host did not cause the gap
                      (a bubble between back-to-back kernels, or a wait on
                      another stream), whatever the host was doing meanwhile;
      sync:           a synchronizing host call (stream/device/event/context
                      synchronize, a blocking memcpy) overlaps the gap;
      input_pipeline: a DataLoader op overlaps the gap;
      host_bound:     the kernel that ends the gap was launched after the gap
                      began: the device waited for the host to launch;
      unknown:        none of the above, and no kernel ends the gap or it has
                      no launch in the trace.
    The queued test comes first because a host blocked in a synchronize (or
    in a data loader) leaves the device idle only once its queue runs dry:
    on a deep queue (the MI300 ResNet trace queues ~25 ms ahead) a
    synchronize overlaps every small gap without causing any of them.
    Host and device share the trace's clock (true of Kineto traces), which is
    what lets host calls be compared with device gaps; host calls are not
    matched to a device (one rank's trace usually drives one device). Columns:
    device, step, start (trace clock), dur, reason, and the evidence for the
    last two rules: next_kernel, next_launch_ts.
    """
    s = _sweep(kernels, steps)
    nw = max(len(s.windows.start), 1)
    group, gs, dur = _idle_runs(s)
    real = dur >= MIN_GAP_US
    group, gs, dur = group[real], gs[real], dur[real]
    ge, origin = gs + dur, s.windows.origin
    gdev = s.devices[group // nw]
    launch_ts, names = _next_kernel_launch(kernels, gdev, ge, origin)
    return pl.DataFrame(
        {
            "device": pl.Series(gdev, dtype=pl.Int64),
            "step": pl.Series(s.windows.step[group % nw] if len(group) else [], dtype=pl.Int64),
            "start": pl.Series(gs + origin, dtype=pl.Float64),
            "dur": pl.Series(dur, dtype=pl.Float64),
            "reason": pl.Series(_gap_reasons(gs, ge, launch_ts, launches, ops, origin), dtype=pl.Utf8),
            "next_kernel": names.cast(pl.Utf8).alias("next_kernel"),
            "next_launch_ts": pl.Series(launch_ts, dtype=pl.Float64).fill_nan(None),
        }
    ).with_columns(_device_column())


# ---------------------------------------------------------------- launch statistics


def launch_stats(kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per step (by launch, as kernels are assigned): kernel count, median duration, median launch delay.

    The delay (kernel start − launch call start) tells a host-bound run (small
    delays: the device runs each kernel as soon as it is launched) from a
    device-bound one (large delays: a deep queue). Device work launched outside
    every step gets its own row (step -1) so that nothing is dropped.
    """
    base = steps.select(pl.col("step").cast(pl.Int64), pl.col("name").cast(pl.Utf8))
    if kernels.height == 0:
        return base.with_columns(
            kernels=pl.lit(0, pl.Int64),
            median_dur=pl.lit(None, pl.Float64),
            median_launch_delay=pl.lit(None, pl.Float64),
        )
    delay = (pl.col("ts") - pl.col("launch_ts")) if "launch_ts" in kernels.columns else pl.lit(None, pl.Float64)
    per = kernels.group_by(pl.col("step").cast(pl.Int64)).agg(
        kernels=pl.len().cast(pl.Int64),
        median_dur=pl.col("dur").median(),
        median_launch_delay=delay.median(),
    )
    out = base.join(per, on="step", how="left").with_columns(pl.col("kernels").fill_null(0))
    outside = per.filter(pl.col("step") == OUTSIDE)
    if outside.height and OUTSIDE not in base["step"].to_list():
        out = pl.concat([out, outside.with_columns(name=pl.lit("outside steps")).select(out.columns)])
    return out


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


PROGRAM_SHARE = (
    0.5  # a device busy for less than this share of the busiest one ran other work (initialization, a side program)
)


def program_devices(part: pl.DataFrame, activities: pl.DataFrame | None = None) -> list:
    """The devices that ran the program: the busiest, and every device busy at least PROGRAM_SHARE as long or, given
    the `activities` the partition was made of, that ran at least PROGRAM_SHARE as many compute activities in its
    steps as any device did (a JAX process drives all its chips, or all its XLA:CPU devices; a PyTorch rank one
    device). Busy time alone would leave out a device of the program: the device that reaches a collective first
    waits there for the last, and XLA:CPU's devices share the host's cores, so one device's ops may run twice as long
    as another's; the same program runs as many compute ops on each (copies do not count: a device that only took
    transfers ran no program). A CPU trace's one 'device' is None."""
    busy = (pl.col("window") - pl.col("idle")).sum().alias("_busy")
    dev = part.group_by("device").agg(busy).sort("_busy", "device", descending=[True, False], nulls_last=True)
    if dev.height == 0:
        return [None]
    top = dev["_busy"][0] or 0.0
    if top <= 0:
        return dev.head(1)["device"].to_list()
    keep = pl.col("_busy") >= PROGRAM_SHARE * top
    if activities is not None and activities.height and dev.height > 1:
        ran = (
            activities.filter(
                pl.col("step").is_in(part["step"].unique().to_list()) & pl.col("cls").is_in(["matmul", "other_compute"])
            )
            .group_by("device")
            .agg(pl.len().alias("_n"))
        )
        dev = dev.join(ran, on="device", how="left", nulls_equal=True, maintain_order="left")
        most = dev["_n"].max() or 0
        if most:
            keep = keep | (pl.col("_n").fill_null(0) >= PROGRAM_SHARE * most)  # type: ignore[operator]  # polars' stub
    return dev.filter(keep)["device"].to_list()


def on_devices(frame: pl.DataFrame, devices: list) -> pl.DataFrame:
    """The rows of these devices (None matches rows without a device id)."""
    if "device" not in frame.columns:
        return frame
    known = [d for d in devices if d is not None]
    sel = pl.col("device").is_in(known) if known else pl.lit(False)
    if None in devices:
        sel = sel | pl.col("device").is_null()
    return frame.filter(sel)
