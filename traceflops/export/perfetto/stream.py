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

The input is read as the parser reads it (`parsers.jsonstream.stream_events`)
in two halves. `prepare` needs no analysis: a few MiB of whole entries at a
time are numbered and written to a nameless spool file beside the output,
each numbered entry's place for its args marked; the command runs it in a
worker process beside the analysis (`reader_start.start_reading`). `annotate` then writes
the spool out with the places filled. An entry is written as its own bytes,
its added args inserted before its args object closes (`added.holes`),
unless a rule could change it (`prepare._LITERALS`: an escape, a value or key
the secrets rules may change, a number orjson refuses): only those are
decoded, redacted and re-encoded, so the output reads as the same JSON.
Memory holds one such array and the analysis, never the document. The output
follows the input's key order: the top-level keys before traceEvents (as read
before the events), the events, the added ones, the keys after, the
`traceflops` record. Where the whole head, read at the end, differs from its
part before the events (a key given again after them), the document is written
again from the spool; to standard output, which cannot be taken back, the
events are written once the whole input is read.
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
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.redact import redact_bytes
from traceflops.core.results import Analysis
from traceflops.export.perfetto.added import AFTER, AS_READ, BEFORE, DECODED, kernel_members, op_members
from traceflops.export.perfetto.entries import Numbered, agree
from traceflops.export.perfetto.output import STDOUT, write_output
from traceflops.export.perfetto.prepare import Places, Prepared, prepare, read_records
from traceflops.export.perfetto.prepare_worker import SPOOL_PREFIX, Beside
from traceflops.export.perfetto.redact import head_parts, redact_meta_events, traceflops_record
from traceflops.export.perfetto.tracks import Added, added_events, known_pids, new_pid
from traceflops.export.perfetto.xla import annotate_xla
from traceflops.parsers.io import check_regular

