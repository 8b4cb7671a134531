"""The user's own Kineto trace, annotated with what traceflops found, for Perfetto / chrome://tracing.

`annotate(trace_path, analysis, out_path)` re-reads the original JSON and writes it back with:

* every input event kept, in order, unchanged except that device activities
  (and ops) gain args:
  - device activity (kernel, memcpy, memset): `traceflops.phase`,
    `traceflops.class` (matmul | other_compute | communication | memcpy |
    memset), `traceflops.flops` (null when unknown or not a matmul),
    `traceflops.achieved_tflops` (its FLOPs over its duration), `traceflops.step`,
    and, where known, `traceflops.module`, `traceflops.bound`,
    `traceflops.intensity` (FLOP/byte), `traceflops.recoverable_us`;
  - op (cpu_op, user_annotation): `traceflops.phase`; matmul-class ops also
    `traceflops.flops` and `traceflops.ran`;
* new events, all on one new process "traceflops" (a pid no input event uses),
  category `traceflops`:
  - phase tracks: each device activity duplicated onto a thread named
    "traceflops: <phase>" (one per phase and device stream, so slices never
    overlap); on a CPU trace the executed matmul ops instead, per phase and thread;
  - a "traceflops: steps" track with each step's device window, MFU, HFU and
    loss budget in its args;
  - a "traceflops: critical path" track: each step's path as back-to-back
    slices named "<kind>: <what>" (host op, runtime call, kernel, sync, idle);
  - counter ('C') tracks: "traceflops: achieved TFLOP/s" (the sum of the
    running matmul kernels' rates, per device) and "traceflops: MFU %" /
    "traceflops: HFU %" per step.

Secrets (rules in `core/redact.py`): annotate never adds one and never copies
one from the metadata. The other top-level keys are kept (it is the user's own
trace) but redacted by key name and by value shape (`core.redact.redact`:
environments, credential-named keys, URL passwords, secret query parameters,
flags and `KEY=value` pairs, token-shaped strings), and so are the args of every
metadata ('M') event (process and thread labels). The recorded events' own
args and names (shapes, types, ids the parser reads) are not redacted by key,
but the whole written trace, added events included, passes the shape rules
(`core.redact.redact_bytes`: URL passwords and known token shapes), so no
token-shaped string reaches the output wherever it sat. A top-level
`traceflops` key records what was added and how many values were redacted.

The output is written atomically (a temporary file beside it, then a rename),
gzipped unless the name ends in plain `.json`.

Device activities are matched to `Analysis.kernels` by `kernel_id`, which the
Kineto parser assigns as the order, in the file, of the complete ('X') events
of a device category with a usable name, ts and dur (see
`parsers/kineto.py: event_table, build_trace`); ops likewise by `op_id`.
This module recomputes that numbering with the parser's own rules and checks
names and timestamps agree, so an analysis of another trace is refused.
"""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core.errors import FormatError, InputError
from traceflops.core.files import write_atomic
from traceflops.core.redact import redact, redact_bytes, redact_text
from traceflops.core.results import Analysis
from traceflops.core.vocab import PHASES
from traceflops.parsers.io import read_bytes
from traceflops.parsers.kineto import IGNORED_CATS, KERNEL_CATS, OP_CATS

CAT = "traceflops"
PROCESS = "traceflops"


# --- reading and numbering ----------------------------------------------------


