"""The events annotate adds, all on one new "traceflops" process: what the analysis found, as tracks a trace viewer
draws.

On a pid no input event uses, category `traceflops`:

* phase tracks: each device activity duplicated onto a thread named
  "traceflops: <phase>" (one per phase and device stream, so slices never
  overlap); on a CPU trace the executed matmul ops instead, per phase and thread;
* a "traceflops: steps" track with each step's device window, MFU, HFU and
  loss budget in its args;
* a "traceflops: critical path" track: each step's path as back-to-back
  slices named "<kind>: <what>" (host op, runtime call, kernel, sync, idle);
* counter ('C') tracks: "traceflops: achieved TFLOP/s" (the sum of the
  running matmul kernels' rates, per device) and "traceflops: MFU %" /
  "traceflops: HFU %" per step.

Also the value helpers the added args share (`num`, `tflops`, `meta`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import methodcaller
from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core.redact import any_lead
from traceflops.core.results import Analysis
from traceflops.core.vocab import PHASES
from traceflops.export.perfetto.added import json_nums, json_strings, json_values, rates
from traceflops.export.perfetto.redact import redact_meta_events

CAT = "traceflops"
PROCESS = "traceflops"


def num(v: Any) -> Any:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def tflops(flops, dur) -> float | None:
    if flops is None or not dur or dur <= 0:
        return None
    return float(flops) / (float(dur) * 1e-6) / 1e12


_PID = methodcaller("get", "pid")


def used_pids(events: list) -> set:
    """The pids the events use; one C-level map."""
    return known_pids(list(map(_PID, [e for e in events if e.__class__ is dict])))


def known_pids(pids: list) -> set:
    """The pids among `pids` that name a process (numbers and strings: a pid written as a list names none)."""
    try:
        found = set(pids)
    except TypeError:  # an unhashable pid
        found = {p for p in pids if p.__class__ in (int, str, float)}
    return {p for p in found if p.__class__ in (int, str, float)}


def new_pid(used: set) -> int:
    pid = 0x7FFF0000
    while pid in used or str(pid) in used:
        pid += 1
    return pid


def meta(pid: int, tid: int, kind: str, value: Any, ts: float) -> dict:
    """A metadata event as Kineto writes them (with ts, and tid 0 for the process)."""
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"ph": "M", "name": kind, "ts": ts, "pid": pid, "tid": tid, "args": {key: value}}


def _achieved_counter(items: np.ndarray) -> list[tuple[float, float]]:
    """Rows (ts, dur, TFLOP/s) of concurrent work -> (ts, summed rate) at every change, ending at 0."""
    if len(items) == 0:
        return []
    arr = np.asarray(items, dtype=float)
    t = np.concatenate([arr[:, 0], arr[:, 0] + arr[:, 1]])
    d = np.concatenate([arr[:, 2], -arr[:, 2]])
    order = np.lexsort((d, t))  # at one instant, ends (negative) before starts
    t, level = t[order], np.cumsum(d[order])
    last = np.r_[t[1:] != t[:-1], True]  # the level after all changes at that instant
    t, level = t[last], level[last]
    level[np.abs(level) < 1e-9 * max(1.0, np.abs(arr[:, 2]).max())] = 0.0
    return list(zip(t.tolist(), np.maximum(level, 0.0).tolist()))


def added_events(a: Analysis, pid: int) -> Added:
    """The new process: phase tracks, the steps track and counters."""
    # polars stubs type a column's min as any literal: a ts column's is a number
    t0: float = min(  # type: ignore[assignment]
        [
            x
            for x in (a.kernels["ts"].min() if a.kernels.height else None, a.ops["ts"].min() if a.ops.height else None)
            if x is not None
        ],
        default=0.0,
    )
    out: list[dict] = [meta(pid, 0, "process_name", PROCESS, t0), meta(pid, 0, "process_sort_index", -1, t0)]
    tid_of: dict[tuple, int] = {}

    def lane(key: tuple, label: str, order: int) -> tuple[int, list[dict]]:
        """A track's tid, and the metadata events that name it where it is new."""
        if key in tid_of:
            return tid_of[key], []
        tid = tid_of[key] = len(tid_of) + 1
        return tid, [meta(pid, tid, "thread_name", label, t0), meta(pid, tid, "thread_sort_index", order, t0)]

    def track(key: tuple, label: str, order: int) -> int:
        tid, named = lane(key, label, order)
        out.extend(named)
        return tid

    steps_tid = track(("steps",), "traceflops: steps", 0)
    for s in a.steps.iter_rows(named=True):
        if s.get("start") is None or s.get("window") is None:
            continue
        out.append(
            {
                "ph": "X",
                "cat": CAT,
                "name": s["name"],
                "pid": pid,
                "tid": steps_tid,
                "ts": s["start"],
                "dur": s["window"],
                "args": {
                    "traceflops.mfu": s.get("mfu"),
                    "traceflops.hfu": s.get("hfu"),
                    "traceflops.window_source": s.get("window_source"),
                    "traceflops.last": bool(s.get("last")),
                    "traceflops.loss_budget": s.get("loss_budget"),
                },
            }
        )

    if a.critical_path is not None and a.critical_path.height:
        path_tid = track(("critical path",), "traceflops: critical path", 0)
        for r in a.critical_path.iter_rows(named=True):
            out.append(
                {
                    "ph": "X",
                    "cat": CAT,
                    "name": f"{r['kind']}: {r['name']}",
                    "pid": pid,
                    "tid": path_tid,
                    "ts": r["start"],
                    "dur": r["dur"],
                    "args": {"traceflops.path_kind": r["kind"], "traceflops.step": r["step"]},
                }
            )

    rate: dict[str, np.ndarray] = {}
    if a.kernels.height:
        k = a.kernels.select("kernel_id", "name", "phase", "cls", "device", "stream", "ts", "dur", "flops").sort(
            "kernel_id"
        )
        many = k.select("device", "stream").n_unique() > 1
        rows = _activity_rows(
            k,
            ("device", "stream"),
            lane,
            lambda phase, device, stream: (
                f"traceflops: {phase}" + (f" · device {device} stream {stream}" if many else "")
            ),
        )
        spec: _Args = (
            ("kernel_id", "kernel_id", json_values),
            ("traceflops.class", "cls", json_strings),
            ("traceflops.flops", "flops", json_nums),
            ("device", "device", json_values),
            ("stream", "stream", json_values),
        )
        for (device,), part in _rated(k).partition_by("device", as_dict=True, maintain_order=True).items():
            rate[f"device {device}"] = part.select("ts", "dur", "tf").to_numpy()
    else:  # a CPU trace: the executed matmul ops are the compute
        o = (
            a.ops.filter(pl.col("matmul") & pl.col("ran"))
            .select("op_id", "name", "phase", "tid", "ts", "dur", "flops")
            .sort("op_id")
        )
        many = o["tid"].n_unique() > 1
        rows = _activity_rows(
            o,
            ("tid",),
            lane,
            lambda phase, tid: f"traceflops: {phase}" + (f" · thread {tid}" if many else ""),
        )
        spec = (("op_id", "op_id", json_values), ("traceflops.flops", "flops", json_nums))
        cpu = _rated(o)
        if cpu.height:
            rate["CPU"] = cpu.select("ts", "dur", "tf").to_numpy()
    counters: list[dict] = []  # after the activities

    for where, items in sorted(rate.items()):
        name = "traceflops: achieved TFLOP/s" + (f" ({where})" if len(rate) > 1 else "")
        for ts, v in _achieved_counter(items):
            counters.append({"ph": "C", "cat": CAT, "name": name, "pid": pid, "ts": ts, "args": {"TFLOP/s": v}})
    steps = a.steps.filter(pl.col("start").is_not_null() & pl.col("window").is_not_null()).sort("start")
    for col, label in (("mfu", "MFU %"), ("hfu", "HFU %")):
        vals = [(s["start"], s[col]) for s in steps.iter_rows(named=True)]
        if not any(v is not None for _, v in vals):
            continue
        for ts, v in vals:  # a step whose value is unknown has no sample (a counter value must be a number)
            if v is not None:
                counters.append(
                    {
                        "ph": "C",
                        "cat": CAT,
                        "name": f"traceflops: {label}",
                        "pid": pid,
                        "ts": ts,
                        "args": {label: v * 100.0},
                    }
                )
        end = steps.select((pl.col("start") + pl.col("window")).max()).item()
        counters.append(
            {"ph": "C", "cat": CAT, "name": f"traceflops: {label}", "pid": pid, "ts": end, "args": {label: 0.0}}
        )
    return Added(out, rows[0], spec, pid, rows[1], rows[2], counters)


