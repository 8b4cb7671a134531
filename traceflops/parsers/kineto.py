"""PyTorch profiler / Kineto chrome-trace JSON → `Trace`.

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
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import compress, repeat
from operator import attrgetter, eq, is_
from typing import Any, Union

import msgspec
import orjson
import polars as pl

from traceflops.core.memory import return_freed_memory
from traceflops.core.redact import redact
from traceflops.core.trace import (
    COLLECTIVE_COLUMNS,
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    STEPS_SCHEMA,
    Trace,
    Warnings,
    compact,
    name_matches,
    null_column,
    thread_order,
    with_null_hints,
)
from traceflops.core.vocab import CUT_FILE, MAX_RANKS, PROFILER_STEP_RE, usable_ranks
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
from traceflops.parsers.values import as_int as _int


class _Args(msgspec.Struct, omit_defaults=True, gc=False):
    ext_id: Any = msgspec.field(default=None, name="External id")
    ext_id_old: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    strides: Any = msgspec.field(default=None, name="Input Strides")
    seq: Any = msgspec.field(default=None, name="Sequence number")
    fwd_tid: Any = msgspec.field(default=None, name="Fwd thread id")
    device: Any = None
    stream: Any = None
    bytes: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    coll_dtype: Any = msgspec.field(default=None, name="dtype")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    coll_seq: Any = msgspec.field(default=None, name="Seq")
    kernel: Any = None  # a runtime launch's kernel name (read to match graph replays with their capture)


# gc=False: millions of small structs that hold no reference cycles; tracking them
# made the garbage collector a third of the decode time.
class _Fields(msgspec.Struct, gc=False):
    """The fields of an event the analysis reads."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _X(_Fields, tag_field="ph", tag="X", gc=False):
    """A complete event, the only phase the analysis reads (the fast path's tagged union)."""


class _Event(_Fields, gc=False):
    """Any event, its phase a field (the entry-by-entry fallback)."""

    ph: Any = None


# Every other chrome-trace phase decodes to an empty struct: its fields are skipped
# unbuilt. Flow and instant events are close to half of a Kineto trace.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
    for i, ph in enumerate(
        ["B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M", "V", "v", "R", "c", "(", ")"]
    )
)


_ARGS = tuple(_Args.__struct_fields__)


_EVENT: Any = Union[(_X, *_OTHER_PHASES)]  # a union of generated structs: built at run time
_EVENTS_DECODER = msgspec.json.Decoder(list[_EVENT])


class _Head(msgspec.Struct):
    """The top-level fields beside traceEvents that the analysis reads."""

    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None


OP_CATS = frozenset({"cpu_op", "Operator", "user_annotation"})
KERNEL_CATS = {
    "kernel": "compute",
    "Kernel": "compute",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime"})
MARKER_CATS = frozenset({"cuda_sync", "gpu_user_annotation"})
# Categories that carry nothing the analysis reads; skipping them is not a loss.
IGNORED_CATS = frozenset(
    {
        "python_function",
        "cpu_instant_event",
        "ac2g",
        "async_cpu_to_gpu",
        "async",
        "fwdbwd",
        "Trace",
        "overhead",
        "Python",
        "python",
        "traceflops",  # our own annotation tracks, when an annotated trace is analysed again
    }
)

# The CUPTI range profiler's events: hardware counters per profiled range (kernel), no timeline. Counted, not analysed.
PROFILER_RANGE_CAT = "cuda_profiler_range"
_PROFILER_RANGES = (
    "\0profiler ranges"  # their count, carried across chunks with the warning counts; build_trace moves it to meta
)

_COMM_RE = re.compile(
    r"(?i)nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce",
    re.IGNORECASE,
)


def kernel_kinds(cat: pl.Expr, names: pl.Series) -> pl.Expr:
    """compute | communication | memcpy | memset, from the category and (for kernels) the name."""
    base = cat.replace_strict(KERNEL_CATS, default=None)
    return (
        pl.when((base == "compute") & pl.lit(name_matches(names, _COMM_RE.pattern)))
        .then(pl.lit("communication"))
        .otherwise(base)
    )


_EVENT_DECODER = msgspec.json.Decoder(_Event)
_HEAD_DECODER = msgspec.json.Decoder(_Head)
NOT_AN_OBJECT = "traceEvents entries that are not objects (skipped)"
TOO_DEEP = "events nested too deeply to decode (skipped)"
OVERSIZED = f"traceEvents entries longer than {MAX_ENTRY_BYTES >> 20} MiB (skipped unread)"
TRAILING = "bytes after the end of the trace's JSON document (another document or garbage; not read)"
# msgspec refuses nesting deeper than the interpreter's recursion limit with RecursionError, not DecodeError.
_UNREADABLE = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)