def load_document(path: str) -> dict:
    raw = read_bytes(path)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as ex:
        raise FormatError(path, f"not a complete JSON document ({ex})",
                          "annotate needs a whole Kineto (PyTorch profiler) JSON trace (a cut file can be analysed, not annotated)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise FormatError(path, "no 'traceEvents' list", "annotate needs a Kineto (PyTorch profiler) JSON trace")
    return doc


def _usable(e: Any) -> bool:
    """What the Kineto parser decodes as an event: an object (args that are not an object are dropped, the event kept)."""
    return isinstance(e, dict)


def numbering(events: list) -> tuple[np.ndarray, np.ndarray]:
    """Indices into `events` of the device activities (position = kernel_id) and of the ops (position = op_id).

    The parser's rules: complete ('X') events; categories in IGNORED_CATS
    dropped; a string name and numeric ts and dur, dur ≥ 0; then the device
    categories, resp. the op categories, in file order.
    """
    idx = [i for i, e in enumerate(events) if _usable(e) and e.get("ph") == "X"]
    xs = [events[i] for i in idx]
    ev = pl.DataFrame(
        {
            "i": pl.Series(idx, dtype=pl.Int64),
            "cat": pl.Series([e.get("cat") for e in xs], dtype=pl.Utf8, strict=False),
            "name": pl.Series([e.get("name") if e.get("name").__class__ is str else None for e in xs], dtype=pl.Utf8),
            "ts": pl.Series([e.get("ts") for e in xs], dtype=pl.Float64, strict=False),
            "dur": pl.Series([e.get("dur") for e in xs], dtype=pl.Float64, strict=False),
        }
    )
    ev = ev.filter(~pl.col("cat").is_in(list(IGNORED_CATS)) | pl.col("cat").is_null())
    ev = ev.filter(pl.col("ts").is_not_null() & pl.col("dur").is_not_null() & pl.col("name").is_not_null() & (pl.col("dur") >= 0))
    kernels = ev.filter(pl.col("cat").is_in(list(KERNEL_CATS)))["i"].to_numpy()
    ops = ev.filter(pl.col("cat").is_in(list(OP_CATS)))["i"].to_numpy()
    return kernels, ops


def _check(events: list, where: np.ndarray, frame: pl.DataFrame, id_col: str, what: str, path: str, check_ts: bool = True) -> None:
    """The analysis is of this trace: same names (and start times) at the same positions.

    Kernel start times are not compared: the analysis trims a kernel that overlaps
    an earlier one on its stream (a profiler artefact), the file keeps it as written.
    """
    if frame.height == 0:
        return
    ids = frame[id_col].to_numpy()
    if ids.max(initial=-1) >= len(where):
        raise FormatError(path, f"the analysis has more {what} than this trace", "annotate a trace with the analysis of that same trace")
    for k, name, ts in frame.select(id_col, "name", "ts").iter_rows():
        e = events[where[k]]
        if e.get("name") != name or (check_ts and float(e.get("ts")) != ts):
            raise FormatError(path, f"{what} {k} is '{e.get('name')}' here but '{name}' in the analysis",
                              "annotate a trace with the analysis of that same trace")


# --- what is added ----------------------------------------------------------------


def _args(e: dict) -> dict:
    """The event's args object, created if absent (args that are not an object are left alone: nothing added)."""
    args = e.get("args")
    if args is None:
        args = e["args"] = {}
    return args if isinstance(args, dict) else {}


def _num(v: Any) -> Any:
    if v is None:
        return None
    f = float(v)
    if math.isnan(f):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _tflops(flops, dur) -> float | None:
    if flops is None or not dur or dur <= 0:
        return None
    return float(flops) / (float(dur) * 1e-6) / 1e12


def _new_pid(events: list) -> int:
    used = {e.get("pid") for e in events if isinstance(e, dict)}
    pid = 0x7FFF0000
    while pid in used or str(pid) in used:
        pid += 1
    return pid


def _meta(pid: int, tid: int, kind: str, value: Any, ts: float) -> dict:
    """A metadata event as Kineto writes them (with ts, and tid 0 for the process)."""
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"ph": "M", "name": kind, "ts": ts, "pid": pid, "tid": tid, "args": {key: value}}


