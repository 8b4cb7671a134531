"""The user's own Kineto trace, annotated with what traceflops found, for Perfetto / chrome://tracing.

`annotate(trace_path, analysis, out_path)` streams the original JSON through and writes it back with:

* every input event kept, in order (those left out are listed below and
  counted), unchanged except that device activities (and ops) gain args:
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

Secrets (rules in `core/redact.py`): annotate never adds one and copies none
the rules find. The other top-level keys are kept (it is the user's own
trace) but redacted by key name and by value shape (`core.redact.redact`:
environments, credential-named keys, URL passwords, secret query parameters,
flags and `KEY=value` pairs, `Bearer` credentials, token-shaped strings), and
so is every decoded event (`core.redact.Redactor`, each distinct string and key
decided once): its name and category by value, its args by key name
(`password`, `secret`, `api_key`, ...) and by value. The parser's trace is
redacted by the same rules (`parsers.parse`), so the analysis' names still
match the written ones. The whole written trace, added events included, then
passes the shape rules (`core.redact.redact_bytes`: URL passwords and known
token shapes), which also reach an entry written through as its bytes. An
entry that does not decode is written through as it was, except a metadata
entry (or bytes that may be one), which is left out and counted: its labels
cannot be redacted by key. A top-level `traceflops` key records what was added
and how many values were redacted.

The output is written atomically (a temporary file beside it, then a rename),
gzipped unless the name ends in plain `.json`, compressed as it is written;
`-` writes plain JSON to standard output.

The input is read as the parser reads it (`parsers.jsonstream.stream_events`):
a few MiB of whole entries at a time are decoded, annotated and written to a
nameless spool file beside the output, so memory holds one such array and the analysis,
never the document. The output is then assembled in the input's key order: the
top-level keys before traceEvents, the events (the spool, then the added ones),
the keys after, the `traceflops` record. Layouts the parser reads are written
as one plain document: a byte-order mark is dropped, two root-level traceEvents
arrays become one (in file order), an entry longer than
`jsonstream.MAX_ENTRY_BYTES` is left out, and an entry that does not decode
(nested too deeply, not JSON) is written through as its bytes, unannotated
(a metadata entry is left out instead, see above); each is counted in the record's `warnings`. A file cut short is refused.

Device activities are matched to `Analysis.kernels` by `kernel_id`, which the
Kineto parser assigns as the order, in the file, of the complete ('X') events
of a device category with a usable name, ts and dur (see
`parsers/kineto.py: event_table, build_trace`); ops likewise by `op_id`.
This module recomputes that numbering with the parser's own rules and checks
names and timestamps agree, so an analysis of another trace is refused.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from operator import methodcaller
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.files import write_file
from traceflops.core.redact import Redactor, redact, redact_bytes, redact_text
from traceflops.core.results import Analysis
from traceflops.core.vocab import PHASES
from traceflops.parsers.io import check_regular, max_bytes_default
from traceflops.parsers.jsonstream import (
    MAX_ENTRY_BYTES,
    REFUSED,
    SEP,
    Claimed,
    StreamResult,
    root_members,
    split_events,
    stream_events,
)
from traceflops.parsers.kineto import IGNORED_CATS, KERNEL_CATS, OP_CATS, read_event

try:  # ISA-L's deflate at level 2: ten times as fast as zlib's level 6 (a tenth of annotate's time), a third larger
    from isal.igzip import GzipFile as GzipWriter
    GZIP_LEVEL = 2
except ImportError:  # a platform without its wheel
    from gzip import GzipFile as GzipWriter
    GZIP_LEVEL = 6

CAT = "traceflops"
STDOUT = "-"  # the output name that writes the annotated trace to standard output
CHUNK = 2 << 20  # input bytes decoded at a time: one array of whole entries is held (its dicts ~10x its text), never the file
PROCESS = "traceflops"


# --- reading and numbering ----------------------------------------------------


# The parser's typed decode refuses nesting deeper than the interpreter's recursion limit, orjson only past 1024 levels:
# this skim (in C, no values built) says where the parser would have skipped an entry.
_SKIM = msgspec.json.Decoder(list[msgspec.Raw])
_UNREADABLE = (orjson.JSONDecodeError, msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _decoded(text: bytes | bytearray) -> list:
    """A JSON array of entries decoded, if both orjson and the parser's decoder read it whole (else it raises)."""
    _SKIM.decode(text)
    return orjson.loads(text)