def decode_block(text: bytes | bytearray, warnings: Warnings) -> dict[str, pl.DataFrame]:
    """The complete events of a JSON array of whole trace entries, as the model's tables.

    An array that does not decode whole is decoded entry by entry, and what
    cannot be read is counted.
    """
    try:
        events = _EVENTS_DECODER.decode(text)
        return split_tables([e for e in events if e.__class__ is _X], warnings)
    except _UNREADABLE:
        pass
    pieces = _decode_pieces(split_events(bytes(text).strip()[1:-1]), warnings)
    return split_tables([e for e in pieces if e.ph == "X"], warnings)


def decode_strict(text: bytes | bytearray) -> tuple[dict[str, pl.DataFrame], Counter] | None:
    """The tables and warning counts of an array that decodes whole, else None (nothing is counted)."""
    with _collector_paused():
        try:
            events = _EVENTS_DECODER.decode(text)
        except _UNREADABLE:
            return None
        warnings = Warnings()
        return split_tables([e for e in events if e.__class__ is _X], warnings), warnings.counts


def decode_counted(text: bytes | bytearray) -> tuple[dict[str, pl.DataFrame], Counter]:
    """`decode_block` with its own warning counts: the form a helper process returns."""
    warnings = Warnings()
    with _collector_paused():
        return decode_block(text, warnings), warnings.counts


def _decode_pieces(pieces: list[bytes], warnings: Warnings) -> list[_Event]:
    pieces = [q for q in (_object_only(p.lstrip(SEP), warnings) for p in pieces) if q]
    out = []
    for p in pieces:
        try:
            out.append(_EVENT_DECODER.decode(p))
        except RecursionError:
            warnings.add(TOO_DEEP)
        except msgspec.ValidationError:
            try:
                out.append(msgspec.convert(_loose(p), _Event))
            except (msgspec.ValidationError, msgspec.DecodeError, TypeError, RecursionError):
                warnings.add("event that is not a chrome-trace object (skipped)")
        except msgspec.DecodeError:
            warnings.add("event that is not valid JSON (skipped)")
    return out


def read_event(piece: bytes) -> _Event | None:
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


def decode_head(head: bytes, warnings: Warnings) -> _Head:
    """The top-level fields; when they do not decode together, field by field, each one that fails counted and
    ignored."""
    try:
        return _HEAD_DECODER.decode(head)
    except _UNREADABLE:
        pass
    kept = []
    for member in root_members(head):
        try:
            _HEAD_DECODER.decode(b"{" + member + b"}")
            kept.append(member)
        except _UNREADABLE as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else "not valid JSON"
            warnings.add(f"top-level fields beside traceEvents that could not be read ({why}; ignored)")
    try:
        return _HEAD_DECODER.decode(b"{" + b",".join(kept) + b"}")
    except _UNREADABLE:
        warnings.add("the top-level fields (deviceProperties, distributedInfo) could not be read")
        return _Head()


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
    trace = build_trace(frames, head, warnings, source=str(path))
    frames.clear()
    return_freed_memory()
    trace.meta["truncated"] = res.truncated and not res.events_complete
    return trace


_EMPTY_ARGS = _Args()


_I64 = 1 << 63


def _scalar(v: Any) -> Any:
    """A value polars can take: lists, objects and integers beyond 64 bits become null."""
    if v.__class__ is int:
        return v if -_I64 <= v < _I64 else None
    return v if v.__class__ in (float, str, bool) else None