def _kernel_args(a: Analysis, modules: pl.DataFrame | None) -> pl.DataFrame:
    """Per kernel_id: the values added to its args."""
    k = a.kernels.select("kernel_id", "phase", "cls", "flops", "dur", "step", "op_row")
    if modules is not None:
        k = k.join(modules.select(pl.col("row").alias("op_row"), "module"), on="op_row", how="left")
    else:
        k = k.with_columns(module=pl.lit(None, pl.Utf8))
    roof = a.roofline
    if roof is not None and roof.height:
        k = k.join(roof.select("kernel_id", "bound", "intensity", "recoverable_us"), on="kernel_id", how="left")
    else:
        k = k.with_columns(bound=pl.lit(None, pl.Utf8), intensity=pl.lit(None, pl.Float64), recoverable_us=pl.lit(None, pl.Float64))
    return k


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
    t0 = min([x for x in (a.kernels["ts"].min() if a.kernels.height else None, a.ops["ts"].min() if a.ops.height else None) if x is not None],
             default=0.0)
    out: list[dict] = [_meta(pid, 0, "process_name", PROCESS, t0), _meta(pid, 0, "process_sort_index", -1, t0)]
    tid_of: dict[tuple, int] = {}

    def track(key: tuple, label: str, order: int) -> int:
        if key not in tid_of:
            tid = len(tid_of) + 1
            tid_of[key] = tid
            out.append(_meta(pid, tid, "thread_name", label, t0))
            out.append(_meta(pid, tid, "thread_sort_index", order, t0))
        return tid_of[key]

    steps_tid = track(("steps",), "traceflops: steps", 0)
    for s in a.steps.iter_rows(named=True):
        if s.get("start") is None or s.get("window") is None:
            continue
        out.append({
            "ph": "X", "cat": CAT, "name": s["name"], "pid": pid, "tid": steps_tid, "ts": s["start"], "dur": s["window"],
            "args": {"traceflops.mfu": s.get("mfu"), "traceflops.hfu": s.get("hfu"), "traceflops.window_source": s.get("window_source"),
                     "traceflops.last": bool(s.get("last")), "traceflops.loss_budget": s.get("loss_budget")},
        })

    if a.critical_path is not None and a.critical_path.height:
        path_tid = track(("critical path",), "traceflops: critical path", 0)
        for r in a.critical_path.iter_rows(named=True):
            out.append({"ph": "X", "cat": CAT, "name": f"{r['kind']}: {r['name']}", "pid": pid, "tid": path_tid, "ts": r["start"],
                        "dur": r["dur"], "args": {"traceflops.path_kind": r["kind"], "traceflops.step": r["step"]}})

    rate: dict[str, list[tuple[float, float, float]]] = {}
    if a.kernels.height:
        k = a.kernels.select("kernel_id", "name", "phase", "cls", "device", "stream", "ts", "dur", "flops").sort("kernel_id")
        lanes = k.select("device", "stream").unique().sort("device", "stream", nulls_last=True).rows()
        many = len(lanes) > 1
        for r in k.iter_rows(named=True):
            phase = r["phase"] or "other"
            label = f"traceflops: {phase}" + (f" · device {r['device']} stream {r['stream']}" if many else "")
            tid = track((phase, r["device"], r["stream"]), label, 1 + PHASES.index(phase) if phase in PHASES else 9)
            out.append({
                "ph": "X", "cat": CAT, "name": r["name"], "pid": pid, "tid": tid, "ts": r["ts"], "dur": r["dur"],
                "args": {"kernel_id": r["kernel_id"], "traceflops.class": r["cls"], "traceflops.flops": _num(r["flops"]),
                         "device": r["device"], "stream": r["stream"]},
            })
            tf = _tflops(r["flops"], r["dur"])
            if tf is not None:
                rate.setdefault(f"device {r['device']}", []).append((r["ts"], r["dur"], tf))
    else:  # a CPU trace: the executed matmul ops are the compute
        o = a.ops.filter(pl.col("matmul") & pl.col("ran")).select("op_id", "name", "phase", "tid", "ts", "dur", "flops").sort("op_id")
        lanes = o["tid"].unique().sort(nulls_last=True).to_list()
        many = len(lanes) > 1
        for r in o.iter_rows(named=True):
            phase = r["phase"] or "other"
            label = f"traceflops: {phase}" + (f" · thread {r['tid']}" if many else "")
            tid = track((phase, r["tid"]), label, 1 + PHASES.index(phase) if phase in PHASES else 9)
            out.append({
                "ph": "X", "cat": CAT, "name": r["name"], "pid": pid, "tid": tid, "ts": r["ts"], "dur": r["dur"],
                "args": {"op_id": r["op_id"], "traceflops.flops": _num(r["flops"])},
            })
            tf = _tflops(r["flops"], r["dur"])
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
                out.append({"ph": "C", "cat": CAT, "name": f"traceflops: {label}", "pid": pid, "ts": ts, "args": {label: v * 100.0}})
        end = steps.select((pl.col("start") + pl.col("window")).max()).item()
        out.append({"ph": "C", "cat": CAT, "name": f"traceflops: {label}", "pid": pid, "ts": end, "args": {label: 0.0}})
    return out


