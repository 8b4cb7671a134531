"""PyTorch profiler / Kineto chrome-trace JSON → `Trace`.

Decodes with a typed msgspec schema that names only the fields the analysis
reads, so no Python dict is built per event and unknown args are skipped in C.
Every field is typed loosely (`Any`) and validated when columns are built: one
badly typed event is counted in `warnings`, it never aborts the decode.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from operator import attrgetter
from typing import Any, Union

import msgspec
import orjson
import polars as pl

from .values import as_int as _int
from ..model import (
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    HINT_COLUMNS,
    OPS_SCHEMA,
    STEPS_SCHEMA,
    Trace,
    Warnings,
    with_null_hints,
)
from .io import max_bytes_default
from .jsonstream import split_events, stream_events


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


# gc=False: millions of small structs that hold no reference cycles; tracking them
# made the garbage collector a third of the decode time.
class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


# Every other chrome-trace phase decodes to an empty struct: its fields are skipped
# unbuilt. Flow and instant events are close to half of a Kineto trace.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
    for i, ph in enumerate(["B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M", "V", "v", "R", "c", "(", ")"])
)


_ARGS = tuple(_Args.__struct_fields__)


class _X(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event, the only phase the analysis reads."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


_EVENTS_DECODER = msgspec.json.Decoder(list[Union[(_X, *_OTHER_PHASES)]])  # noqa: UP007


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

_COMM_RE = re.compile(r"(?i)nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce", re.I)


def kernel_kinds(cat: pl.Expr, name: pl.Expr) -> pl.Expr:
    """compute | communication | memcpy | memset, from the category and (for kernels) the name."""
    base = cat.replace_strict(KERNEL_CATS, default=None)
    return pl.when((base == "compute") & name.str.contains(_COMM_RE.pattern)).then(pl.lit("communication")).otherwise(base)


_EVENT_DECODER = msgspec.json.Decoder(_Event)
_HEAD_DECODER = msgspec.json.Decoder(_Head)
_SEP = b", \n\r\t"
NOT_AN_OBJECT = "traceEvents entries that are not objects (skipped)"


def decode_block(text: bytes | bytearray, strict: bool, warnings: Warnings) -> dict[str, pl.DataFrame] | None:
    """The complete events of a JSON array of trace entries, as the model's tables.

    Strict: None unless the whole array decodes (the stream's proof of its cut).
    Otherwise an array that fails whole is decoded entry by entry, and what
    cannot be read is counted.
    """
    try:
        events = _EVENTS_DECODER.decode(text)
        return split_tables(event_table([e for e in events if e.__class__ is _X]), warnings)
    except (msgspec.ValidationError, msgspec.DecodeError):
        if strict:
            return None
    pieces = _decode_pieces(split_events(bytes(text).strip()[1:-1]), warnings)
    return split_tables(event_table([e for e in pieces if e.ph == "X"]), warnings)


def _decode_pieces(pieces: list[bytes], warnings: Warnings) -> list[_Event]:
    pieces = [q for q in (_object_only(p.lstrip(_SEP), warnings) for p in pieces) if q]
    out = []
    for p in pieces:
        try:
            out.append(_EVENT_DECODER.decode(p))
        except msgspec.ValidationError:
            try:
                out.append(msgspec.convert(_loose(p), _Event))
            except (msgspec.ValidationError, msgspec.DecodeError, TypeError):
                warnings.add("event that is not a chrome-trace object (skipped)")
        except msgspec.DecodeError:
            warnings.add("event that is not valid JSON (skipped)")
    return out


def _object_only(piece: bytes, warnings: Warnings) -> bytes:
    """An event's bytes from its opening brace; array entries before it that are not objects are counted.

    Entries are counted by their separating commas (a comma inside a string
    would over-count: a warning count, never a number of the report).
    """
    if piece[:1] == b"{" or not piece:
        return piece
    at = piece.find(b"{")
    stray = (piece[:at] if at >= 0 else piece).strip(_SEP)
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
    try:
        return _HEAD_DECODER.decode(head)
    except (msgspec.ValidationError, msgspec.DecodeError):
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


def parse_kineto(path: str, *, max_bytes: int | None = None, progress=None) -> Trace:
    """Stream the file in chunks into typed event batches, then columns."""
    with _collector_paused():
        return _parse_kineto(path, max_bytes=max_bytes, progress=progress)


def _parse_kineto(path: str, *, max_bytes: int | None, progress) -> Trace:
    warnings = Warnings()
    frames = []
    res = None
    decode = lambda block, strict: decode_block(block, strict, warnings)  # noqa: E731
    for tables, res in stream_events(path, max_bytes or max_bytes_default(), decode, progress=progress):
        frames += tables
    head = decode_head(res.head, warnings)
    if res.truncated and res.events_complete:
        warnings.add("the trace ends before its JSON closes, after its events: every event was read")
    elif res.truncated:
        warnings.add("the trace ends before its JSON closes (a cut file): read up to the last complete event")
    warnings.add(NOT_AN_OBJECT, res.stray)
    trace = build_trace(frames, head, warnings, source=str(path))
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
        return pl.repeat(None, len(values), dtype=dtype, eager=True)
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
    return pl.Series(out, dtype=pl.Utf8)


_BASE = attrgetter("cat", "name", "pid", "tid", "ts", "dur")


def _text_col(values: tuple | list) -> pl.Series:
    """Identifiers written as integers or strings (pid, tid, stream), as text."""
    if _all_none(values):
        return pl.repeat(None, len(values), dtype=pl.Utf8, eager=True)
    try:
        s = pl.Series(values)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return _col(values, pl.Utf8)
    # Integers cast in one pass: converting value by value was a tenth of the parse.
    return s.cast(pl.Utf8) if s.dtype in (pl.Int64, pl.Utf8) else _col(values, pl.Utf8)


def _str_col(values: tuple | list) -> pl.Series:
    """Strings stay, anything else (a number where a name belongs) becomes null."""
    if _all_none(values):
        return pl.repeat(None, len(values), dtype=pl.Utf8, eager=True)
    try:
        return pl.Series(values, dtype=pl.Utf8)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([v if v.__class__ is str else None for v in values], dtype=pl.Utf8)


def event_table(xs: list) -> pl.DataFrame:
    """Complete ('X') events as one typed table, built column by column by C-level maps (no per-field loop)."""
    nulls = (None,) * len(xs)
    a = dict.fromkeys(_ARGS, nulls)
    cat = name = pid = tid = ts = dur = ()
    if xs:
        cat, name, pid, tid, ts, dur = zip(*map(_BASE, xs))
        rows = [e.args or _EMPTY_ARGS for e in xs]
        for f in _ARGS:
            values = tuple(map(attrgetter(f), rows))
            if not _all_none(values):  # most args are absent from most traces
                a[f] = values
    ext = a["ext_id"]
    if any(v is not None for v in a["ext_id_old"]):
        ext = [n if n is not None else o for n, o in zip(ext, a["ext_id_old"])]
    return pl.DataFrame(
        {
            "cat": _col(cat, pl.Utf8),
            "name": _str_col(name),
            "pid": _text_col(pid),
            "tid": _text_col(tid),
            "ts": _col(ts, pl.Float64),
            "dur": _col(dur, pl.Float64),
            "ext_id": _col(ext, pl.Int64),
            "correlation": _col(a["correlation"], pl.Int64),
            "seq": _col(a["seq"], pl.Int64),
            "fwd_tid": _col(a["fwd_tid"], pl.Int64),
            "device": _col(a["device"], pl.Int64),
            "stream": _text_col(a["stream"]),
            "bytes": _col(a["bytes"], pl.Int64),
            "collective": _str_col(a["collective"]),
            "in_nelems": _col(a["in_nelems"], pl.Int64),
            "out_nelems": _col(a["out_nelems"], pl.Int64),
            "coll_dtype": _str_col(a["coll_dtype"]),
            "pg_name": _text_col(a["pg_name"]),
            "group_size": _col(a["group_size"], pl.Int64),
            "dims": _json_col(a["dims"]),
            "types": _json_col(a["types"]),
            "concrete": _json_col(a["concrete"]),
            "strides": _json_col(a["strides"]),
        }
    )


_TABLE_OF = {c: "ops" for c in OP_CATS} | {c: "kernels" for c in KERNEL_CATS} | {c: "launches" for c in RUNTIME_CATS} | {c: "markers" for c in MARKER_CATS}
TABLES = ("ops", "kernels", "launches", "markers")
_COLUMNS = {
    "ops": [c for c in OPS_SCHEMA if c not in HINT_COLUMNS and c != "op_id"],
    "kernels": [c for c in KERNELS_SCHEMA if c not in ("kernel_id", "kind")] + ["cat", "tid"],
    "launches": list(LAUNCHES_SCHEMA),
    "markers": list(MARKERS_SCHEMA) + ["pid"],
}


def split_tables(ev: pl.DataFrame, warnings: Warnings) -> dict[str, pl.DataFrame]:
    """One chunk's complete events, sorted into the model's tables (ids are numbered once all are in).

    Done per chunk so the wide table of every event is never whole in memory;
    one pass labels each event, one count gives every warning.
    """
    ev = ev.filter(~pl.col("cat").is_in(list(IGNORED_CATS)) | pl.col("cat").is_null())
    bad = pl.col("ts").is_null() | pl.col("dur").is_null() | pl.col("name").is_null()
    ev = ev.with_columns(
        _why=pl.when(bad).then(pl.lit("without a numeric ts/dur or a name")).when(pl.col("dur") < 0).then(pl.lit("with negative duration")),
        _table=pl.col("cat").replace_strict(_TABLE_OF, default=None),
    )
    for cat, why, table, n in ev.group_by("cat", "_why", "_table").len().iter_rows():
        if why is not None:
            warnings.add(f"'{cat}' events {why} (skipped)", n)
        elif table is None:
            warnings.add(f"events of unknown category '{cat}' not analysed", n)
    parts = ev.filter(pl.col("_why").is_null() & pl.col("_table").is_not_null()).partition_by("_table", as_dict=True, include_key=False)
    out = {}
    for t in TABLES:
        part = parts.get((t,))
        out[t] = part.select(_COLUMNS[t]) if part is not None else ev.clear().select(_COLUMNS[t])
    return out


def build_trace(parts: list[dict[str, pl.DataFrame]], head: _Head, warnings: Warnings, source: str) -> Trace:
    """The chunks' tables joined in file order, numbered, with the head's metadata."""
    empty = split_tables(event_table([]), Warnings())
    tables = {t: pl.concat([p[t] for p in parts] or [empty[t]], how="vertical_relaxed") for t in TABLES}
    ops_df = with_null_hints(
        tables["ops"]
        .with_row_index("op_id")
        .with_columns(
            pl.col("op_id").cast(pl.Int64),
            cat=pl.when(pl.col("cat") == "user_annotation").then(pl.lit("user_annotation")).otherwise(pl.lit("cpu_op")),
        )
    )
    kernels_df = (
        tables["kernels"]
        .with_row_index("kernel_id")
        .with_columns(
            pl.col("kernel_id").cast(pl.Int64),
            kind=kernel_kinds(pl.col("cat"), pl.col("name")),
            device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)),
            stream=pl.coalesce("stream", "tid"),
        )
        .select(list(KERNELS_SCHEMA))
    )
    launches_df = tables["launches"]
    markers_df = tables["markers"].with_columns(device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False))).select(list(MARKERS_SCHEMA))
    del tables
    steps_df = profiler_steps(ops_df)

    dist = head.distributedInfo if isinstance(head.distributedInfo, dict) else {}
    props = head.deviceProperties if isinstance(head.deviceProperties, list) else []
    meta = {
        "format": "kineto",
        "path": source,
        "rank": _int(dist.get("rank")),
        "world_size": _int(dist.get("world_size")),
        "device_properties": [p for p in props if isinstance(p, dict)],
        "schema_version": head.schemaVersion if isinstance(head.schemaVersion, (int, str)) else None,
    }
    if kernels_df.height and kernels_df["correlation"].null_count():
        warnings.add(
            "device activities without a correlation id cannot be linked to an op",
            kernels_df["correlation"].null_count(),
        )
    return Trace(ops_df, kernels_df, launches_df, markers_df, steps_df, meta, warnings)


def profiler_steps(ops: pl.DataFrame) -> pl.DataFrame:
    """Host step spans from `ProfilerStep#N` annotations."""
    steps = (
        ops.filter(pl.col("name").str.contains(r"^ProfilerStep#\d+$"))
        .with_columns(step=pl.col("name").str.extract(r"#(\d+)$").cast(pl.Int64))
        .select(list(STEPS_SCHEMA))
        .sort("ts")
    )
    return steps.cast(STEPS_SCHEMA)