def _claim(text: bytearray):
    """The stream's proof of a cut: the array decoded whole (no skim first), else REFUSED (the scanner splits it)."""
    try:
        return _decoded(text)
    except _UNREADABLE:
        return REFUSED


class Verbatim(dict):
    """An entry the parser reads but orjson cannot (a number no double holds, in a field the parser skips): numbered
    by the fields the parser read, written through as its own bytes (`raw`), so unannotated."""

    def __init__(self, fields: dict, raw: bytes) -> None:
        super().__init__(fields)
        self.raw = raw


def _entry(piece: bytes):
    """A piece orjson cannot decode: a `Verbatim` where the parser still reads it, else its bytes (numbered as nothing)."""
    ev = read_event(piece)
    if ev is None:
        return piece
    return Verbatim({"ph": ev.ph, "cat": ev.cat, "name": ev.name, "ts": ev.ts, "dur": ev.dur}, piece)


def array_entries(text: bytes | bytearray) -> list:
    """One array of whole traceEvents entries (a `jsonstream.stream_events` text), decoded.

    An array that does not decode whole is split and decoded entry by entry; an
    entry that still does not stays as it was and is written through: its bytes
    where the parser skips it too (nested too deeply, not JSON), numbered as
    nothing; a `Verbatim` where the parser reads it, numbered as the parser does.
    """
    try:
        return _decoded(text)
    except _UNREADABLE:
        pass
    out: list = []
    for piece in split_events(bytes(text).strip()[1:-1]):
        piece = piece.strip(SEP)
        if not piece:
            continue
        try:
            out.extend(_decoded(b"[" + piece + b"]"))
        except _UNREADABLE:
            out.append(_entry(piece))
    return out