# --- the whole ----------------------------------------------------------------------


def annotate(trace_path: str, analysis: Analysis, out_path: str, modules: pl.DataFrame | None = None) -> dict[str, Any]:
    """Write the annotated trace to `out_path`; return what was done (counts).

    `modules` (per op `row`: `module`, as `views.rollup.module_of` gives) names each kernel's module.
    """
    if analysis.meta.get("format") == "xplane":
        return annotate_xla(trace_path, analysis, out_path)
    if analysis.meta.get("format") not in (None, "kineto"):
        raise FormatError(trace_path, f"annotating a {analysis.meta.get('format')} trace is not supported", "annotate a Kineto (PyTorch profiler) JSON trace")
    doc = load_document(trace_path)
    events = doc["traceEvents"]
    kern_idx, op_idx = numbering(events)
    _check(events, kern_idx, analysis.kernels, "kernel_id", "device activity", trace_path, check_ts=False)
    _check(events, op_idx, analysis.ops, "op_id", "op", trace_path)
    n_in = len(events)

    # args additions on the input events (the events themselves stay where they are)
    kargs = _kernel_args(analysis, modules) if analysis.kernels.height else None
    if kargs is not None:
        for r in kargs.iter_rows(named=True):
            e = events[kern_idx[r["kernel_id"]]]
            args = _args(e)
            args["traceflops.phase"] = r["phase"]
            args["traceflops.class"] = r["cls"]
            args["traceflops.flops"] = _num(r["flops"])
            args["traceflops.achieved_tflops"] = _tflops(r["flops"], r["dur"])
            args["traceflops.step"] = r["step"]
            for key in ("module", "bound", "intensity", "recoverable_us"):
                if r[key] is not None:
                    args[f"traceflops.{key}"] = r[key]
    ops = analysis.ops.select("op_id", "phase", "matmul", "ran", "flops")
    for op_id, phase, matmul, ran, flops in ops.iter_rows():
        args = _args(events[op_idx[op_id]])
        args["traceflops.phase"] = phase
        if matmul:
            args["traceflops.flops"] = _num(flops)
            args["traceflops.ran"] = bool(ran)

    pid = _new_pid(events)
    new = added_events(analysis, pid)
    events.extend(new)

    doc, redacted = redact_metadata(doc)
    summary = {
        "events_in": n_in,
        "events_added": len(new),
        "kernels_annotated": 0 if kargs is None else kargs.height,
        "ops_annotated": analysis.ops.height,
        "pid": pid,
        "redacted_values": redacted,
    }
    summary = write_redacted(out_path, doc, summary, trace_path,
                             "args prefixed 'traceflops.'; added events are on the 'traceflops' process, category 'traceflops'")
    return {**summary, "path": str(out_path)}