_Args = tuple[tuple[str, str, Callable[[pl.Series], pl.Series]], ...]  # an args key, its column, its JSON encoder


@dataclass
class Added:
    """The added events in order: `before` (the process, steps and critical path), one per activity (kernel, or
    matmul op on a CPU trace) on its phase's track, with the metadata events naming a track just before the first
    activity on it, `after` (the counters). The activities are a frame made JSON text a slice at a time (`texts`):
    a dict per kernel was most of annotate's time after the stream, and the whole text at once a third of its peak."""

    before: list[dict]
    activities: pl.DataFrame  # name, ts, dur, the args' columns, `_tid`, `_meta` (a track's first row: its naming)
    args: _Args
    pid: int
    named: int  # metadata events among the activities
    redacted: int  # values the metadata rules replaced in them
    after: list[dict]

    def __len__(self) -> int:
        return len(self.before) + self.activities.height + self.named + len(self.after)

    def texts(self, batch: int = 8192) -> Iterator[str]:
        """The activities' events, `batch` at a time, each batch's events as JSON joined by commas."""
        for i in range(0, self.activities.height, batch):
            yield ",".join(_event_texts(self.activities.slice(i, batch), self.pid, self.args).to_list())

    def shapes_free(self) -> bool:
        """Whether no shape rule can change the activities' text (`texts`), so it need not be searched byte by byte
        (that search was a third of annotate's own work after the analysis on a 476 MB trace).

        Every rule starts with a leading literal (`core.redact.any_lead`). The text is one template per event with
        each value written in: a text column's as orjson writes it (quoted: no lead holds a quote), a number's, a
        boolean's or a null's as JSON writes them (no lead is made of digits, sign, point, exponent or those
        words), each after a ':' or ',' and before a ',' or a '}' (no lead holds those); a track's naming events
        as they are. So a lead in the text is a lead in a text column's value, as it is or as orjson writes it
        (an escape can make one: a newline before "pm_" is written `\npm_`), or in the template, which the first
        event's text shows."""
        frame = self.activities
        if frame.height == 0:
            return True
        values = [frame[c].drop_nulls().unique() for c, t in frame.schema.items() if t == pl.Utf8]
        first = _event_texts(frame.head(1), self.pid, self.args)
        return not any_lead(pl.concat([first, *values, *map(json_strings, values)]))

    def dicts(self) -> list[dict]:
        """Every event decoded (a small trace's whole document is built in memory)."""
        got = orjson.loads("[" + ",".join(self.texts()) + "]") if self.activities.height else []
        return self.before + got + self.after


