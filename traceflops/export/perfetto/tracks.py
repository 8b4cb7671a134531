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
from operator import methodcaller
from typing import Any

import numpy as np
import polars as pl

from traceflops.core.results import Analysis
from traceflops.core.vocab import PHASES

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
    """The pids the events use (numbers and strings: a pid written as a list names no process); one C-level map."""
    dicts = [e for e in events if e.__class__ is dict]
    try:
        found = set(map(_PID, dicts))
    except TypeError:  # an unhashable pid
        found = {p for p in map(_PID, dicts) if p.__class__ in (int, str, float)}
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


def _achieved_counter(items: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(ts, dur, TFLOP/s) of concurrent work -> (ts, summed rate) at every change, ending at 0."""
    if not items:
        return []
    arr = np.array(items, dtype=float)
    t = np.concatenate([arr[:, 0], arr[:, 0] + arr[:, 1]])
    d = np.concatenate([arr[:, 2], -arr[:, 2]])
    order = np.lexsort((d, t))  # at one instant, ends (negative) before starts
    t, level = t[order], np.cumsum(d[order])
    last = np.r_[t[1:] != t[:-1], True]  # the level after all changes at that instant
    t, level = t[last], level[last]
    level[np.abs(level) < 1e-9 * max(1.0, np.abs(arr[:, 2]).max())] = 0.0
    return list(zip(t.tolist(), np.maximum(level, 0.0).tolist()))


def added_events(a: Analysis, pid: int) -> list[dict]:
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

    def track(key: tuple, label: str, order: int) -> int:
        if key not in tid_of:
            tid = len(tid_of) + 1
            tid_of[key] = tid
            out.append(meta(pid, tid, "thread_name", label, t0))
            out.append(meta(pid, tid, "thread_sort_index", order, t0))
        return tid_of[key]

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

    rate: dict[str, list[tuple[float, float, float]]] = {}
    if a.kernels.height:
        k = a.kernels.select("kernel_id", "name", "phase", "cls", "device", "stream", "ts", "dur", "flops").sort(
            "kernel_id"
        )
        lanes = k.select("device", "stream").unique().sort("device", "stream", nulls_last=True).rows()
        many = len(lanes) > 1
        for r in k.iter_rows(named=True):
            phase = r["phase"] or "other"
            label = f"traceflops: {phase}" + (f" · device {r['device']} stream {r['stream']}" if many else "")
            tid = track((phase, r["device"], r["stream"]), label, 1 + PHASES.index(phase) if phase in PHASES else 9)
            out.append(
                {
                    "ph": "X",
                    "cat": CAT,
                    "name": r["name"],
                    "pid": pid,
                    "tid": tid,
                    "ts": r["ts"],
                    "dur": r["dur"],
                    "args": {
                        "kernel_id": r["kernel_id"],
                        "traceflops.class": r["cls"],
                        "traceflops.flops": num(r["flops"]),
                        "device": r["device"],
                        "stream": r["stream"],
                    },
                }
            )
            tf = tflops(r["flops"], r["dur"])
            if tf is not None:
                rate.setdefault(f"device {r['device']}", []).append((r["ts"], r["dur"], tf))
    else:  # a CPU trace: the executed matmul ops are the compute
        o = (
            a.ops.filter(pl.col("matmul") & pl.col("ran"))
            .select("op_id", "name", "phase", "tid", "ts", "dur", "flops")
            .sort("op_id")
        )
        lanes = o["tid"].unique().sort(nulls_last=True).to_list()
        many = len(lanes) > 1
        for r in o.iter_rows(named=True):
            phase = r["phase"] or "other"
            label = f"traceflops: {phase}" + (f" · thread {r['tid']}" if many else "")
            tid = track((phase, r["tid"]), label, 1 + PHASES.index(phase) if phase in PHASES else 9)
            out.append(
                {
                    "ph": "X",
                    "cat": CAT,
                    "name": r["name"],
                    "pid": pid,
                    "tid": tid,
                    "ts": r["ts"],
                    "dur": r["dur"],
                    "args": {"op_id": r["op_id"], "traceflops.flops": num(r["flops"])},
                }
            )
            tf = tflops(r["flops"], r["dur"])
            if tf is not None:
                rate.setdefault("CPU", []).append((r["ts"], r["dur"], tf))

    for where, items in sorted(rate.items()):
        name = "traceflops: achieved TFLOP/s" + (f" ({where})" if len(rate) > 1 else "")
        for ts, v in _achieved_counter(items):
            out.append({"ph": "C", "cat": CAT, "name": name, "pid": pid, "ts": ts, "args": {"TFLOP/s": v}})
    steps = a.steps.filter(pl.col("start").is_not_null() & pl.col("window").is_not_null()).sort("start")
    for col, label in (("mfu", "MFU %"), ("hfu", "HFU %")):
        vals = [(s["start"], s[col]) for s in steps.iter_rows(named=True)]
        if not any(v is not None for _, v in vals):
            continue
        for ts, v in vals:  # a step whose value is unknown has no sample (a counter value must be a number)
            if v is not None:
                out.append(
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
        out.append({"ph": "C", "cat": CAT, "name": f"traceflops: {label}", "pid": pid, "ts": end, "args": {label: 0.0}})
    return out