def xla_events(a: Analysis) -> list[dict]:
    """An XLA profile's ops and device activities as trace events, with what traceflops found in their args.

    Processes and threads are numbered in order of first appearance and named
    after the profile's planes and lines.
    """
    events: list[dict] = []
    pids: dict[Any, int] = {}
    tids: dict[tuple, int] = {}
    t0 = min([x for x in (a.kernels["ts"].min() if a.kernels.height else None, a.ops["ts"].min() if a.ops.height else None)
              if x is not None], default=0.0)

    def lane(process: Any, thread: Any) -> tuple[int, int]:
        if process not in pids:
            pids[process] = len(pids) + 1
            events.append(_meta(pids[process], 0, "process_name", str(process), t0))
        key = (process, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == process]) + 1
            events.append(_meta(pids[process], tids[key], "thread_name", str(thread), t0))
        return pids[process], tids[key]

    ops = a.ops.select("op_id", "name", "cat", "pid", "tid", "ts", "dur", "scope", "phase", "matmul", "ran", "flops", "step")
    for r in ops.iter_rows(named=True):
        pid, tid = lane(r["pid"], r["tid"])
        args = {"op_id": r["op_id"], "traceflops.phase": r["phase"], "traceflops.step": r["step"]}
        if r["scope"] is not None:
            args["scope"] = r["scope"]
        if r["matmul"]:
            args["traceflops.flops"] = _num(r["flops"])
            args["traceflops.ran"] = bool(r["ran"])
            args["traceflops.achieved_tflops"] = _tflops(r["flops"], r["dur"])
        events.append({"ph": "X", "cat": r["cat"] or "xla_op", "name": r["name"], "pid": pid, "tid": tid, "ts": r["ts"],
                       "dur": r["dur"], "args": args})
    if a.kernels.height:
        k = a.kernels.select("kernel_id", "name", "kind", "cls", "phase", "device", "stream", "ts", "dur", "flops", "step")
        for r in k.iter_rows(named=True):
            pid, tid = lane(f"device {r['device']}", f"stream {r['stream']}")
            events.append({"ph": "X", "cat": r["kind"] or "kernel", "name": r["name"], "pid": pid, "tid": tid, "ts": r["ts"],
                           "dur": r["dur"], "args": {"kernel_id": r["kernel_id"], "traceflops.phase": r["phase"],
                                                     "traceflops.class": r["cls"], "traceflops.flops": _num(r["flops"]),
                                                     "traceflops.achieved_tflops": _tflops(r["flops"], r["dur"]),
                                                     "traceflops.step": r["step"]}})
    return events


def annotate_xla(trace_path: str, analysis: Analysis, out_path: str) -> dict[str, Any]:
    """An XLA profile has no JSON of its own to keep: a new trace of its ops and device activities, and the same tracks."""
    events = xla_events(analysis)
    n_in = len(events)
    pid = _new_pid(events)
    new = added_events(analysis, pid)
    doc, redacted = redact_metadata({"traceEvents": events + new, "displayTimeUnit": "ms"})
    summary = {"events_in": n_in, "events_added": len(new), "kernels_annotated": analysis.kernels.height,
               "ops_annotated": analysis.ops.height, "pid": pid, "redacted_values": redacted}
    summary = write_redacted(out_path, doc, summary, trace_path, "an XLA profile's ops and device activities; args prefixed 'traceflops.'")
    return {**summary, "path": str(out_path)}


def redact_metadata(doc: dict) -> tuple[dict, int]:
    """The document with its metadata redacted (the keys beside traceEvents, their names included; metadata events' args), and the count.

    The events list is the same object, its metadata events' args replaced in place;
    the top-level keys keep their order around it.
    """
    events = doc["traceEvents"]
    n = 0
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and isinstance(e.get("args"), dict):
            e["args"], m = redact(e["args"])
            n += m
    keys = [k for k in doc if k != "traceflops"]  # a trace annotated before: its record is replaced
    at = keys.index("traceEvents")
    before, m1 = redact({k: doc[k] for k in keys[:at]})
    after, m2 = redact({k: doc[k] for k in keys[at + 1:]})
    return {**before, "traceEvents": events, **after}, n + m1 + m2


def write_redacted(out_path: str, doc: dict, summary: dict[str, Any], trace_path: str, note: str) -> dict[str, Any]:
    """Serialize `doc`, pass every byte through the shape rules, append the `traceflops` record (the final count in it), write.

    The record is added after the pass so it can hold the pass's own count; it holds
    only numbers, the note and the input's file name (itself redacted).
    """
    data, n = redact_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
    name, m = redact_text(Path(str(trace_path)).name)
    summary = {**summary, "redacted_values": summary["redacted_values"] + n + m}
    record = orjson.dumps({"annotated_from": name, **summary, "note": note}, option=orjson.OPT_SERIALIZE_NUMPY)
    write_trace(out_path, data[:-1] + (b',"traceflops":' if len(data) > 2 else b'"traceflops":') + record + b"}")
    return summary


def write_trace(path: str, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename over it; gzipped unless `path` ends in .json."""
    def write(tmp: Path) -> None:
        if Path(path).name.endswith(".json"):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as f:
                f.write(data)
                f.close()
                raw.flush()
                os.fsync(raw.fileno())

    try:
        write_atomic(path, write)
    except OSError as ex:
        raise InputError(str(path), f"cannot write ({ex.strerror or ex})", "check the directory exists and is writable") from None