def _all_none(values: tuple | list) -> bool:
    # Looks at the first value before counting: counting compares every value with None.
    return not values or (values[0] is None and values.count(None) == len(values))


def _col(values: tuple | list, dtype) -> pl.Series:
    """A typed column from loosely typed trace values; what does not convert becomes null."""
    if _all_none(values):
        return null_column(len(values), dtype)
    try:
        return pl.Series(values, dtype=dtype, strict=False)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([_scalar(v) for v in values], dtype=dtype, strict=False)


def _dumps(v: Any) -> str | None:
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return None  # nesting too deep or integers too large to be shapes


def _json_col(values: tuple | list) -> pl.Series:
    """JSON text of the present values (shapes of ops; absent on the other events)."""
    out: list = [None] * len(values)
    if _all_none(values):
        return pl.Series(out, dtype=pl.Utf8)
    for i, v in enumerate(values):
        if v is not None:
            out[i] = _dumps(v)
    return _str_col(out)


def _text_col(values: tuple | list) -> pl.Series:
    """Identifiers written as integers or strings (pid, tid, stream), as text."""
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    try:
        s = pl.Series(values)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return _col(values, pl.Utf8)
    # Integers cast in one pass: converting value by value was a tenth of the parse.
    return s.cast(pl.Utf8) if s.dtype in (pl.Int64, pl.Utf8) else _col(values, pl.Utf8)


def _str_col(values: tuple | list) -> pl.Series:
    """Strings stay, anything else (a number where a name belongs) becomes null.

    Each distinct string is stored once and rows point at it: kernel names are
    long and repeat thousands of times, and storing each row's copy made them
    most of the parsed trace's memory.
    """
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    index: dict = {}
    try:
        codes = [index.setdefault(v, len(index)) for v in values]
    except TypeError:  # an unhashable value (a list where a name belongs)
        index = {}
        codes = [index.setdefault(v if v.__class__ is str else None, len(index)) for v in values]
    try:
        distinct = pl.Series(list(index), dtype=pl.Utf8)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        distinct = pl.Series([v if v.__class__ is str else None for v in index], dtype=pl.Utf8)
    return distinct.gather(pl.Series(codes, dtype=pl.UInt32))


def _text_or_json_col(values: tuple | list) -> pl.Series:
    """Text as recorded; a list or an object (a newer profiler's `Process Group Ranks`) as its JSON text."""
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    return _str_col([v if v is None or v.__class__ is str else _dumps(v) for v in values])


def _float(values):
    return _col(values, pl.Float64)


def _integer(values):
    return _col(values, pl.Int64)


def _text(values):
    return _col(values, pl.Utf8)


# How each column is built from its values.
_BUILD = {
    "name": _str_col,
    "cat": _text,
    "pid": _text_col,
    "tid": _text_col,
    "ts": _float,
    "dur": _float,
    "ext_id": _integer,
    "correlation": _integer,
    "seq": _integer,
    "fwd_tid": _integer,
    "device": _integer,
    "stream": _text_col,
    "bytes": _integer,
    "collective": _str_col,
    "in_nelems": _integer,
    "out_nelems": _integer,
    "coll_dtype": _str_col,
    "pg_name": _text_col,
    "group_size": _integer,
    "kernel": _str_col,
    "pg_desc": _str_col,
    "pg_ranks": _text_or_json_col,
    "coll_seq": _integer,
    "dims": _json_col,
    "types": _json_col,
    "concrete": _json_col,
    "strides": _json_col,
}
_EVENT_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur")
# Columns whose unread values are counted, and what those values were.
_UNREAD = {_integer: "that are not 64-bit integers", _json_col: "with integers beyond 64 bits or nesting too deep"}
_ARG_NAMES = {
    f: _Args.__struct_encode_fields__[i] for i, f in enumerate(_Args.__struct_fields__)
}  # as the trace spells them
_COLLECTIVE = COLLECTIVE_COLUMNS
# What each table reads; `cat` is kept until bad rows are counted by it.
_COLUMNS = {
    "ops": (*_EVENT_FIELDS, "ext_id", "seq", "fwd_tid", "dims", "types", "concrete", "strides", *_COLLECTIVE),
    "kernels": (*_EVENT_FIELDS, "device", "stream", "correlation", "ext_id", "bytes", *_COLLECTIVE),
    "launches": (*_EVENT_FIELDS, "correlation", "ext_id", "kernel"),
    "markers": ("name", "cat", "pid", "ts", "dur", "device"),
    "unknown": ("name", "cat", "ts", "dur"),
}
_TABLE_OF = (
    {c: "ops" for c in OP_CATS}
    | {c: "kernels" for c in KERNEL_CATS}
    | {c: "launches" for c in RUNTIME_CATS}
    | {c: "markers" for c in MARKER_CATS}
)
TABLES = ("ops", "kernels", "launches", "markers")


