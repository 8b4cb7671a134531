"""PyTorch profiler / Kineto chrome-trace JSON → `Trace`: the parse entry, the decode of the events' JSON text, and
the trace built from their tables (the schema and category rules: `kineto_events`; the tables: `kineto_tables`; the
process groups: `process_groups`).

Decodes with a typed msgspec schema that names only the fields the analysis
reads, so no Python dict is built per event and unknown args are skipped in C.
Every field is typed loosely (`Any`) and validated when columns are built: one
badly typed event is counted in `warnings`, it never aborts the decode. So is
an event nested too deeply to decode, an integer beyond 64 bits, a step number
or rank out of range, and the top-level fields are read one by one when they
do not decode together.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import polars as pl

from traceflops.core.memory import return_freed_memory
from traceflops.core.redact import redact
from traceflops.core.trace import (
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    STEPS_SCHEMA,
    Trace,
    Warnings,
    compact,
    thread_order,
    with_null_hints,
)
from traceflops.core.vocab import CUT_FILE, PROFILER_STEP_RE, usable_ranks
from traceflops.parsers.helper import decode_in_order
from traceflops.parsers.helper_start import wanted
from traceflops.parsers.io import max_bytes_default
from traceflops.parsers.jsonstream import (
    MAX_ENTRY_BYTES,
    SEP,
    root_members,
    split_events,
    stream_events,
)
from traceflops.parsers.kineto_events import (
    EVENT_DECODER,
    EVENTS_DECODER,
    HEAD_DECODER,
    PROFILER_RANGES,
    Event,
    Head,
    X,
    kernel_kinds,
)
from traceflops.parsers.kineto_tables import TABLES, split_tables
from traceflops.parsers.process_groups import process_groups

NOT_AN_OBJECT = "traceEvents entries that are not objects (skipped)"
TOO_DEEP = "events nested too deeply to decode (skipped)"
OVERSIZED = f"traceEvents entries longer than {MAX_ENTRY_BYTES >> 20} MiB (skipped unread)"
TRAILING = "bytes after the end of the trace's JSON document (another document or garbage; not read)"
# msgspec refuses nesting deeper than the interpreter's recursion limit with RecursionError, not DecodeError.
UNREADABLE = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)


def decode_block(text: bytes | bytearray, warnings: Warnings) -> dict[str, pl.DataFrame]:
    """The complete events of a JSON array of whole trace entries, as the model's tables.

    An array that does not decode whole is decoded entry by entry, and what
    cannot be read is counted.
    """
    try:
        events = EVENTS_DECODER.decode(text)
        return split_tables([e for e in events if e.__class__ is X], warnings)
    except UNREADABLE:
        pass
    pieces = _decode_pieces(split_events(bytes(text).strip()[1:-1]), warnings)
    return split_tables([e for e in pieces if e.ph == "X"], warnings)


def decode_strict(text: bytes | bytearray) -> tuple[dict[str, pl.DataFrame], Counter] | None:
    """The tables and warning counts of an array that decodes whole, else None (nothing is counted)."""
    with _collector_paused():
        try:
            events = EVENTS_DECODER.decode(text)
        except UNREADABLE:
            return None
        warnings = Warnings()
        return split_tables([e for e in events if e.__class__ is X], warnings), warnings.counts


def decode_counted(text: bytes | bytearray) -> tuple[dict[str, pl.DataFrame], Counter]:
    """`decode_block` with its own warning counts: the form a helper process returns."""
    warnings = Warnings()
    with _collector_paused():
        return decode_block(text, warnings), warnings.counts


def _decode_pieces(pieces: list[bytes], warnings: Warnings) -> list[Event]:
    pieces = [q for q in (_object_only(p.lstrip(SEP), warnings) for p in pieces) if q]
    out = []
    for p in pieces:
        try:
            out.append(EVENT_DECODER.decode(p))
        except RecursionError:
            warnings.add(TOO_DEEP)
        except msgspec.ValidationError:
            try:
                out.append(msgspec.convert(_loose(p), Event))
            except (msgspec.ValidationError, msgspec.DecodeError, TypeError, RecursionError):
                warnings.add("event that is not a chrome-trace object (skipped)")
        except msgspec.DecodeError:
            warnings.add("event that is not valid JSON (skipped)")
    return out


def read_event(piece: bytes) -> Event | None:
    """One traceEvents entry as the parser reads it (its fields, args dropped when they do not fit), or None where
    the parser skips it: what a tool that rewrites the trace numbers, so its ids are the parser's."""
    got = _decode_pieces([piece], Warnings())
    return got[0] if got else None


