"""A `Trace` made fit for analysis: duplicates, implausible times and overlapping kernels found, counted and repaired.

Pure functions over the trace tables, each returning the cleaned frame
and what it counted, so `clean` can put every count in `trace.warnings`
(nothing is dropped or changed silently):

* `drop_duplicates`: extra copies of an identical event (a trace merged or
  written twice). The key is the event's identity, not its content:
  ops (name, cat, pid, tid, ts, dur, External id, Sequence number),
  kernels (name, kind, device, stream, ts, dur, correlation), launches
  (name, pid, tid, ts, dur, correlation), steps (step, name, pid, tid, ts,
  dur). An op without an External id and of zero duration is never a
  duplicate: µs-resolution traces record repeated zero-length calls at one
  timestamp legitimately.
* `drop_implausible_times`: rows whose ts or dur is not finite, or beyond
  `MAX_TIME_US` (1e19 µs: above every clock, nanoseconds since 1970 included).
* `clean_kernel_times`: device activities of zero duration are reported; a
  negative duration (the parsers already skip those) is reported and set to 0.
  A stream runs one kernel at a time, so kernels that overlap on one stream of
  one device (beyond `OVERLAP_EPS_US` of clock rounding) are reported and
  clipped: sorted by (device, stream, ts, longest first), each kernel's start
  is moved to the running maximum end of the kernels before it on its stream,
  and its duration shrinks so that its end is kept. A kernel wholly inside an
  earlier one keeps its end and gets zero duration (its time is the earlier
  kernel's). Rows are never dropped. Vectorized: one sort and a windowed
  cumulative max.
* `time_unit_suspicion`: times that look like nanoseconds in a microsecond
  field (a trace rewritten by a tool). The rule, any of:
  the largest |ts| is above 1e17 µs (year 5138 as µs since 1970; nanoseconds
  since 1970 are ~1.7e18); the trace spans more than 1e12 µs (11.6 days); the
  median positive duration of at least 20 device activities, or of at least 20
  host ops, is above 1e4 µs (10 ms: real medians are 1-100 µs). It only
  warns: a rescale would be a guess, and a wrong one silently scales every
  rate by 1000.

"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import polars as pl

from traceflops.core.errors import EmptyTraceError
from traceflops.core.trace import Trace, Warnings, sort_codes

MAX_TIME_US = 1e19
# No profile spans a day: an event this far from the trace's median time has a corrupt timestamp,
# and keeping it would stretch a step window over years (float rounding then breaks conservation).
MAX_SPREAD_US = 8.64e10
OVERLAP_EPS_US = 5e-4  # idle.MIN_GAP_US: below Kineto's 1 ns resolution, clock rounding
NS_TS_US = 1e17
NS_SPAN_US = 1e12
NS_MEDIAN_DUR_US = 1e4
NS_MIN_EVENTS = 20

OP_KEY = ("name", "cat", "pid", "tid", "ts", "dur", "ext_id", "seq")
KERNEL_KEY = ("name", "kind", "device", "stream", "ts", "dur", "correlation")
LAUNCH_KEY = ("name", "pid", "tid", "ts", "dur", "correlation")
STEP_KEY = ("step", "name", "pid", "tid", "ts", "dur")


# ---------------------------------------------------------------- before


def drop_duplicates(
    frame: pl.DataFrame, key: tuple[str, ...], exempt: pl.Expr | None = None
) -> tuple[pl.DataFrame, int]:
    """Keep the first copy of each identical event (nulls compare equal); `exempt` rows are always kept."""
    cols = [c for c in key if c in frame.columns]
    if frame.height < 2 or not cols:
        return frame, 0
    times = [c for c in ("ts", "dur") if c in cols]
    if times:
        # Copies share their start: only rows whose start repeats need the whole key compared.
        maybe = repeated(frame[times[0]])
        if maybe is None:
            return frame, 0
        rows = pl.Series(maybe).arg_true()
        keep = pl.struct(cols).is_first_distinct()
        sub = frame[rows].select(keep | exempt if exempt is not None else keep).to_series()
        drop = rows.filter(~sub)
        if drop.len() == 0:
            return frame, 0
        out = frame.with_row_index("_row").filter(~pl.col("_row").is_in(drop.implode())).drop("_row")
        return out, frame.height - out.height
    keep = pl.struct(cols).is_first_distinct()
    if exempt is not None:
        keep = keep | exempt
    out = frame.filter(keep)
    return out, frame.height - out.height


def repeated(values: pl.Series) -> np.ndarray | None:
    """Per row, whether its value is another row's too (nulls and NaNs equal to each other); None where none repeats.

    A stable argsort and its neighbours: a trace's times come nearly sorted, so this runs in a few ms where hashing
    every value (counting distinct ones, then flagging repeats) took 40 ms on 423 k launches."""
    a = values.to_numpy()  # nulls as NaN
    order = np.argsort(a, kind="stable")
    s = a[order]
    same = s[1:] == s[:-1]
    undefined = np.isnan(a) if a.dtype.kind == "f" else None
    many_undefined = undefined is not None and np.count_nonzero(undefined) > 1
    if not same.any() and not many_undefined:
        return None
    out = np.zeros(len(a), dtype=bool)
    out[order[1:][same]] = True
    out[order[:-1][same]] = True
    if many_undefined:
        out |= undefined
    return out


def op_duplicate_exempt() -> pl.Expr:
    """Ops that are never duplicates: no External id and zero duration."""
    return pl.col("ext_id").is_null() & (pl.col("dur") == 0).fill_null(False)


def _within(tables: dict[str, pl.DataFrame], spread: float) -> bool:
    """Whether the tables' starts and ends (a null duration: the start) all lie within `spread` of each other: min
    and max per table, no median (the median's selection was 40 ms on 810 k starts)."""
    lo, hi = [], []
    for t in tables.values():
        if t.height == 0 or "ts" not in t.columns:
            continue
        end = pl.col("ts") + pl.col("dur").fill_null(0) if "dur" in t.columns else pl.col("ts")
        a, b, c, d = t.select(
            pl.col("ts").min().alias("a"), pl.col("ts").max().alias("b"), end.min().alias("c"), end.max().alias("d")
        ).row(0)
        lo += [a, c]
        hi += [b, d]
    lo, hi = [v for v in lo if v is not None], [v for v in hi if v is not None]
    return not lo or max(hi) - min(lo) <= spread


def drop_implausible_times(frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Drop rows whose ts or dur is NaN, infinite or beyond MAX_TIME_US (null stays for later stages)."""
    if frame.height == 0 or "ts" not in frame.columns:
        return frame, 0
    bad = pl.lit(False)
    for c in ("ts", "dur"):
        if c in frame.columns:
            v = pl.col(c).cast(pl.Float64)
            bad = bad | (~v.is_finite() | (v.abs() >= MAX_TIME_US)).fill_null(False)
    mask = frame.select(bad).to_series()
    if not mask.any():
        return frame, 0  # the usual case: no copy of the table
    out = frame.filter(~mask)
    return out, frame.height - out.height


def drop_far_from_the_rest(tables: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], int]:
    """Drop events that start or end more than MAX_SPREAD_US from the median start of ops and kernels."""
    starts = [t["ts"] for k, t in tables.items() if k in ("ops", "kernels") and t.height]
    if not starts:
        return tables, 0
    if _within(tables, MAX_SPREAD_US):
        return tables, 0  # every start and end within the spread of every other: none is far from the median
    center = pl.concat(starts).median()
    if center is None:
        return tables, 0
    out, dropped = {}, 0
    for name, t in tables.items():
        if t.height == 0 or "ts" not in t.columns:
            out[name] = t
            continue
        end = pl.col("ts") + pl.col("dur").fill_null(0) if "dur" in t.columns else pl.col("ts")
        far = t.select(
            (((pl.col("ts") - center).abs() > MAX_SPREAD_US) | ((end - center).abs() > MAX_SPREAD_US)).fill_null(False)
        ).to_series()
        kept = t.filter(~far) if far.any() else t
        dropped += t.height - kept.height
        out[name] = kept
    return out, dropped


@dataclasses.dataclass(frozen=True)
class KernelTimeCounts:
    zero: int = 0  # zero duration (kept as is)
    negative: int = 0  # negative duration, set to 0
    clipped: int = 0  # start moved to the end of an earlier kernel on its stream
    contained: int = 0  # wholly inside an earlier kernel on its stream: zero duration now
    overlap_us: float = 0.0  # time removed by clipping


def clean_kernel_times(kernels: pl.DataFrame, eps: float = OVERLAP_EPS_US) -> tuple[pl.DataFrame, KernelTimeCounts]:
    """Zero/negative durations and same-stream overlaps (see the module docstring); row order is kept."""
    if kernels.height == 0:
        return kernels, KernelTimeCounts()
    dur = pl.col("dur")
    negative, zero = (int(v or 0) for v in kernels.select(n=(dur < 0).sum(), z=(dur == 0).sum()).row(0))
    k = kernels.with_columns(dur=pl.when(dur < 0).then(pl.lit(0.0)).otherwise(dur)).with_row_index("_row")
    timed = pl.col("ts").is_not_null() & pl.col("dur").is_not_null()
    s = (
        k.select(  # the texts as codes ordered as they are: no text is moved or compared
            "_row",
            "device",
            "ts",
            "dur",
            "correlation",
            stream=sort_codes(k["stream"], keep=True),
            name=sort_codes(k["name"], keep=True),
        )
        .filter(timed)
        .sort(
            ["device", "stream", "ts", "dur", "correlation", "name", "_row"],  # the row last: ties in file order
            descending=[False, False, False, True, False, False, False],
            nulls_last=True,
        )
        .with_columns(_end=pl.col("ts") + pl.col("dur"))
        .with_columns(_prev=pl.col("_end").cum_max().shift(1).over("device", "stream"))
    )
    over = (pl.col("_prev") - pl.col("ts") > eps).fill_null(False)
    s = s.with_columns(
        _over=over,
        _inside=over & (pl.col("_end") <= pl.col("_prev")) & (pl.col("dur") > 0),
        _ts=pl.when(over).then(pl.min_horizontal(pl.col("_prev"), pl.col("_end"))).otherwise(pl.col("ts")),
    )
    s = s.with_columns(_dur=pl.when(pl.col("_over")).then(pl.col("_end") - pl.col("_ts")).otherwise(pl.col("dur")))
    counts = s.select(
        clipped=(pl.col("_over") & (pl.col("_end") > pl.col("_prev"))).sum(),
        contained=pl.col("_inside").sum(),
        removed=(pl.col("dur") - pl.col("_dur")).sum(),
    ).row(0)
    if counts[0] or counts[1]:
        fix = s.filter(pl.col("_over")).select("_row", "_ts", "_dur")
        # Written in place at their rows (`_row` is each kernel's position): no join, no sort of every column.
        k = k.with_columns(
            k["ts"].scatter(fix["_row"], fix["_ts"].cast(k.schema["ts"])),
            k["dur"].scatter(fix["_row"], fix["_dur"].cast(k.schema["dur"])),
        )
    return k.drop("_row").select(kernels.columns), KernelTimeCounts(
        zero, negative, int(counts[0]), int(counts[1]), float(counts[2] or 0.0)
    )


def _median_positive(frame: pl.DataFrame) -> tuple[float | None, int]:
    if frame.height == 0:
        return None, 0
    d = frame.filter(pl.col("dur") > 0)["dur"]
    return (float(d.median()) if d.len() else None), d.len()  # type: ignore[arg-type]  # polars' stub


def _times(frame: pl.DataFrame) -> tuple[float, float, float] | None:
    """(first start, last end, largest |ts|) of a table, None when it has no timed row."""
    if frame.height == 0:
        return None
    r = frame.select(
        lo=pl.col("ts").min(), hi=(pl.col("ts") + pl.col("dur").fill_null(0.0)).max(), big=pl.col("ts").abs().max()
    ).row(0)
    return None if r[0] is None else (float(r[0]), float(r[1]), float(r[2]))


def time_unit_suspicion(trace: Trace) -> str | None:
    """Why the times look like nanoseconds rather than µs (None: they look like µs). Never rescales."""
    why = []
    spans = [t for t in (_times(trace.ops), _times(trace.kernels)) if t is not None]
    if spans:
        biggest = max(t[2] for t in spans)
        if biggest > NS_TS_US:
            why.append(f"timestamps reach {biggest:.3g}, beyond 1e17 µs")
        span = max(t[1] for t in spans) - min(t[0] for t in spans)
        if span > NS_SPAN_US:
            why.append(f"the trace spans {span:.3g} µs (> 11.6 days)")
    for what, frame in (("device activities", trace.kernels), ("host ops", trace.ops)):
        med, n = _median_positive(frame)
        if med is not None and n >= NS_MIN_EVENTS and med > NS_MEDIAN_DUR_US:
            why.append(f"the median duration of {n} {what} is {med:.3g} µs (> 10 ms)")
    return "; ".join(why) or None


def clean(trace: Trace) -> Trace:
    """The trace with duplicates, impossible times and same-stream overlaps resolved, each counted in warnings.

    Pure: returns a new `Trace` (with its own `Warnings`, the parser's counts plus these).

    Raises EmptyTraceError when neither a host op nor a device activity is left.
    """
    w = Warnings(Counter(trace.warnings.counts))  # a copy: cleaning twice does not count twice
    tables = {}
    for name in ("ops", "kernels", "launches", "markers", "steps"):
        frame, n = drop_implausible_times(getattr(trace, name))
        w.add(f"{name}: events with a non-finite or impossible (>= 1e19 µs) ts or dur (skipped)", n)
        tables[name] = frame
    tables, n = drop_far_from_the_rest(tables)
    w.add("events more than a day away from the rest of the trace (corrupt timestamp; skipped)", n)
    ops, n = drop_duplicates(tables["ops"], OP_KEY, op_duplicate_exempt())
    w.add("duplicate host ops (identical name, thread, ts, dur, External id; extra copies dropped)", n)
    kernels, n = drop_duplicates(tables["kernels"], KERNEL_KEY)
    w.add("duplicate device activities (identical name, device, stream, ts, dur, correlation; extra copies dropped)", n)
    launches, n = drop_duplicates(tables["launches"], LAUNCH_KEY)
    w.add("duplicate runtime launches (identical name, thread, ts, dur, correlation; extra copies dropped)", n)
    steps, n = drop_duplicates(tables["steps"], STEP_KEY)
    w.add("duplicate step markers (extra copies dropped)", n)
    kernels, c = clean_kernel_times(kernels)
    w.add("device activities of zero duration (they take no time)", c.zero)
    w.add("device activities with negative duration (set to 0)", c.negative)
    if c.clipped:
        w.add(
            "device activities that start before the previous one on their stream ends: start moved to that end "
            f"({c.overlap_us:.3f} us no longer double-counted)",
            c.clipped,
        )
    w.add(
        "device activities wholly inside an earlier one on their stream: their time is counted once, under the earlier "
        "one",
        c.contained,
    )
    out = dataclasses.replace(
        trace, ops=ops, kernels=kernels, launches=launches, markers=tables["markers"], steps=steps, warnings=w
    )
    if ops.height == 0 and kernels.height == 0:
        skipped = "; ".join(w.lines()[:3])
        raise EmptyTraceError(
            trace.meta.get("path"),
            "the trace holds no host op or device activity to analyse" + (f" (skipped: {skipped})" if skipped else ""),
            "profile at least one step with the profiler's CPU (and CUDA) activities on",
        )
    why = time_unit_suspicion(out)
    if why:
        w.add(
            f"times look like nanoseconds, not microseconds ({why}); nothing was rescaled: check the tool that wrote "
            "the trace"
        )
    return out


# ---------------------------------------------------------------- after
