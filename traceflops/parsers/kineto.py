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
from .io import read_bytes


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


class _Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _File(msgspec.Struct):
    traceEvents: list[_Event] = []
    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None


class _LooseFile(_File):
    traceEvents: Any = None


_FILE_DECODER = msgspec.json.Decoder(_File)
_LOOSE_DECODER = msgspec.json.Decoder(_LooseFile)

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
    }
)

_COMM_RE = re.compile(r"nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce", re.I)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def kernel_kind(cat: str, name: str) -> str:
    kind = KERNEL_CATS[cat]
    if kind == "compute" and _COMM_RE.search(name):
        return "communication"
    return kind


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _key(v: Any) -> str | None:
    """pid/tid/stream as text: traces write them as numbers or strings ('stream 7')."""
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v)


def _json(v: Any) -> str | None:
    return None if v is None else orjson.dumps(v).decode()


def decode(raw: bytes, warnings: Warnings) -> _File:
    """Typed decode; if some event does not fit the schema, fall back per event."""
    try:
        return _FILE_DECODER.decode(raw)
    except msgspec.ValidationError:
        pass
    loose = _LOOSE_DECODER.decode(raw)
    events = []
    raw_events = loose.traceEvents if isinstance(loose.traceEvents, list) else []
    if not isinstance(loose.traceEvents, list):
        warnings.add("'traceEvents' is not a list")
    for e in raw_events:
        try:
            events.append(msgspec.convert(e, _Event))
        except msgspec.ValidationError:
            warnings.add("event that is not a chrome-trace object (skipped)")
    loose.traceEvents = events
    return loose


def parse_kineto(path: str, *, max_bytes: int | None = None) -> Trace:
    warnings = Warnings()
    raw = read_bytes(path, max_bytes=max_bytes)
    head = decode(raw, warnings)
    del raw
    return build_trace(head, warnings, source=str(path))


def build_trace(head: _File, warnings: Warnings, source: str) -> Trace:
    ops: dict[str, list] = {k: [] for k in OPS_SCHEMA if k not in HINT_COLUMNS}
    kernels: dict[str, list] = {k: [] for k in KERNELS_SCHEMA}
    launches: dict[str, list] = {k: [] for k in LAUNCHES_SCHEMA}
    markers: dict[str, list] = {k: [] for k in MARKERS_SCHEMA}
    unknown_cats: dict[str, int] = {}

    for e in head.traceEvents:
        if e.ph != "X":
            continue
        cat = e.cat
        if cat in IGNORED_CATS:
            continue
        ts, dur = _num(e.ts), _num(e.dur)
        name = e.name
        if ts is None or dur is None or not isinstance(name, str):
            warnings.add(f"'{cat}' event without a numeric ts/dur or a name (skipped)")
            continue
        if dur < 0:
            warnings.add(f"'{cat}' event with negative duration (skipped)")
            continue
        a = e.args if e.args is not None else _Args()
        ext = _int(a.ext_id if a.ext_id is not None else a.ext_id_old)
        if cat in OP_CATS:
            ops["op_id"].append(len(ops["op_id"]))
            ops["name"].append(name)
            ops["cat"].append("user_annotation" if cat == "user_annotation" else "cpu_op")
            ops["pid"].append(_key(e.pid))
            ops["tid"].append(_key(e.tid))
            ops["ts"].append(ts)
            ops["dur"].append(dur)
            ops["ext_id"].append(ext)
            ops["seq"].append(_int(a.seq))
            ops["fwd_tid"].append(_int(a.fwd_tid))
            ops["dims"].append(_json(a.dims))
            ops["types"].append(_json(a.types))
            ops["concrete"].append(_json(a.concrete))
            ops["strides"].append(_json(a.strides))
        elif cat in KERNEL_CATS:
            corr = _int(a.correlation)
            kernels["kernel_id"].append(len(kernels["kernel_id"]))
            kernels["name"].append(name)
            kernels["kind"].append(kernel_kind(cat, name))
            kernels["pid"].append(_key(e.pid))
            dev = _int(a.device)
            kernels["device"].append(dev if dev is not None else _int(e.pid))
            kernels["stream"].append(_key(a.stream) if a.stream is not None else _key(e.tid))
            kernels["ts"].append(ts)
            kernels["dur"].append(dur)
            kernels["correlation"].append(corr)
            kernels["ext_id"].append(ext)
            kernels["bytes"].append(_int(a.bytes))
            kernels["collective"].append(a.collective if isinstance(a.collective, str) else None)
        elif cat in RUNTIME_CATS:
            launches["name"].append(name)
            launches["pid"].append(_key(e.pid))
            launches["tid"].append(_key(e.tid))
            launches["ts"].append(ts)
            launches["dur"].append(dur)
            launches["correlation"].append(_int(a.correlation))
            launches["ext_id"].append(ext)
        elif cat in MARKER_CATS:
            markers["name"].append(name)
            markers["cat"].append(cat)
            markers["device"].append(_int(a.device) if a.device is not None else _int(e.pid))
            markers["ts"].append(ts)
            markers["dur"].append(dur)
        else:
            unknown_cats[str(cat)] = unknown_cats.get(str(cat), 0) + 1

    for cat, n in unknown_cats.items():
        warnings.add(f"events of unknown category '{cat}' not analysed", n)

    ops_df = with_null_hints(pl.DataFrame(ops, schema={k: v for k, v in OPS_SCHEMA.items() if k in ops}))
    kernels_df = pl.DataFrame(kernels, schema=KERNELS_SCHEMA)
    launches_df = pl.DataFrame(launches, schema=LAUNCHES_SCHEMA)
    markers_df = pl.DataFrame(markers, schema=MARKERS_SCHEMA)
    steps_df = profiler_steps(ops_df)

    dist = head.distributedInfo if isinstance(head.distributedInfo, dict) else {}
    props = head.deviceProperties if isinstance(head.deviceProperties, list) else []
    meta = {
        "format": "kineto",
        "path": source,
        "rank": _int(dist.get("rank")),
        "world_size": _int(dist.get("world_size")),
        "device_properties": [p for p in props if isinstance(p, dict)],
        "schema_version": head.schemaVersion,
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