def _object_only(piece: bytes, warnings: Warnings) -> bytes:
    """An event's bytes from its opening brace; array entries before it that are not objects are counted.

    Entries are counted by their separating commas (a comma inside a string
    would over-count: a warning count, never a number of the report).
    """
    if piece[:1] == b"{" or not piece:
        return piece
    at = piece.find(b"{")
    stray = (piece[:at] if at >= 0 else piece).strip(SEP)
    if stray:
        warnings.add(NOT_AN_OBJECT, stray.count(b",") + 1)
    return piece[at:] if at >= 0 else b""


def _loose(piece: bytes):
    """An event whose args do not fit the typed schema: keep its top-level fields, drop its args."""
    obj = msgspec.json.decode(piece)
    if isinstance(obj, dict) and not isinstance(obj.get("args"), dict):
        obj = {k: v for k, v in obj.items() if k != "args"}
    return obj


def decode_head(head: bytes, warnings: Warnings) -> Head:
    """The top-level fields; when they do not decode together, field by field, each one that fails counted and
    ignored."""
    try:
        return HEAD_DECODER.decode(head)
    except UNREADABLE:
        pass
    kept = []
    for member in root_members(head):
        try:
            HEAD_DECODER.decode(b"{" + member + b"}")
            kept.append(member)
        except UNREADABLE as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else "not valid JSON"
            warnings.add(f"top-level fields beside traceEvents that could not be read ({why}; ignored)")
    try:
        return HEAD_DECODER.decode(b"{" + b",".join(kept) + b"}")
    except UNREADABLE:
        warnings.add("the top-level fields (deviceProperties, distributedInfo) could not be read")
        return Head()