def serialized(items: list) -> bytes:
    """The entries as the inside of a JSON array (no brackets), decoded ones as orjson writes them, verbatim ones as they were."""
    if not any(map(_as_read, items)):
        return orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    parts = []
    for kept, run in groupby(items, key=_as_read):
        if kept:
            parts += [x if x.__class__ is bytes else x.raw for x in run]
        else:
            parts.append(orjson.dumps(list(run), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    return b",".join(parts)


_MAYBE_META = re.compile(rb'"M"|\\u')


def _unredactable(x) -> bool:
    """A metadata entry the key rules cannot reach: one the parser read as 'M', or bytes nobody reads that may be one
    (an "M" string, or an escape that could spell it). Written through, its labels would be copied unredacted."""
    if x.__class__ is Verbatim:
        return x.get("ph") == "M"
    return x.__class__ is bytes and _MAYBE_META.search(x) is not None


def _as_read(x) -> bool:
    """An entry written through as it was read (bytes, or a `Verbatim`), not re-serialized."""
    return x.__class__ is bytes or x.__class__ is Verbatim


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


class Numbered:
    """The analysis' rows of one numbered kind (device activities by kernel_id, ops by op_id), sorted by id.

    The trace streams through in arrays; each array holds a run of ids, and its
    rows are one slice of the sorted frame (two binary searches), not a lookup
    in a table of every row.
    """

    def __init__(self, frame: pl.DataFrame, col: str, what: str, check_ts: bool) -> None:
        self.frame = frame.sort(col, maintain_order=True)
        self.ids = self.frame[col].to_numpy()
        self.col, self.what, self.check_ts = col, what, check_ts
        self.seen = 0  # ids numbered so far in the file

    def take(self, events: list, where: np.ndarray, path: str) -> list[tuple[dict, dict]]:
        """The (event, analysis row) pairs of one array whose numbered events are `events[where]`, checked to agree."""
        lo, hi = np.searchsorted(self.ids, [self.seen, self.seen + len(where)])
        part = self.frame.slice(int(lo), int(hi - lo))
        at = where[self.ids[lo:hi] - self.seen]
        self.seen += len(where)
        if part.height == 0:
            return []
        hits = [events[i] for i in at.tolist()]
        _agree(hits, part, self, path)
        return list(zip(hits, part.iter_rows(named=True)))

    def finish(self, path: str) -> None:
        """Every id of the analysis was in the file."""
        if len(self.ids) and int(self.ids[-1]) >= self.seen:
            raise FormatError(path, f"the analysis has more {self.what} than this trace", "annotate a trace with the analysis of that same trace")


def _agree(hits: list[dict], part: pl.DataFrame, kind: Numbered, path: str) -> None:
    """The analysis is of this trace: same names (and start times) at the same positions.

    Kernel start times are not compared: the analysis trims a kernel that overlaps
    an earlier one on its stream (a profiler artefact), the file keeps it as written.
    """
    names = pl.Series([e["name"] for e in hits], dtype=pl.Utf8)
    bad = names.ne_missing(part["name"])
    if kind.check_ts:
        bad = bad | pl.Series([float(e["ts"]) for e in hits], dtype=pl.Float64).ne_missing(part["ts"].cast(pl.Float64))
    if bad.any():
        j = int(bad.arg_true()[0])
        raise FormatError(path, f"{kind.what} {part[kind.col][j]} is '{names[j]}' here but '{part['name'][j]}' in the analysis",
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


_PID = methodcaller("get", "pid")


def used_pids(events: list) -> set:
    """The pids the events use (numbers and strings: a pid written as a list names no process); one C-level map."""
    dicts = [e for e in events if e.__class__ is dict]
    try:
        found = set(map(_PID, dicts))
    except TypeError:  # an unhashable pid
        found = {p for p in map(_PID, dicts) if p.__class__ in (int, str, float)}
    return {p for p in found if p.__class__ in (int, str, float)}


def _new_pid(used: set) -> int:
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
    k = a.kernels.select("kernel_id", "name", "phase", "cls", "flops", "dur", "step", "op_row")
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


# What annotating reads of an analysis (both formats); `for_annotation` keeps these and lets the rest go.
# With what naming each kernel's module reads (`row`, `parent`, `seq`, `is_node`): it runs on the slimmed analysis.
OP_COLUMNS = ("op_id", "row", "parent", "seq", "is_node", "name", "cat", "pid", "tid", "ts", "dur", "scope", "phase", "matmul",
              "ran", "flops", "step")
KERNEL_COLUMNS = ("kernel_id", "name", "kind", "cls", "phase", "device", "stream", "ts", "dur", "flops", "step", "op_row")
ROOFLINE_COLUMNS = ("kernel_id", "bound", "intensity", "recoverable_us")


def for_annotation(a: Analysis) -> Analysis:
    """The analysis with only what `annotate` reads: the trace's own tables, idle gaps and most per-op columns let go.

    The annotated trace is written after the analysis, while it is held: on a
    142 MB trace what annotating never reads was about 90 MB of the command's peak.
    """
    def keep(df: pl.DataFrame | None, cols: tuple[str, ...]) -> pl.DataFrame | None:
        return None if df is None else df.select([c for c in cols if c in df.columns])

    bare = dataclasses.replace(a.trace, **{t: getattr(a.trace, t).clear() for t in ("ops", "kernels", "launches", "markers", "steps")})
    return dataclasses.replace(a, trace=bare, ops=keep(a.ops, OP_COLUMNS), kernels=keep(a.kernels, KERNEL_COLUMNS),
                               roofline=keep(a.roofline, ROOFLINE_COLUMNS), partition=None, idle_gaps=None, launch_stats=None)


def annotate(trace_path: str, analysis: Analysis, out_path: str, modules: pl.DataFrame | None = None) -> dict[str, Any]:
    """Write the annotated trace to `out_path`; return what was done (counts).

    `modules` (per op `row`: `module`, as `views.rollup.module_of` gives) names each kernel's module.
    """
    if analysis.meta.get("format") == "xplane":
        return annotate_xla(trace_path, analysis, out_path)
    if analysis.meta.get("format") not in (None, "kineto"):
        raise FormatError(trace_path, f"annotating a {analysis.meta.get('format')} trace is not supported", "annotate a Kineto (PyTorch profiler) JSON trace")
    check_regular(trace_path)  # an unreadable input is named as such before any output is started
    kernels = Numbered(_kernel_args(analysis, modules), "kernel_id", "device activity", check_ts=False) if analysis.kernels.height else None
    own = analysis.ops.filter(~pl.col("replayed")) if "replayed" in analysis.ops.columns else analysis.ops  # replayed ops are not in the file
    ops = Numbered(own.select("op_id", "name", "ts", "phase", "matmul", "ran", "flops"), "op_id", "op", check_ts=True)
    note = "args prefixed 'traceflops.'; added events are on the 'traceflops' process, category 'traceflops'"

    def fill(out: BinaryIO, tmp: Path) -> dict[str, Any]:
        # Nameless where the system allows (O_TMPFILE): nothing is left beside the output if the process is killed.
        with tempfile.TemporaryFile(dir=tmp.parent, prefix=".traceflops-events-") as spool:
            got = _stream_input(trace_path, spool, kernels, ops)
            pid = _new_pid(got.pids)
            new = added_events(analysis, pid)
            redacted = got.redacted + _redact_meta_events(new)
            before, after, n_head, dropped = _head_parts(got.head)
            if dropped:
                got.warnings.append(f"{dropped} top-level fields beside traceEvents that do not decode (nested too deeply, "
                                    "a number no double holds, not JSON) left out")
            out.write(b"{" + before + (b"," if before else b"") + b'"traceEvents":[')
            spool.seek(0)
            shutil.copyfileobj(spool, out, 1 << 20)
            n_new = len(new)
            n_added = _write_added(out, new, got.written)
            summary = {
                "events_in": got.events_in,
                "events_added": n_new,
                "kernels_annotated": 0 if kernels is None else kernels.frame.height,
                "ops_annotated": analysis.ops.height,
                "pid": pid,
                "redacted_values": redacted + n_head + n_added,
                **({"warnings": got.warnings} if got.warnings else {}),
            }
            summary, record = _record(summary, trace_path, note)
            out.write(b"]" + (b"," + after if after else b"") + b',"traceflops":' + record + b"}")
            return summary

    summary = write_output(out_path, fill)
    return {**summary, "path": str(out_path)}


def _write_added(out: BinaryIO, new: list, after_events: bool, batch: int = 8192) -> int:
    """The added events written batch by batch, each batch's dicts dropped once written (never all serialized at once).

    Returns how many values the shape rules redacted.
    """
    n = 0
    for i in range(0, len(new), batch):
        k = min(batch, len(new) - i)
        data, m = redact_bytes(orjson.dumps(new[i : i + k], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])  # all decoded values
        new[i : i + k] = [None] * k
        n += m
        out.write(b"," + data if i or after_events else data)
    return n


@dataclass
class _Streamed:
    """What streaming the input through found: the pieces of the document the written events do not hold."""

    head: bytes = b""  # the top-level object with "traceEvents": []
    events_in: int = 0  # entries written, in file order
    written: bool = False  # anything written to the spool
    redacted: int = 0  # values redacted in the events (names, categories, args) and by shape in their bytes
    meta_left_out: int = 0  # metadata entries that do not decode (their args cannot be redacted by key)
    pids: set = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


def _stream_input(path: str, spool: BinaryIO, kernels: Numbered | None, ops: Numbered) -> _Streamed:
    """The input's events, array by array: numbered, checked against the analysis, annotated, redacted, written to `spool`.

    Only one array's entries (about CHUNK bytes of the file) are held at a time.
    """
    got = _Streamed()
    unread = 0
    res = None
    rules = Redactor()  # one for the whole file: each distinct name, key and value decided once
    for texts, res in stream_events(path, max_bytes_default(), chunk=CHUNK, claim=_claim):
        for text in texts:
            items = text.value if text.__class__ is Claimed else array_entries(text)
            for e in items:  # before numbering: the analysis holds the parser's names, redacted by the same rules
                if isinstance(e, dict):
                    rules.event(e)
            kern_at, op_at = numbering(items)
            if kernels is not None:
                for e, r in kernels.take(items, kern_at, path):
                    _add_kernel_args(e, r)
            for e, r in ops.take(items, op_at, path):
                _add_op_args(e, r)
            got.pids |= used_pids(items)
            got.events_in += len(items)
            if any(map(_as_read, items)):
                kept = [x for x in items if not _unredactable(x)]
                got.meta_left_out += len(items) - len(kept)
                items = kept
                unread += sum(map(_as_read, items))
            data, n = redact_bytes(serialized(items))
            got.redacted += n
            if data:
                spool.write(b"," + data if got.written else data)
                got.written = True
    got.redacted += rules.count
    if res is None or res.truncated:
        raise FormatError(path, "not a complete JSON document (it ends before its JSON closes)",
                          "annotate needs a whole Kineto (PyTorch profiler) JSON trace (a cut file can be analysed, not annotated)")
    if kernels is not None:
        kernels.finish(path)
    ops.finish(path)
    got.head = res.head
    got.warnings = _stream_warnings(res, unread, got.meta_left_out)
    return got


def _stream_warnings(res: StreamResult, unread: int, meta_left_out: int) -> list[str]:
    """What of the input is not in the output as decoded events, each counted (the parser counts the same in its warnings)."""
    out = []
    if res.arrays > 1:
        out.append(f"the file holds {res.arrays} root-level traceEvents arrays (a merged or rewritten trace): written as one, in file order")
    if res.trailing:
        out.append(f"{res.trailing} bytes after the end of the trace's JSON document left out (not read, as the parser does)")
    if res.oversized:
        out.append(f"{res.oversized} traceEvents entries longer than {MAX_ENTRY_BYTES >> 20} MiB left out (skipped unread, as the parser does)")
    if res.stray:
        out.append(f"{res.stray} traceEvents entries after the last object that are not objects left out")
    if unread:
        out.append(f"{unread} traceEvents entries that do not decode (nested too deeply, a number no double holds, not JSON) "
                   "written through unchanged, unannotated")
    if meta_left_out:
        out.append(f"{meta_left_out} metadata ('M') entries that do not decode left out (their labels could not be "
                   "checked for secrets)")
    return out


def _add_kernel_args(e: dict, r: dict) -> None:
    args = _args(e)
    args["traceflops.phase"] = r["phase"]
    args["traceflops.class"] = r["cls"]
    args["traceflops.flops"] = _num(r["flops"])
    args["traceflops.achieved_tflops"] = _tflops(r["flops"], r["dur"])
    args["traceflops.step"] = r["step"]
    for key in ("module", "bound", "intensity", "recoverable_us"):
        if r[key] is not None:
            args[f"traceflops.{key}"] = r[key]


def _add_op_args(e: dict, r: dict) -> None:
    args = _args(e)
    args["traceflops.phase"] = r["phase"]
    if r["matmul"]:
        args["traceflops.flops"] = _num(r["flops"])
        args["traceflops.ran"] = bool(r["ran"])


def _redact_meta_events(events: list) -> int:
    """The args of metadata ('M') events (process and thread labels) redacted in place; how many values were."""
    n = 0
    for e in events:
        if e.__class__ is dict and e.get("ph") == "M" and isinstance(e.get("args"), dict):
            e["args"], m = redact(e["args"])
            n += m
    return n


def _head_parts(head: bytes) -> tuple[bytes, bytes, int, int]:
    """The top-level keys before and after traceEvents, redacted and serialized (each without braces), the count, and the fields left out.

    A previous annotation's `traceflops` record is dropped (`_around_events`).
    A head orjson does not decode whole is read field by field (`jsonstream.root_members`);
    a field it does not decode (nested too deeply, a number no double holds, not JSON) is left out.
    """
    dropped = 0
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        doc = {}
        for member in root_members(head):
            try:
                doc.update(orjson.loads(b"{" + member + b"}"))
            except orjson.JSONDecodeError:
                dropped += 1
    before, after, m = _around_events(doc)
    b, n1 = redact_bytes(orjson.dumps(before, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    a, n2 = redact_bytes(orjson.dumps(after, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    return b, a, m + n1 + n2, dropped


def _around_events(doc: dict) -> tuple[dict, dict, int]:
    """The top-level keys before and after traceEvents, each redacted, and how many values were.

    A previous annotation's `traceflops` record is dropped (a new one is written).
    """
    keys = [k for k in doc if k != "traceflops"]
    at = keys.index("traceEvents") if "traceEvents" in keys else len(keys)
    before, m1 = redact({k: doc[k] for k in keys[:at]})
    after, m2 = redact({k: doc[k] for k in keys[at + 1:]})
    return before, after, m1 + m2


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
    pid = _new_pid(used_pids(events))
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
    n = _redact_meta_events(events)
    before, after, m = _around_events(doc)
    return {**before, "traceEvents": events, **after}, n + m


def _record(summary: dict[str, Any], trace_path: str, note: str) -> tuple[dict[str, Any], bytes]:
    """The `traceflops` record, serialized, and the summary with the file name's own redactions counted.

    It holds only numbers, the note, warnings of our own and the input's file name (itself redacted).
    """
    name, m = redact_text(Path(str(trace_path)).name)
    summary = {**summary, "redacted_values": summary["redacted_values"] + m}
    return summary, orjson.dumps({"annotated_from": name, **summary, "note": note}, option=orjson.OPT_SERIALIZE_NUMPY)


def write_redacted(out_path: str, doc: dict, summary: dict[str, Any], trace_path: str, note: str) -> dict[str, Any]:
    """Serialize `doc`, pass every byte through the shape rules, append the `traceflops` record (the final count in it), write.

    The record is added after the pass so it can hold the pass's own count.
    """
    data, n = redact_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
    summary, record = _record({**summary, "redacted_values": summary["redacted_values"] + n}, trace_path, note)
    body = data[:-1] + (b',"traceflops":' if len(data) > 2 else b'"traceflops":') + record + b"}"
    write_output(out_path, lambda out, tmp: out.write(body))
    return summary


def write_output(path: str, fill: Callable[[BinaryIO, Path], Any]) -> Any:
    """`fill(out, tmp)` writes the trace into a temporary file beside `path`, which then replaces it; what `fill` returned.

    Gzipped unless `path` ends in .json, compressed as `fill` writes it.
    `tmp` is that file's path, for scratch files beside it.
    `path` "-" (`STDOUT`) is standard output: plain JSON (for a pipe: `jq`, `gzip`), scratch files in the temporary folder.
    """
    if str(path) == STDOUT:
        sys.stdout.flush()
        done = fill(sys.stdout.buffer, Path(tempfile.gettempdir()) / STDOUT)
        sys.stdout.buffer.flush()
        return done

    def write(raw) -> Any:
        tmp = Path(raw.name)
        if Path(path).name.endswith(".json"):
            result = fill(raw, tmp)
        else:
            with GzipWriter(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as f:
                result = fill(f, tmp)
        raw.flush()
        os.fsync(raw.fileno())
        return result

    return write_file(path, write)  # the one writer: a failed write is exit 2 naming the path