def event_table(
    events: list, columns: tuple[str, ...] = tuple(_BUILD), warnings: Warnings | None = None
) -> pl.DataFrame:
    """Complete events as a typed table of `columns`, each built by one C-level map over the events.

    With `warnings`, integer values that could not be read are counted per field.
    """
    data = {}
    rows = [e.args or _EMPTY_ARGS for e in events] if any(c not in _EVENT_FIELDS for c in columns) else []
    for c in columns:
        if c in _EVENT_FIELDS:
            values = tuple(map(attrgetter(c), events))
        else:
            values = tuple(map(attrgetter(c), rows))
            if c == "ext_id":  # traces before 2022 spell it 'external id'
                old = tuple(map(attrgetter("ext_id_old"), rows))
                if not _all_none(old):
                    values = tuple(n if n is not None else o for n, o in zip(values, old))
        data[c] = _BUILD[c](values)
        why = _UNREAD.get(_BUILD[c]) if warnings is not None else None
        if why and warnings is not None:  # values given but not read (C-level counts, no loop over the events)
            warnings.add(
                f"'{_ARG_NAMES.get(c, c)}' values {why} (read as missing)", data[c].null_count() - values.count(None)
            )
    return pl.DataFrame(data)


_GROUP_OF = _TABLE_OF | dict.fromkeys(IGNORED_CATS, "ignored")


def _by_table(events: list) -> tuple[dict[str, list], list]:
    """Events grouped by the table their category feeds, in file order; the unknown apart, the ignored dropped.

    C-level maps and `compress`, no per-event Python: this runs on every event of the trace.
    """
    cats = tuple(map(attrgetter("cat"), events))
    try:
        groups = tuple(map(_GROUP_OF.get, cats))
    except TypeError:  # a category that is not hashable (a list): an unknown one
        groups = tuple(_GROUP_OF.get(c) if c.__class__ is str else None for c in cats)
    out = {t: list(compress(events, map(eq, groups, repeat(t)))) for t in TABLES}
    unknown = list(compress(events, map(is_, groups, repeat(None))))
    return out, unknown


def _usable(df: pl.DataFrame, warnings: Warnings) -> pl.DataFrame:
    """Rows without a numeric ts/dur or a name, or with a negative duration, counted by category and dropped."""
    low = df["dur"].min()
    no_negative = low is None or low >= 0  # type: ignore[operator]  # polars' stub
    if not (df["ts"].null_count() or df["dur"].null_count() or df["name"].null_count()) and no_negative:
        return df  # the usual case, decided without an expression per column
    missing = df["ts"].is_null() | df["dur"].is_null() | df["name"].is_null()
    negative = (df["dur"] < 0).fill_null(False)
    for reason, mask in (
        ("without a numeric ts/dur or a name", missing),
        ("with negative duration", negative & ~missing),
    ):
        for cat, n in df.filter(mask).group_by("cat").len().iter_rows():
            warnings.add(f"'{cat}' events {reason} (skipped)", n)
    return df.filter(~missing & ~negative)


