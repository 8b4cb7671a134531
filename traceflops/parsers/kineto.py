"""PyTorch profiler / Kineto chrome-trace JSON → `Trace`.

Decodes with a typed msgspec schema that names only the fields the analysis
reads, so no Python dict is built per event and unknown args are skipped in C.
Every field is typed loosely (`Any`) and validated when columns are built: one
badly typed event is counted in `warnings`, it never aborts the decode.
"""

from __future__ import annotations

import re
from typing import Any

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


class _Args(msgspec.Struct, omit_defaults=True):
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


class _Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


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


_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_EVENT_DECODER = msgspec.json.Decoder(_Event)
_HEAD_DECODER = msgspec.json.Decoder(_Head)
_SEP = b", \n\r\t"
NOT_AN_OBJECT = "traceEvents entries that are not objects (skipped)"


def decode_batch(blocks: list[bytes], warnings: Warnings) -> list[_Event]:
    """Typed decode of blocks of raw events (each a run of array entries); a bad block goes event by event."""
    out: list[_Event] = []
    for block in blocks:
        try:
            out += _EVENTS_DECODER.decode(b"[" + block.lstrip(_SEP) + b"]")
            continue
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        out += _decode_pieces(split_events(block), warnings)
    return out


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


def parse_kineto(path: str, *, max_bytes: int | None = None, progress=None) -> Trace:
    """Stream the file in chunks into typed event batches, then columns."""
    warnings = Warnings()
    frames = []
    res = None
    for batch, res in stream_events(path, max_bytes or max_bytes_default(), progress=progress):
        if batch:
            frames.append(event_table(decode_batch(batch, warnings)))
    head = decode_head(res.head, warnings)
    if res.truncated and res.events_complete:
        warnings.add("the trace ends before its JSON closes, after its events: every event was read")
    elif res.truncated:
        warnings.add("the trace ends before its JSON closes (a cut file): read up to the last complete event")
    warnings.add(NOT_AN_OBJECT, res.stray)
    events = pl.concat(frames, how="vertical_relaxed") if frames else event_table([])
    trace = build_trace(events, head, warnings, source=str(path))
    trace.meta["truncated"] = res.truncated and not res.events_complete
    return trace


_EMPTY_ARGS = _Args()


_I64 = 1 << 63


def _scalar(v: Any) -> Any:
    """A value polars can take: lists, objects and integers beyond 64 bits become null."""
    if v.__class__ is int:
        return v if -_I64 <= v < _I64 else None
    return v if v.__class__ in (float, str, bool) else None


def _col(values: list, dtype) -> pl.Series:
    """A typed column from loosely typed trace values; what does not convert becomes null."""
    try:
        return pl.Series(values, dtype=dtype, strict=False)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([_scalar(v) for v in values], dtype=dtype, strict=False)


def _dumps(v: Any) -> str | None:
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return None  # nesting too deep or integers too large to be shapes


def _json_col(values: list) -> pl.Series:
    dumps = orjson.dumps
    try:
        return pl.Series([None if v is None else dumps(v).decode() for v in values], dtype=pl.Utf8)
    except (TypeError, orjson.JSONEncodeError):
        return pl.Series([None if v is None else _dumps(v) for v in values], dtype=pl.Utf8)