def _rated(frame: pl.DataFrame) -> pl.DataFrame:
    """The activities whose FLOPs and duration give a rate (`added.rates`), with it as `tf`."""
    return frame.with_columns(
        tf=rates(frame["flops"], frame["dur"]), ts=pl.col("ts").cast(pl.Float64), dur=pl.col("dur").cast(pl.Float64)
    ).filter(pl.col("tf").is_not_null())


def _activity_rows(
    frame: pl.DataFrame,
    lanes: tuple[str, ...],
    lane: Callable[[tuple, str, int], tuple[int, list[dict]]],
    label: Callable[..., str],
) -> tuple[pl.DataFrame, int, int]:
    """Each activity with its phase's track (one per phase and lane: `_tid`), in the frame's order; the tracks are
    numbered as first met, their metadata events (redacted as `redact_meta_events` does) kept as text (`_meta`) on
    their first activity's row. Also how many metadata events, and how many values they had redacted."""
    frame = frame.with_columns(pl.col("phase").fill_null("other")).with_row_index("_row")
    keys = ["phase", *lanes]
    firsts = frame.group_by(keys, maintain_order=True).agg(pl.col("_row").first())
    meta_text, tids, named, redacted = [], [], 0, 0
    for row in firsts.select(keys).iter_rows():  # one per track
        phase = row[0]
        tid, events = lane(tuple(row), label(*row), 1 + PHASES.index(phase) if phase in PHASES else 9)
        redacted += redact_meta_events(events)
        named += len(events)
        tids.append(tid)
        meta_text.append("".join(orjson.dumps(e).decode() + "," for e in events))
    firsts = firsts.with_columns(_tid=pl.Series(tids, dtype=pl.Int64), _meta=pl.Series(meta_text, dtype=pl.Utf8))
    at = frame.join(firsts.rename({"_row": "_first"}), on=keys, how="left", nulls_equal=True, maintain_order="left")
    return (
        at.with_columns(
            _meta=pl.when(pl.col("_row") == pl.col("_first")).then(pl.col("_meta")).otherwise(pl.lit(""))
        ).drop("_row", "_first"),
        named,
        redacted,
    )


def _event_texts(part: pl.DataFrame, pid: int, args: _Args) -> pl.Series:
    """Each activity's event as orjson writes it, its track's metadata events before it on the track's first."""
    return pl.select(
        pl.concat_str(
            [
                part["_meta"],
                pl.lit('{"ph":"X","cat":' + orjson.dumps(CAT).decode() + ',"name":'),
                json_strings(part["name"]),
                pl.lit(f',"pid":{pid},"tid":'),
                part["_tid"].cast(pl.Utf8),
                pl.lit(',"ts":'),
                json_values(part["ts"]),
                pl.lit(',"dur":'),
                json_values(part["dur"]),
                pl.lit(',"args":{'),
                *[
                    x
                    for j, (key, column, encode) in enumerate(args)
                    for x in (pl.lit(("," if j else "") + orjson.dumps(key).decode() + ":"), encode(part[column]))
                ],
                pl.lit("}}"),
            ]
        )
    ).to_series()
