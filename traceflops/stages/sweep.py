"""The sweep: device activities cut, per (device, step window), into segments of constant activity.

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
would cost the 1e-9 identity of the loss budget. Also the union of intervals
(`merged`, `union_measure`) the other stages and views measure overlap with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceflops.core.vocab import BUSY_CLASSES, HOST_COMM_WAIT_RE

# Count columns of the sweep (see `_kernel_arrays`): the four busy classes of
# the partition in priority order, then the overlay columns.
RECOMPUTE, MM_KNOWN, MM_UNKNOWN, COLLECTIVE = 4, 5, 6, 7
_NCOLS = 8

NO_DEVICE = np.iinfo(np.int64).min  # stands for a null device id while in numpy


@dataclass(frozen=True)
class _Windows:
    """Step windows sorted by start, shifted so that the earliest starts at 0."""

    step: np.ndarray  # step id
    start: np.ndarray  # shifted start, µs
    end: np.ndarray  # shifted start + window: the window length survives exactly
    origin: float  # absolute time of shifted 0


@dataclass(frozen=True)
class Sweep:
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
    dev = kernels["device"].cast(pl.Int64).fill_null(NO_DEVICE).to_numpy() if kernels.height else np.empty(0, np.int64)
    devices, codes = np.unique(dev, return_inverse=True)
    if len(devices) == 0:
        devices = np.array([NO_DEVICE], np.int64)
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


def usable(kernels: pl.DataFrame) -> pl.DataFrame:
    """Device activities that can take time: known class, a start and a duration."""
    if kernels.height == 0:
        return kernels
    return kernels.filter(
        pl.col("ts").is_not_null() & pl.col("dur").is_not_null() & pl.col("cls").is_in(list(BUSY_CLASSES))
    )


def sweep(kernels: pl.DataFrame, steps: pl.DataFrame) -> Sweep:
    """Cut every (device, window) into segments of constant activity.

    Window starts and ends enter as zero-weight endpoints, so each group's
    segments run from its window start to its window end with no hole.
    """
    w = _windows(steps)
    k = usable(kernels)
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
    return Sweep(group, time, length, count, devices, w, weight, ki, at[: len(ki)], at[len(ki) : n_ev])


def group_sums(s: Sweep, values: np.ndarray) -> np.ndarray:
    """Sum of per-segment values per group."""
    n = len(s.devices) * len(s.windows.start)
    return np.bincount(s.group, weights=values, minlength=n)


def labels(count: np.ndarray) -> np.ndarray:
    """Partition class index per segment: the first busy class in priority order, else idle."""
    busy = count[:, :4] > 0
    return np.select([busy[:, 0], busy[:, 1], busy[:, 2], busy[:, 3]], [0, 1, 2, 3], default=4)


def device_column() -> pl.Expr:
    """The device ids as a column, the null-device sentinel back to null."""
    return pl.when(pl.col("device") == NO_DEVICE).then(None).otherwise(pl.col("device")).alias("device")


def group_frame(s: Sweep, cols: dict[str, np.ndarray]) -> pl.DataFrame:
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
    ).with_columns(device_column())


# ---------------------------------------------------------------- union of intervals


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