def event_table(events: list[_Event]) -> pl.DataFrame:
    """All complete ('X') events as one typed table, built column by column."""
    xs = [e for e in events if e.ph == "X"]
    args = [e.args or _EMPTY_ARGS for e in xs]
    is_op = [e.cat in OP_CATS if e.cat.__class__ is str else False for e in xs]
    # Shapes only matter for ops: keep the JSON encoding off the other events.
    pick = lambda field: [getattr(a, field) if o else None for a, o in zip(args, is_op)]  # noqa: E731
    ext = [a.ext_id if a.ext_id is not None else a.ext_id_old for a in args]
    return pl.DataFrame(
        {
            "cat": _col([e.cat for e in xs], pl.Utf8),
            "name": _col([e.name if e.name.__class__ is str else None for e in xs], pl.Utf8),
            "pid": _col([e.pid for e in xs], pl.Utf8),
            "tid": _col([e.tid for e in xs], pl.Utf8),
            "ts": _col([e.ts for e in xs], pl.Float64),
            "dur": _col([e.dur for e in xs], pl.Float64),
            "ext_id": _col(ext, pl.Int64),
            "correlation": _col([a.correlation for a in args], pl.Int64),
            "seq": _col([a.seq for a in args], pl.Int64),
            "fwd_tid": _col([a.fwd_tid for a in args], pl.Int64),
            "device": _col([a.device for a in args], pl.Int64),
            "stream": _col([a.stream for a in args], pl.Utf8),
            "bytes": _col([a.bytes for a in args], pl.Int64),
            "collective": _col([a.collective if a.collective.__class__ is str else None for a in args], pl.Utf8),
            "in_nelems": _col([a.in_nelems for a in args], pl.Int64),
            "out_nelems": _col([a.out_nelems for a in args], pl.Int64),
            "coll_dtype": _col([a.coll_dtype if a.coll_dtype.__class__ is str else None for a in args], pl.Utf8),
            "pg_name": _col([a.pg_name for a in args], pl.Utf8),
            "group_size": _col([a.group_size for a in args], pl.Int64),
            "dims": _json_col(pick("dims")),
            "types": _json_col(pick("types")),
            "concrete": _json_col(pick("concrete")),
            "strides": _json_col(pick("strides")),
        }
    )


def _count(warnings: Warnings, frame: pl.DataFrame, reason: str) -> None:
    for cat, n in frame.group_by("cat").len().iter_rows():
        warnings.add(f"'{cat}' events {reason} (skipped)", n)


def build_trace(ev: pl.DataFrame, head: _Head, warnings: Warnings, source: str) -> Trace:
    ev = ev.filter(~pl.col("cat").is_in(list(IGNORED_CATS)) | pl.col("cat").is_null())
    bad = pl.col("ts").is_null() | pl.col("dur").is_null() | pl.col("name").is_null()
    _count(warnings, ev.filter(bad), "without a numeric ts/dur or a name")
    _count(warnings, ev.filter(~bad & (pl.col("dur") < 0)), "with negative duration")
    ev = ev.filter(~bad & (pl.col("dur") >= 0))
    known = list(OP_CATS | set(KERNEL_CATS) | RUNTIME_CATS | MARKER_CATS)
    for cat, n in ev.filter(~pl.col("cat").is_in(known) | pl.col("cat").is_null()).group_by("cat").len().iter_rows():
        warnings.add(f"events of unknown category '{cat}' not analysed", n)

    ops_df = with_null_hints(
        ev.filter(pl.col("cat").is_in(list(OP_CATS)))
        .with_row_index("op_id")
        .with_columns(
            pl.col("op_id").cast(pl.Int64),
            cat=pl.when(pl.col("cat") == "user_annotation").then(pl.lit("user_annotation")).otherwise(pl.lit("cpu_op")),
        )
        .select([c for c in OPS_SCHEMA if c not in HINT_COLUMNS])
    )
    kernels_df = (
        ev.filter(pl.col("cat").is_in(list(KERNEL_CATS)))
        .with_row_index("kernel_id")
        .with_columns(
            pl.col("kernel_id").cast(pl.Int64),
            kind=kernel_kinds(pl.col("cat"), pl.col("name")),
            device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)),
            stream=pl.coalesce("stream", "tid"),
        )
        .select(list(KERNELS_SCHEMA))
    )
    launches_df = ev.filter(pl.col("cat").is_in(list(RUNTIME_CATS))).select(list(LAUNCHES_SCHEMA))
    markers_df = (
        ev.filter(pl.col("cat").is_in(list(MARKER_CATS)))
        .with_columns(device=pl.coalesce("device", pl.col("pid").cast(pl.Int64, strict=False)))
        .select(list(MARKERS_SCHEMA))
    )
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
