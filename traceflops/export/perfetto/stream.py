"""`annotate`: the user's own Kineto trace streamed through and written back with traceflops' args, in bounded memory.

Every input event is kept, in order (those left out are counted in the
record's `warnings`), unchanged except that device activities (and ops) gain args:

* device activity (kernel, memcpy, memset): `traceflops.phase`,
  `traceflops.class` (matmul | other_compute | communication | memcpy |
  memset), `traceflops.flops` (null when unknown or not a matmul),
  `traceflops.achieved_tflops` (its FLOPs over its duration), `traceflops.step`,
  and, where known, `traceflops.module`, `traceflops.bound`,
  `traceflops.intensity` (FLOP/byte), `traceflops.recoverable_us`;
* op (cpu_op, user_annotation): `traceflops.phase`; matmul-class ops also
  `traceflops.flops` and `traceflops.ran`.

The input is read as the parser reads it (`parsers.jsonstream.stream_events`):
a few MiB of whole entries at a time are numbered, annotated and written out.
An entry is written as its own bytes, its added args spliced in before its args
object closes (`added`; a whole array in column operations where nothing in it
needs decoding), unless a rule could change it (`_LITERALS`: an escape, a value
or key the secrets rules may change, a number orjson refuses): only those are
decoded, redacted and re-encoded, so the output reads as the same JSON.
Memory holds one such array and the analysis, never the document. The output
follows the input's key order: the top-level keys before traceEvents (written
as read before the events), the events, the added ones, the keys after, the
`traceflops` record. Where the whole head, read at the end, differs from its
part before the events (a key given again after them), and for standard
output, the events go through a nameless spool file beside the output first.
Layouts the parser reads are written as one plain document: a byte-order mark
is dropped, two root-level traceEvents arrays become one (in file order), an
entry longer than `jsonstream.MAX_ENTRY_BYTES`
is left out, and an entry that does not decode (nested too deeply, not JSON)
is written through as its bytes, unannotated (a metadata entry is left out
instead, see `redact`); each is counted in the record's `warnings`. A file cut
short is refused.
An XLA profile is handed to `xla`.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.redact import MAY_CHANGE_LITERALS, Redactor, redact_bytes
from traceflops.core.results import Analysis
from traceflops.export.perfetto.added import kernel_members, op_members, opening, splice
from traceflops.export.perfetto.entries import (
    Numbered,
    Parts,
    agree,
    array_entries,
    as_read,
    claim_parts,
    numbering,
    positions,
    serialized,
    unredactable,
)
from traceflops.export.perfetto.output import STDOUT, write_output
from traceflops.export.perfetto.redact import (
    PlainKeys,
    head_parts,
    redact_meta_events,
    traceflops_record,
)
from traceflops.export.perfetto.tracks import (
    Added,
    added_events,
    known_pids,
    new_pid,
    num,
    tflops,
    used_pids,
)
from traceflops.export.perfetto.xla import annotate_xla
from traceflops.parsers.io import check_regular, max_bytes_default
from traceflops.parsers.jsonstream import (
    MAX_ENTRY_BYTES,
    REFUSED,
    Claimed,
    StreamResult,
    stream_events,
)

SPOOL_PREFIX = ".traceflops-events-"
CHUNK = (
    2 << 20
)  # input bytes decoded at a time: one array of whole entries is held (its dicts ~10x its text), never the file


# What annotating reads of an analysis (both formats); `for_annotation` keeps these and lets the rest go.
# With what naming each kernel's module reads (`row`, `parent`, `seq`, `is_node`): it runs on the slimmed analysis.
OP_COLUMNS = (
    "op_id",
    "row",
    "parent",
    "seq",
    "is_node",
    "name",
    "cat",
    "pid",
    "tid",
    "ts",
    "dur",
    "scope",
    "phase",
    "matmul",
    "ran",
    "flops",
    "step",
)
KERNEL_COLUMNS = (
    "kernel_id",
    "name",
    "kind",
    "cls",
    "phase",
    "device",
    "stream",
    "ts",
    "dur",
    "flops",
    "step",
    "op_row",
)
ROOFLINE_COLUMNS = ("kernel_id", "bound", "intensity", "recoverable_us")


def for_annotation(a: Analysis) -> Analysis:
    """The analysis with only what `annotate` reads: the trace's own tables, idle gaps and most per-op columns let go.

    The annotated trace is written after the analysis, while it is held: on a
    142 MB trace what annotating never reads was about 90 MB of the command's peak.
    """

    def keep(df: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
        return df.select([c for c in cols if c in df.columns])

    bare = dataclasses.replace(
        a.trace, **{t: getattr(a.trace, t).clear() for t in ("ops", "kernels", "launches", "markers", "steps")}
    )
    return dataclasses.replace(
        a,
        trace=bare,
        ops=keep(a.ops, OP_COLUMNS),
        kernels=keep(a.kernels, KERNEL_COLUMNS),
        roofline=None if a.roofline is None else keep(a.roofline, ROOFLINE_COLUMNS),
        partition=None,
        idle_gaps=None,
        launch_stats=None,
    )


def annotate(trace_path: str, analysis: Analysis, out_path: str, modules: pl.DataFrame | None = None) -> dict[str, Any]:
    """Write the annotated trace to `out_path`; return what was done (counts).

    `modules` (per op `row`: `module`, as `views.rollup.module_of` gives) names each kernel's module.
    """
    if analysis.meta.get("format") == "xplane":
        return annotate_xla(trace_path, analysis, out_path)
    if analysis.meta.get("format") not in (None, "kineto"):
        raise FormatError(
            trace_path,
            f"annotating a {analysis.meta.get('format')} trace is not supported",
            "annotate a Kineto (PyTorch profiler) JSON trace",
        )
    check_regular(trace_path)  # an unreadable input is named as such before any output is started
    kernels = (
        Numbered(_kernel_args(analysis, modules), "kernel_id", "device activity", check_ts=False)
        if analysis.kernels.height
        else None
    )
    own = (
        analysis.ops.filter(~pl.col("replayed")) if "replayed" in analysis.ops.columns else analysis.ops
    )  # replayed ops are not in the file
    ops = Numbered(own.select("op_id", "name", "ts", "phase", "matmul", "ran", "flops"), "op_id", "op", check_ts=True)
    ops.members = op_members(ops.frame)
    if kernels is not None:
        kernels.members = kernel_members(kernels.frame)
    note = "args prefixed 'traceflops.'; added events are on the 'traceflops' process, category 'traceflops'"

    def fill(out: BinaryIO, tmp: Path, direct: bool) -> dict[str, Any]:
        with ExitStack() as held:
            # Nameless where the system allows (O_TMPFILE): nothing is left beside the output if the process is killed.
            spool = None if direct else held.enter_context(tempfile.TemporaryFile(dir=tmp.parent, prefix=SPOOL_PREFIX))
            written: list[bytes] = []  # the keys before traceEvents, once written ahead of the events

            def start(res: StreamResult) -> None:
                written.append(head_parts((res.opening or b"{") + b"[]}")[0])
                out.write(_opening(written[0]))

            got = _stream_input(trace_path, spool or out, kernels, ops, None if spool else start)
            pid = new_pid(got.pids)
            new = added_events(analysis, pid)
            redacted = got.redacted + redact_meta_events(new.before) + new.redacted + redact_meta_events(new.after)
            before, after, n_head, dropped = head_parts(got.head)
            if dropped:
                got.warnings.append(
                    f"{dropped} top-level fields beside traceEvents that do not decode (nested too deeply, "
                    "a number no double holds, not JSON) left out"
                )
            if spool is not None:
                out.write(_opening(before))
                spool.seek(0)
                shutil.copyfileobj(spool, out, 1 << 20)
            elif not written:
                out.write(_opening(before))
            elif written[0] != before:
                raise _Rewrite  # the head read whole differs from its part before the events (a key given twice)
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
            summary, record = traceflops_record(summary, trace_path, note)
            out.write(b"]" + (b"," + after if after else b"") + b',"traceflops":' + record + b"}")
            return summary

    # Into the output directly, the head's part before the events written as it is read; to standard output (which
    # cannot be taken back), or where the whole head turns out to differ, through a spool file.
    try:
        summary = write_output(out_path, lambda out, tmp: fill(out, tmp, direct=str(out_path) != STDOUT))
    except _Rewrite:
        summary = write_output(out_path, lambda out, tmp: fill(out, tmp, direct=False))
    return {**summary, "path": str(out_path)}


class _Rewrite(Exception):
    """The events were written after a head that the whole head read at the end does not match: written again."""


def _opening(before: bytes) -> bytes:
    return b"{" + before + (b"," if before else b"") + b'"traceEvents":['


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
        k = k.with_columns(
            bound=pl.lit(None, pl.Utf8), intensity=pl.lit(None, pl.Float64), recoverable_us=pl.lit(None, pl.Float64)
        )
    return k


def _write_added(out: BinaryIO, new: Added, after_events: bool, batch: int = 8192) -> int:
    """The added events written batch by batch (never all serialized at once), each through the shape rules.

    Returns how many values the shape rules redacted.
    """
    n, first = 0, not after_events

    def write(data: bytes) -> None:
        nonlocal n, first
        if data:
            data, m = redact_bytes(data)  # all decoded values
            n += m
            out.write(data if first else b"," + data)
            first = False

    write(orjson.dumps(new.before, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    for text in new.texts(batch):
        write(text.encode())
    write(orjson.dumps(new.after, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
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


def _stream_input(
    path: str, spool: BinaryIO, kernels: Numbered | None, ops: Numbered, start: Callable[[StreamResult], None] | None
) -> _Streamed:
    """The input's events, array by array: numbered, checked against the analysis, annotated, redacted, written to
    `spool`; `start(result)`, if given, before the first is written.

    Only one array's entries (about CHUNK bytes of the file) are held at a time.
    """
    got = _Streamed()
    unread = 0
    res: StreamResult | None = None
    rules = Redactor()  # one for the whole file: each distinct name, key and value decided once
    keys = PlainKeys()  # the plain args keys met so far

    def emit(data: bytes, result: StreamResult) -> None:
        if data:
            if start is not None and not got.written:
                start(result)
            spool.write(b"," + data if got.written else data)
            got.written = True

    for texts, result in stream_events(path, max_bytes_default(), chunk=CHUNK, claim=claim_parts):
        res = result  # the last one is the whole stream's, read after the loop
        for text in texts:
            # an array the scanner cut (the file's tail, an odd layout) is claimed here as the stream claims the others
            parts = text.value if text.__class__ is Claimed else claim_parts(text)
            if parts is not REFUSED:
                data = _as_written(parts, got, rules, keys, kernels, ops, path)
                if data is not None:
                    emit(data, result)
                    continue
                text = parts.text  # read the decoded way, as a whole
            items = array_entries(text)
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
            if any(map(as_read, items)):
                kept = [x for x in items if not unredactable(x)]
                got.meta_left_out += len(items) - len(kept)
                items = kept
                unread += sum(map(as_read, items))
            data, n = redact_bytes(serialized(items))
            got.redacted += n
            emit(data, result)
    got.redacted += rules.count
    if res is None or res.truncated:
        raise FormatError(
            path,
            "not a complete JSON document (it ends before its JSON closes)",
            "annotate needs a whole Kineto (PyTorch profiler) JSON trace (a cut file can be analysed, not annotated)",
        )
    if kernels is not None:
        kernels.finish(path)
    ops.finish(path)
    got.head = res.head
    got.warnings = _stream_warnings(res, unread, got.meta_left_out)
    return got


# An entry is written as its bytes (its added args spliced in, `added.opening`) unless decoding and re-encoding it
# could change it: then it is decoded, redacted and re-encoded as `serialized` writes it. Looked for in the whole
# array first (one scan in native code), entry by entry only where found: an escape (the decoded text is not the
# bytes, and the shape rules read the decoded text); text other than ASCII; any literal of `MAY_CHANGE` (a value the
# secrets rules may change, a shape `redact_bytes` may: each rule starts with one); args of an earlier annotation
# (overwritten in place); a number orjson refuses (an exponent, or 309 digits: digits are all read as '0'); args
# that are not objects of plain keys (`redact.PlainKeys`) or that nest an object.
_LITERALS = ["\\", "traceflops.", *MAY_CHANGE_LITERALS, "0e"]
_LONG = b"0" * 309  # a number no double holds, its digits read as '0' (a separate search: Aho-Corasick slows on it)
_DIGITS = bytes.maketrans(b"123456789", b"000000000")


def _literal(texts: list[bytes | bytearray]) -> pl.Series:
    """Per text, whether it holds anything but ASCII, 309 digits in a row or one of `_LITERALS` (any ASCII case,
    digits read as '0')."""
    shown = [t.translate(_DIGITS) for t in texts]
    plain = [t.isascii() and _LONG not in t for t in shown]
    found = pl.Series([t.decode() if a else "" for t, a in zip(shown, plain)], dtype=pl.Utf8).str.contains_any(
        _LITERALS, ascii_case_insensitive=True
    )
    return found | ~pl.Series(plain, dtype=pl.Boolean)


def _decode_first(p: Parts, keys: PlainKeys) -> list[int] | None:
    """The entries of `p` to decode before writing (see `_LITERALS`); None where its text is not UTF-8 throughout
    (the array is read the decoded way)."""
    if not p.text.isascii():  # ASCII is UTF-8: only other text is decoded to check
        try:
            p.text.decode()
        except UnicodeDecodeError:
            return None
    args = list(filter(None, (f.args for f in p.fields)))
    joined = b",".join(args)
    if not _literal([p.text]).item() and joined.count(b"{") == len(args) and keys.plain(b"[" + joined + b"]"):
        return []
    hit = _literal([bytes(r) for r in p.raws])
    for i, f in enumerate(p.fields):
        a = bytes(f.args)
        if a and not hit[i] and (a.count(b"{") != 1 or not keys.plain(b"[" + a + b"]")):
            hit[i] = True
    return hit.arg_true().to_list()


def _as_written(
    p: Parts, got: _Streamed, rules: Redactor, keys: PlainKeys, kernels: Numbered | None, ops: Numbered, path: str
) -> bytes | None:
    """One proven array as written: most entries as their bytes, the annotated ones with their args spliced in, and
    only those a rule could change (`_DECODE_FIRST`) or whose args cannot be spliced decoded, annotated,
    redacted and re-encoded as `serialized` does. None where the array is to be read the decoded way instead (a
    ts or dur numbering's casts decide, text that is not UTF-8, an entry orjson refuses), before anything of it is
    counted or numbered."""
    found = positions(p.fields)
    first = None if found is None else _decode_first(p, keys)
    if found is None or first is None:
        return None
    if not first and p.text.isascii():
        data = _spliced(p, found, got, kernels, ops, path)
        if data is not None:
            return data
    raws, fields = p.raws, p.fields
    decoded: dict[int, dict] = {}
    cut: dict[int, tuple[bytes, bytes]] = {}
    try:
        for i in first:
            decoded[i] = orjson.loads(memoryview(raws[i]))
        for i in found[0] + found[1]:
            if i not in decoded:
                a = fields[i].args
                where = opening(bytes(raws[i]), bytes(a) if len(a) else None)
                if where is None:
                    decoded[i] = orjson.loads(memoryview(raws[i]))
                else:
                    cut[i] = where
    except orjson.JSONDecodeError:
        return None
    for d in decoded.values():
        rules.event(d)
    got.pids |= used_pids(list(decoded.values())) | _pids(fields)
    got.events_in += len(raws)
    pieces: list = list(raws)
    for numbered, at in ((kernels, found[0]), (ops, found[1])):
        if numbered is None:
            continue
        idx, part, lo = numbered.rows(at)
        if not idx:
            continue
        names = [decoded[i]["name"] if i in decoded else fields[i].name for i in idx]
        agree(names, [fields[i].ts for i in idx] if numbered.check_ts else None, part, numbered, path)
        run = numbered.members.run(lo, len(idx))
        for j, i in enumerate(idx, lo):
            m = run[j - lo]
            if i in cut:
                before, after = cut[i]
                pieces[i] = before + m + after
            else:
                args = decoded[i].get("args")
                if args is None or args.__class__ is dict:  # args that are not an object gain nothing (`_args`)
                    _args(decoded[i]).update(orjson.loads(b"{" + m + b"}"))
                else:
                    continue
            got.redacted += numbered.members.shaped.get(j, 0)
    for i, d in decoded.items():
        pieces[i], n = redact_bytes(orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY))
        got.redacted += n
    return b",".join(pieces)


def _spliced(
    p: Parts, found: tuple[list[int], list[int]], got: _Streamed, kernels: Numbered | None, ops: Numbered, path: str
) -> bytes | None:
    """`_as_written` of an array no rule can change (ASCII, nothing to decode first) in column operations: each
    numbered entry's members inserted by `added.splice`. None, with nothing counted or numbered, where an entry's
    args cannot take them (the entry by entry route decodes that one)."""
    at = found[0] + found[1]
    fields = p.fields
    members = pl.repeat(None, len(at), dtype=pl.Utf8, eager=True)
    shaped, start, seen = 0, 0, [(n, n.seen) for n in (kernels, ops) if n is not None]
    for numbered, where in ((kernels, found[0]), (ops, found[1])):
        if numbered is None:
            continue
        slots, part, lo = numbered.slots(len(where))
        if part.height:
            idx = [where[j] for j in slots.tolist()]
            ts = [fields[i].ts for i in idx] if numbered.check_ts else None
            agree([fields[i].name for i in idx], ts, part, numbered, path)
            column, n = numbered.members.column(lo, part.height)
            members = members.scatter(slots + start, column)
            shaped += n
        start += len(where)
    entries = pl.Series(list(map(bytes, p.raws)), dtype=pl.Binary).cast(pl.Utf8)
    args = pl.Series([bytes(fields[i].args) or None for i in at], dtype=pl.Binary).cast(pl.Utf8)
    fits, text = splice(pl.col("e"), pl.col("a"), pl.col("m"))
    out = pl.DataFrame({"e": entries.gather(at), "a": args, "m": members}).select(fits.alias("fits"), text)
    if not out["fits"].all():
        for numbered, before in seen:
            numbered.seen = before
        return None
    got.events_in += len(p.raws)
    got.pids |= _pids(fields)
    got.redacted += shaped
    return entries.scatter(at, out["e"]).str.join(",").item().encode()


def _pids(fields: list) -> set:
    """The pids the entries name, so the added process takes none of them."""
    return known_pids(list(map(_PID_OF, fields)))


_PID_OF = attrgetter("pid")


def _stream_warnings(res: StreamResult, unread: int, meta_left_out: int) -> list[str]:
    """What of the input is not in the output as decoded events, each counted (the parser counts the same in its
    warnings)."""
    out = []
    if res.arrays > 1:
        out.append(
            f"the file holds {res.arrays} root-level traceEvents arrays (a merged or rewritten trace): written as one, "
            "in file order"
        )
    if res.trailing:
        out.append(
            f"{res.trailing} bytes after the end of the trace's JSON document left out (not read, as the parser does)"
        )
    if res.oversized:
        out.append(
            f"{res.oversized} traceEvents entries longer than {MAX_ENTRY_BYTES >> 20} MiB left out (skipped unread, as "
            "the parser does)"
        )
    if res.stray:
        out.append(f"{res.stray} traceEvents entries after the last object that are not objects left out")
    if unread:
        out.append(
            f"{unread} traceEvents entries that do not decode (nested too deeply, a number no double holds, not JSON) "
            "written through unchanged, unannotated"
        )
    if meta_left_out:
        out.append(
            f"{meta_left_out} metadata ('M') entries that do not decode left out (their labels could not be "
            "checked for secrets)"
        )
    return out


def _args(e: dict) -> dict:
    """The event's args object, created if absent (args that are not an object are left alone: nothing added)."""
    args = e.get("args")
    if args is None:
        args = e["args"] = {}
    return args if isinstance(args, dict) else {}


def _add_kernel_args(e: dict, r: dict) -> None:
    args = _args(e)
    args["traceflops.phase"] = r["phase"]
    args["traceflops.class"] = r["cls"]
    args["traceflops.flops"] = num(r["flops"])
    args["traceflops.achieved_tflops"] = tflops(r["flops"], r["dur"])
    args["traceflops.step"] = r["step"]
    for key in ("module", "bound", "intensity", "recoverable_us"):
        if r[key] is not None:
            args[f"traceflops.{key}"] = r[key]


def _add_op_args(e: dict, r: dict) -> None:
    args = _args(e)
    args["traceflops.phase"] = r["phase"]
    if r["matmul"]:
        args["traceflops.flops"] = num(r["flops"])
        args["traceflops.ran"] = bool(r["ran"])