def split_tables(events: list, warnings: Warnings) -> dict[str, pl.DataFrame]:
    """One chunk's complete events as the model's tables (ids are numbered once all are in).

    Done per chunk, and per table with only its columns, so no table of every
    event and every field is ever built.
    """
    groups, unknown = _by_table(events)
    out = {t: _usable(event_table(groups[t], _COLUMNS[t], warnings), warnings) for t in TABLES}
    out["launches"] = out["launches"].drop("cat")
    ranges = [e for e in unknown if PROFILER_RANGE_CAT in (e.cat, e.name)] if unknown else []
    if ranges:
        warnings.add(_PROFILER_RANGES, len(ranges))
        unknown = [e for e in unknown if PROFILER_RANGE_CAT not in (e.cat, e.name)]
    if unknown:
        for cat, n in _usable(event_table(unknown, _COLUMNS["unknown"]), warnings).group_by("cat").len().iter_rows():
            warnings.add(f"events of unknown category '{cat}' not analysed", n)
    return out


def build_trace(parts: list[dict[str, pl.DataFrame]], head: _Head, warnings: Warnings, source: str) -> Trace:
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
    ranges = warnings.counts.pop(_PROFILER_RANGES, 0)
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


MAX_GROUPS = 1 << 14  # process groups read from pg_config (a real job has tens; b200's 71)
MAX_GROUP_TEXT = 256  # characters of a group's name, description or backend
MAX_LISTED_RANKS = 1 << 16  # a group's ranks kept when listed; a longer list keeps only its size


def _group_ranks(v: Any) -> list[int] | None:
    """A group's global ranks: a list of whole numbers in [0, MAX_RANKS), or its JSON text ("[0, 1]"); None
    otherwise."""
    if isinstance(v, str):
        if len(v) > 16 * MAX_LISTED_RANKS:
            return None
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(v, list) or len(v) > MAX_LISTED_RANKS:
        return None
    out = [x for x in map(_int, v) if x is not None and 0 <= x < MAX_RANKS]
    if len(out) != len(v) or len(set(out)) != len(out):
        return None
    return out


def _group_text(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    return v if isinstance(v, str) and 0 < len(v) <= MAX_GROUP_TEXT else None


def process_groups(config: Any, warnings: Warnings) -> list[dict[str, Any]]:
    """The process groups `distributedInfo.pg_config` lists, in its order (the order they were created).

    Each: name, description, size and global ranks; `backend` as configured
    (`cpu:gloo,cuda:gloo`). A list of entries or a mapping of name to entry
    (the flight recorder's form) is read; an entry without a usable name, a
    size outside 1..MAX_RANKS, ranks that are not distinct ranks in range or
    do not number its size is left out, counted in a warning. At most
    MAX_GROUPS are read.
    """
    if isinstance(config, dict):
        config = [
            dict(v, pg_name=v.get("pg_name", v.get("name", k))) if isinstance(v, dict) else v for k, v in config.items()
        ]
    if not isinstance(config, list):
        if config is not None:
            warnings.add("distributedInfo pg_config is not a list of groups (ignored)")
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    bad = 0
    for x in config[:MAX_GROUPS]:
        if not isinstance(x, dict):
            bad += 1
            continue
        name = _group_text(x.get("pg_name"))
        size = _int(x.get("pg_size"))
        ranks = _group_ranks(x.get("ranks"))
        if size is None and ranks:
            size = len(ranks)
        listed = x.get("ranks") not in (None, "", [], "[]")
        if (
            name is None
            or name in seen
            or size is None
            or not 1 <= size <= MAX_RANKS
            or (listed and ranks is None and size <= MAX_LISTED_RANKS)
            or (ranks and len(ranks) != size)
        ):
            bad += 1
            continue
        seen.add(name)
        out.append(
            {
                "name": name,
                "desc": _group_text(x.get("pg_desc")),
                "size": size,
                "ranks": ranks or None,
                "backend": _group_text(x.get("backend_config")),
            }
        )
    warnings.add("distributedInfo pg_config entries without a usable name, size or ranks (ignored)", bad)
    warnings.add(
        f"distributedInfo pg_config lists more than {MAX_GROUPS} groups (the rest ignored)",
        int(len(config) > MAX_GROUPS),
    )
    return out


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