# What annotating reads of an analysis (both formats); `for_annotation` keeps these and lets the rest go.
# With what naming each kernel's module reads (`row`, `parent`, `seq`, `is_node`): it runs on the slimmed analysis.
OP_COLUMNS = (
    "op_id",
    "replayed",  # a graph replay's ops are the analysis' own, not the file's: they are not numbered
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


def annotate(
    trace_path: str,
    analysis: Analysis,
    out_path: str,
    modules: pl.DataFrame | None = None,
    beside: Beside | None = None,
) -> dict[str, Any]:
    """Write the annotated trace to `out_path`; return what was done (counts).

    `modules` (per op `row`: `module`, as `views.rollup.module_of` gives) names each kernel's module.
    `beside` (`reader_start.start_reading`) is the input already being read beside the analysis; without it the
    input is read here, first.
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
            for numbered in (kernels, ops):  # numbered from the first entry on (again, where written again)
                if numbered is not None:
                    numbered.seen = 0
            got: Prepared | None = None
            if beside is None:  # read here, first
                spool = held.enter_context(tempfile.TemporaryFile(dir=tmp.parent, prefix=SPOOL_PREFIX))
                got = prepare(trace_path, spool)
                spool.seek(0)
                records: Iterable[tuple[Places, bytes]] = read_records(spool)
            elif direct:  # written as the worker reads them
                records = beside.follow()
            else:
                got = beside.result()
                records = beside.replay()
            head: list[bytes] = []  # the keys before traceEvents, as written ahead of the events
            # The added events made before the trace's are written (while the worker still reads), with the pid the
            # file's entries leave free as far as the analysis knows; made again if the file's own take it.
            own_pids = analysis.ops["pid"].unique().to_list() if "pid" in analysis.ops.columns else []
            pid = new_pid(known_pids(own_pids))
            new, added = _added(analysis, pid)

            def start() -> None:
                opening = got.head if got is not None else (beside.opening or b"{") + b"[]}"  # type: ignore[union-attr]
                head.append(head_parts(opening)[0])
                out.write(_opening(head[0]))

            written, redacted = _write_events(out, records, kernels, ops, trace_path, start)
            if got is None:
                got = beside.result()  # type: ignore[union-attr]  # direct: read beside
            before, after, n_head, dropped = head_parts(got.head)
            if not head:
                out.write(_opening(before))
            elif head[0] != before:
                raise _Rewrite  # the head read whole differs from its part before the events (a key given twice)
            if new_pid(got.pids) != pid:
                pid = new_pid(got.pids)
                new, added = _added(analysis, pid)
            warnings = list(got.warnings)
            if dropped:
                warnings.append(
                    f"{dropped} top-level fields beside traceEvents that do not decode (nested too deeply, "
                    "a number no double holds, not JSON) left out"
                )
            redacted += got.redacted
            n_new = len(new)
            n_added = _write_added(out, added, written)
            summary = {
                "events_in": got.events_in,
                "events_added": n_new,
                "kernels_annotated": 0 if kernels is None else kernels.frame.height,
                "ops_annotated": ops.frame.height,  # the file's own (a graph replay's are not in it)
                "pid": pid,
                "redacted_values": redacted + n_head + n_added,
                **({"warnings": warnings} if warnings else {}),
            }
            summary, record = traceflops_record(summary, trace_path, note)
            out.write(b"]" + (b"," + after if after else b"") + b',"traceflops":' + record + b"}")
            return summary

    # Into the output as the records come, the head's part before the events as first read; to standard output
    # (which cannot be taken back), or where the whole head turns out to differ, once every record is read.
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


# Up to this many added events are made ahead, as text (about 300 bytes each); more are made as they are written.
AHEAD = 400_000


def _added(a: Analysis, pid: int, batch: int = 8192) -> tuple[Added, Iterable[tuple[bytes, int]]]:
    """The added events and their text, batch by batch, each through the shape rules (with how many values those
    replaced; the metadata rules' count comes first): made at once where there are at most `AHEAD`, else as read."""
    new = added_events(a, pid)
    meta = redact_meta_events(new.before) + new.redacted + redact_meta_events(new.after)

    def pieces() -> Iterator[tuple[bytes, int]]:
        yield b"", meta
        yield redact_bytes(orjson.dumps(new.before, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
        free = new.shapes_free()
        for text in new.texts(batch):
            yield (text.encode(), 0) if free else redact_bytes(text.encode())
        yield redact_bytes(orjson.dumps(new.after, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])

    return new, list(pieces()) if len(new) <= AHEAD else pieces()


def _write_added(out: BinaryIO, added: Iterable[tuple[bytes, int]], after_events: bool) -> int:
    """The added events' text written; how many values the rules replaced in them."""
    n, first = 0, not after_events
    for data, m in added:
        n += m
        if data:
            out.write(data if first else b"," + data)
            first = False
    return n


def _write_events(
    out: BinaryIO,
    records: Iterable[tuple[Places, bytes]],
    kernels: Numbered | None,
    ops: Numbered,
    path: str,
    start: Callable[[], None],
) -> tuple[bool, int]:
    """The records written out, each numbered entry given its members (`start()` before the first is written);
    whether any entry was written and how many values the shape rules replaced (in the members, and in the decoded
    entries given them)."""
    written, redacted = False, 0
    for places, text in records:
        data, n = _filled(places, text, kernels, ops, path)
        redacted += n
        if data:
            if not written:
                start()
            if written:
                out.write(b",")  # apart: a copy of the record's text for one byte was 0.1 s on a 476 MB trace
            out.write(data)
            written = True
    if kernels is not None:
        kernels.finish(path)
    ops.finish(path)
    return written, redacted


def _filled(places: Places, text: bytes, kernels: Numbered | None, ops: Numbered, path: str) -> tuple[bytes, int]:
    """One record's text with each place that has an analysis row filled: members inserted, decoded entries given
    their args and the shape rules (those without a row too); the count the shape rules replaced."""
    starts, ends = [], []  # per cut: text[start:end] is replaced by before + body + after
    before: list[bytes] = []
    body: list[bytes] = []
    after: list[bytes] = []
    redacted = 0
    decoded_rows: dict[int, tuple[Numbered, int]] = {}  # a decoded entry's place → (its kind, its row)
    for numbered, lo_place, hi_place in ((kernels, 0, places.kernels), (ops, places.kernels, len(places.form))):
        if numbered is None:
            continue
        slots, part, lo = numbered.slots(hi_place - lo_place)
        if not part.height:
            continue
        at = slots + lo_place  # the places that have a row, in row order
        names = places.names[lo_place:hi_place]
        picked = names if len(slots) == len(names) else [names[j] for j in slots.tolist()]
        agree(picked, places.ts[at].tolist() if numbered.check_ts else None, part, numbered, path)
        form = places.form[at]
        spliced = np.flatnonzero((form != AS_READ) & (form != DECODED))
        members = numbered.members.run(lo, part.height)
        body += members if len(spliced) == len(members) else [members[j] for j in spliced.tolist()]
        forms = form[spliced].tolist()
        before += [BEFORE[f] for f in forms]
        after += [AFTER[f] for f in forms]
        starts.append(places.start[at[spliced]])
        redacted += numbered.members.shaped_at(lo + spliced)
        for j in np.flatnonzero(form == DECODED).tolist():
            decoded_rows[int(at[j])] = (numbered, lo + j)
    ends += starts  # an insertion replaces nothing
    decoded = np.flatnonzero(places.form == DECODED)
    for p in decoded.tolist():
        entry = text[int(places.start[p]) : int(places.end[p])]
        row = decoded_rows.get(p)
        if row is not None:
            numbered, j = row
            d = orjson.loads(entry)
            args = d.get("args")
            if args is None or args.__class__ is dict:  # args that are not an object gain nothing
                if args is None:
                    args = d["args"] = {}
                args.update(orjson.loads(b"{" + numbered.members.run(j, 1)[0] + b"}"))
                redacted += numbered.members.shaped.get(j, 0)
            entry = orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY)
        entry, n = redact_bytes(entry)
        redacted += n
        before.append(b"")
        body.append(entry)
        after.append(b"")
    starts.append(places.start[decoded])
    ends.append(places.end[decoded])
    if not body:
        return text, redacted
    first, last = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(first, kind="stable").tolist()
    pieces: list = [None] * (4 * len(body) + 1)
    pieces[0::4] = [
        text[a:b] for a, b in zip([0, *last[order].tolist()], [*first[order].tolist(), len(text)], strict=True)
    ]  # the text between the cuts
    pieces[1::4] = [before[k] for k in order]
    pieces[2::4] = [body[k] for k in order]
    pieces[3::4] = [after[k] for k in order]
    return b"".join(pieces), redacted
