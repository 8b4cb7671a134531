"""The idle gaps of each device inside its step windows, with why each was idle, and per-step launch statistics."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.trace import named_by
from traceflops.core.vocab import DEVICE_SIDE_LAUNCH, GAP_REASONS, OUTSIDE
from traceflops.stages.sweep import NO_DEVICE, Sweep, device_column, merged, sweep, usable

# Gaps shorter than half a nanosecond are below Kineto's resolution (1 ns):
# rounding of absolute timestamps (a double near 1e12 µs keeps ~5e-4 µs), not
# time the device lost. Real 1 ns gaps (back-to-back ROCm kernels) are kept.
MIN_GAP_US = 5e-4


def is_sync_call(name: pl.Expr) -> pl.Expr:
    """Host calls that block the host until device work finishes (CUDA runtime and driver, HIP).

    A memcpy without "Async" in its name (cudaMemcpy, hipMemcpyWithStream,
    cuMemcpyDtoH) is synchronous with respect to the host.
    """
    memcpy = name.str.contains(r"^(cuda|hip|cu)Memcpy") & ~name.str.contains("Async")
    return name.str.contains(r"^(cuda|hip|cu)(Stream|Device|Event|Ctx)Synchronize") | memcpy


def sync_calls(names: pl.Series) -> pl.Series:
    """Per row, whether the host call is a synchronizing one (`is_sync_call`)."""
    return named_by(names, is_sync_call)


def is_dataloader(name: pl.Expr) -> pl.Expr:
    """Host ops of the input pipeline (`enumerate(DataLoader)#...__next__` and kin)."""
    return name.str.contains("DataLoader")


# ---------------------------------------------------------------- idle gaps


def _idle_runs(s: Sweep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal idle intervals: (group, shifted start, length).

    Positive-length segments of a group tile its window in order, so two idle
    segments that follow each other in that order are adjacent in time.
    """
    pos = s.length > 0
    group, start, length = s.group[pos], s.start[pos], s.length[pos]
    busy = s.count[:, 0] != 0  # column by column: the counts are stored by column (a row gather of them was 30 ms)
    for c in range(1, 4):
        busy |= s.count[:, c] != 0
    idle = ~busy[pos]
    prev_idle = np.r_[False, idle[:-1] & (group[1:] == group[:-1])]
    first = idle & ~prev_idle
    run = np.cumsum(first) - 1
    idx = np.flatnonzero(first)
    dur = np.bincount(run[idle], weights=length[idle], minlength=len(idx))
    return group[idx], start[idx], dur


def _overlaps_any(gs: np.ndarray, ge: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each [gs, ge) shares time with any of the intervals [starts, ends)."""
    ms, me = merged(starts, ends)
    if len(ms) == 0:
        return np.zeros(len(gs), bool)
    j = np.searchsorted(ms, ge, side="left") - 1  # last merged interval starting before the gap ends
    return (j >= 0) & (me[np.maximum(j, 0)] > gs)


def _host_intervals(frame: pl.DataFrame | None, which, origin: float) -> tuple[np.ndarray, np.ndarray]:
    """Shifted [ts, ts+dur) of the host events whose name satisfies `which` (run once per distinct name)."""
    if frame is None or frame.height == 0:
        return np.empty(0), np.empty(0)
    f = frame.filter(named_by(frame["name"], which) & pl.col("ts").is_not_null())
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
    read = ("device", "ts", "dur", "cls", "launch_ts", "launch_name", "name")
    k = usable(kernels.select([c for c in read if c in kernels.columns]))  # a filter copies each column it keeps
    k = k.filter(pl.col("dur") > 0) if k.height else k  # an instant activity does not end a gap
    if k.height == 0 or len(ge) == 0:
        return launch_ts, pl.Series([None], dtype=pl.Utf8).new_from_index(0, len(ge))
    lt = k["launch_ts"].cast(pl.Float64) if "launch_ts" in k.columns else pl.Series(np.full(k.height, np.nan))
    if "launch_name" in k.columns:  # a device op's own anchor (TPU), not a host launch: when it was launched is unknown
        lt = k.select(pl.when(pl.col("launch_name") != DEVICE_SIDE_LAUNCH).then(lt))[:, 0]
    nxt = _next_kernels(
        k["device"].cast(pl.Int64).fill_null(NO_DEVICE).to_numpy(),
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


def _gap_reasons(gs, ge, launch_ts, launches, ops, origin) -> pl.Series:
    """The first matching rule per gap (see `idle_gaps`).

    Chosen as a position in `GAP_REASONS` and gathered from its names: a numpy array of text made into a column was a
    quarter of the idle gaps' time (220 k gaps at 10 tiles: 50 ms).
    """
    known = ~np.isnan(launch_ts)
    queued = known & (launch_ts - origin <= gs)
    sync = _overlaps_any(gs, ge, *_host_intervals(launches, is_sync_call, origin))
    loader = _overlaps_any(gs, ge, *_host_intervals(ops, is_dataloader, origin))
    rules = {"launch_gap": queued, "sync": sync, "input_pipeline": loader, "host_bound": known}  # tried in this order
    code = np.select(list(rules.values()), [GAP_REASONS.index(r) for r in rules], default=GAP_REASONS.index("unknown"))
    return pl.Series("reason", GAP_REASONS, dtype=pl.Utf8).gather(code)


def idle_gaps(
    kernels: pl.DataFrame,
    launches: pl.DataFrame | None,
    ops: pl.DataFrame | None,
    steps: pl.DataFrame,
    swept: Sweep | None = None,
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
    last two rules: next_kernel, next_launch_ts. `swept`: `sweep(kernels, steps)` where the caller already has it.
    """
    s = sweep(kernels, steps) if swept is None else swept
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
            "reason": _gap_reasons(gs, ge, launch_ts, launches, ops, origin),
            "next_kernel": names.cast(pl.Utf8).alias("next_kernel"),
            "next_launch_ts": pl.Series(launch_ts, dtype=pl.Float64).fill_nan(None),
        }
    ).with_columns(device_column())


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