@contextmanager
def _collector_paused():
    """The decode makes millions of short-lived tuples and no reference cycles: a
    collector pass over them cost as much as the decode itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# The file is cut into arrays of about this many bytes. One decoded in this process is kept
# small: its structs (several times its text) stay a few MiB. With 8 MiB arrays a 48 MB rank's
# parse peaked at 52 MiB of Python objects against 18, and its analysis took 34 k minor page
# faults against 10-15 k, in the same CPU time. Arrays for the helper are larger: fewer trips
# through the pipe.
CHUNK = 2 << 20
HELPER_CHUNK = 8 << 20


def parse_kineto(path: str, *, max_bytes: int | None = None, progress=None, chunk: int | None = None) -> Trace:
    """Stream the file in chunks into typed event batches, then columns."""
    with _collector_paused():
        return _parse_kineto(path, max_bytes=max_bytes, progress=progress, chunk=chunk)


def _parse_kineto(path: str, *, max_bytes: int | None, progress, chunk: int | None) -> Trace:
    warnings = Warnings()
    state: list = []
    helper = wanted(path)
    chunk = chunk or (HELPER_CHUNK if helper else CHUNK)

    def arrays(claim) -> Iterator:
        for texts, res in stream_events(
            path, max_bytes or max_bytes_default(), chunk=chunk, progress=progress, claim=claim
        ):
            state[:] = [res]
            yield from texts

    frames = []
    for tables, counts in decode_in_order(arrays, helper, decode_strict, decode_counted):
        frames.append(tables)
        warnings.counts.update(counts)
    res = state[0]
    head = decode_head(res.head, warnings)
    if res.truncated and res.events_complete:
        warnings.add("the trace ends before its JSON closes, after its events: every event was read")
    elif res.truncated:
        warnings.add(
            f"{CUT_FILE}: the trace ends before its JSON closes; read up to its last complete event (what came "
            "after the cut is not in this report: steps, and device activity recorded after the host ops)"
        )
    warnings.add(NOT_AN_OBJECT, res.stray)
    warnings.add(OVERSIZED, res.oversized)
    warnings.add(TRAILING, res.trailing)
    if res.arrays > 1:
        warnings.add(
            f"the file holds {res.arrays} root-level traceEvents arrays (a merged or rewritten trace): the events of "
            "all were read"
        )
    # The decoded events are gone: their strings and tuples, freed to glibc's heap, handed back before the tables are
    # joined (a 48 MB rank's parse peaked 10 MiB lower, and its analysis 4 MiB).
    return_freed_memory()
    trace = build_trace(frames, head, warnings, source=str(path))
    frames.clear()
    return_freed_memory()
    trace.meta["truncated"] = res.truncated and not res.events_complete
    return trace


def build_trace(parts: list[dict[str, pl.DataFrame]], head: Head, warnings: Warnings, source: str) -> Trace:
    """The chunks' tables joined in file order, numbered, with the head's metadata; `parts` is emptied as it goes."""
    empty = split_tables([], Warnings())
    tables = {}
    for t in TABLES:  # table by table, each chunk's part let go as it is joined: one table is ever held twice
        pieces = [p.pop(t) for p in parts] or [empty[t]]
        # One chunk per column: a gather from a text column of many chunks copies every string it takes (polars 2.1);
        # the analysis gathers kernel names for idle gaps, the critical path and the roofline.
        tables[t] = compact(pl.concat(pieces, how="vertical_relaxed", rechunk=True))
        del pieces
    ops_df = with_null_hints(
        tables["ops"]
        .with_row_index("op_id")
        .with_columns(
            pl.col("op_id").cast(pl.Int64),
            cat=pl.when(pl.col("cat") == "user_annotation").then(pl.lit("user_annotation")).otherwise(pl.lit("cpu_op")),
        )
    )
    ops_df = thread_order(ops_df)  # numbered in file order, stored in thread order: linking then copies nothing
    kernels_df = (
        tables["kernels"]
        .with_row_index("kernel_id")
        .with_columns(
            pl.col("kernel_id").cast(pl.Int64),
            kind=kernel_kinds(pl.col("cat"), tables["kernels"]["name"]),
            device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)),
            stream=pl.coalesce("stream", "tid"),
        )
        .select(list(KERNELS_SCHEMA))
    )
    launches_df = tables["launches"].select(list(LAUNCHES_SCHEMA))
    markers_df = (
        tables["markers"]
        .with_columns(device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)))
        .select(list(MARKERS_SCHEMA))
    )
    del tables
    steps_df = profiler_steps(ops_df, warnings)

    dist = head.distributedInfo if isinstance(head.distributedInfo, dict) else {}
    props = head.deviceProperties if isinstance(head.deviceProperties, list) else []
    rank, world = distributed_ranks(dist, warnings)
    groups = process_groups(dist.get("pg_config"), warnings)
    meta = {
        "format": "kineto",
        "path": source,
        "rank": rank,
        "world_size": world,
        "device_properties": [redact(p)[0] for p in props if isinstance(p, dict)],  # kept in the cache: no secret in it
        "schema_version": head.schemaVersion if isinstance(head.schemaVersion, (int, str)) else None,
    }
    if groups:
        meta["process_groups"] = groups
    ranges = warnings.counts.pop(PROFILER_RANGES, 0)
    if ranges:
        meta["profiler_ranges"] = ranges
    if kernels_df.height and kernels_df["correlation"].null_count():
        warnings.add(
            "device activities without a correlation id cannot be linked to an op",
            kernels_df["correlation"].null_count(),
        )
    return Trace(ops_df, kernels_df, launches_df, markers_df, steps_df, meta, warnings)


def distributed_ranks(dist: dict, warnings: Warnings) -> tuple[int | None, int | None]:
    """The trace's rank and world size from distributedInfo; each None, with a warning, unless usable (`usable_ranks`:
    the same bounds as a summary's and the options')."""
    return usable_ranks(dist.get("rank"), dist.get("world_size"), "distributedInfo", warnings)


def profiler_steps(ops: pl.DataFrame, warnings: Warnings | None = None) -> pl.DataFrame:
    """Host step spans from `ProfilerStep#N` annotations.

    A number beyond 64 bits is no count the profiler wrote (it counts steps
    from 0), so no key for it is faithful: its span is left out, counted, and
    the work inside it is reported under outside_steps.
    """
    found = ops.filter(pl.col("name").str.contains(PROFILER_STEP_RE)).with_columns(
        step=pl.col("name").str.extract(r"#(\d+)$").cast(pl.Int64, strict=False)
    )
    if warnings is not None:
        warnings.add(
            "ProfilerStep spans whose number is beyond 64 bits (left out: their work is outside every step)",
            found["step"].null_count(),
        )
    steps = found.filter(pl.col("step").is_not_null()).select(list(STEPS_SCHEMA)).sort("ts")
    return steps.cast(STEPS_SCHEMA)  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant
