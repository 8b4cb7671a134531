"""XLA profiler XSpace (`.xplane.pb`) → `Trace`: decode, scan every plane, resolve GPU launches, assemble the tables.

Why apart: the one entry (`parse_xplane`, `build_trace`) that orders the other modules
and decides the trace's meta; it makes no rows itself.

What becomes what:

* ``ops``: one row per executed XLA op (HLO instruction execution).
  - TPU: the events of a device plane's ``XLA Ops`` line (the device runs them;
    each is also a device activity, see ``kernels``).
  - GPU: the host "thunk" event named after the HLO op that encloses the launch
    of its kernels (``GpuExecutable::ExecuteThunks`` → ``<module>:XLA GPU module``
    → ``<hlo op>``). Where a profile has no such event, consecutive launches of
    one HLO op are grouped into a synthesized op (a new execution starts when a
    kernel name repeats). TensorFlow (non-XLA) GPU profiles: the TF op event
    (``scope/name:Type``) that encloses a launch.
  - CPU: host events that carry ``hlo_op``/``hlo_module`` stats (XLA:CPU thunks).
    ``device`` is the event's ``device_ordinal`` when the profile's XLA:CPU ops
    ran for several devices (``--xla_force_host_platform_device_count``,
    sharded or ``pmap``/``shard_map`` programs), else null (one device: the
    ops are the trace's work, as on any CPU trace); ``collective`` the HLO
    opcode of a collective (``all-reduce``, ``all-gather-start``, ...);
    ``ext_id`` the event's ``run_id``: the execution the op belongs to (one id
    per execution of a program, shared by its devices, increasing in dispatch
    order; `stages.steps.by_run` gives each execution the step that dispatched it).
  ``name`` is the HLO op name, ``scope`` the framework name stack (the fused
  dot's ``metadata.op_name`` for a matmul fusion, else the instruction's, else
  the ``name``/``tf_op`` stats), ``dims``/``types`` JSON like Kineto's Input Dims
  (the dot's operands for a matmul op; type names spelled as Kineto spells them,
  'float', 'c10::BFloat16', ..., so dtype-based code reads them), ``flops_hint``
  the compiler's ``flops`` stat when present else FLOPs from the HLO dot /
  convolution shapes, ``bytes_hint`` the ``bytes_accessed`` stat,
  ``matmul_hint`` whether the op is or fuses a dot / convolution / GEMM or
  convolution custom call / fused attention custom call.
* ``kernels``: device activities: GPU stream events and TPU XLA ops, kind
  compute / communication (collectives) / memcpy (copies, host transfers) /
  memset. Each carries a correlation id (renumbered densely; the profile's own
  id is kept in ``ext_id``) and a ``launches`` row with the same id whose ts lies
  inside its op's host span, so `link` connects kernel → op as for Kineto.
* ``steps``: ``StepTraceAnnotation`` events (``step_num`` stat), else the
  device ``Steps`` lines (``group_id``).
* ``meta``: format 'xplane', the device type (``xla_device``, e.g. 'TPU v6
  Lite'), GPU device properties in Kineto's spelling, counts of events that are
  runtime annotations and need no analysis (``ignored_events``).

Anything the parser could not use is counted in ``warnings`` per reason.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core.trace import (
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    OPS_SCHEMA,
    STEPS_SCHEMA,
    Trace,
    Warnings,
)
from traceflops.parsers.io import read_bytes
from traceflops.parsers.xla.builder import Builder, Launch
from traceflops.parsers.xla.events import DEVICE, line_names
from traceflops.parsers.xla.gpu import gpu_props, resolve_gpu
from traceflops.parsers.xla.hlo_facts import Programs
from traceflops.parsers.xla.scan import scan_device_plane, scan_host_line
from traceflops.parsers.xla.xspace_model import XPlane, XSpace
from traceflops.parsers.xla.xspace_python import decode_xspace

_EPOCH_NS = 10**17  # line timestamps above this are wall-clock ns since 1970


def _frame(cols: dict[str, list], schema: dict) -> pl.DataFrame:
    known = {k: v for k, v in cols.items() if k in schema}
    df = pl.DataFrame(known, schema={k: schema[k] for k in known})
    missing = [pl.lit(None, dtype).alias(k) for k, dtype in schema.items() if k not in known]
    return df.with_columns(missing).select(list(schema)) if missing else df.select(list(schema))


def _read(path: str, max_bytes: int | None) -> bytes:
    """The profile's bytes (gunzipped if it is a `.xplane.pb.gz`), bounded."""
    return read_bytes(path, max_bytes=max_bytes)


def parse_xplane(path: str, *, max_bytes: int | None = None) -> Trace:
    raw = _read(str(path), max_bytes)
    space = decode_xspace(raw, str(path))
    del raw
    return build_trace(space, source=str(path))


def build_trace(space: XSpace, source: str | None = None) -> Trace:
    w = Warnings()
    for e in space.errors:
        w.add(f"the profiler recorded an error: {e[:200]}")
    for e in space.warnings:
        w.add(f"the profiler recorded a warning: {e[:200]}")
    programs = Programs(space, w, source)
    b = Builder(w, programs)

    stamps = [ln.timestamp_ns for p in space.planes for ln in p.lines if ln.events]
    base_ns = 0
    if stamps and min(stamps) > _EPOCH_NS:
        base_ns = min(stamps) // 10**9 * 10**9  # wall-clock profile: count from its first whole second

    host_planes, device_planes = [], []
    meta_device_types: list[str] = []
    device_properties: list[dict] = []
    for p in space.planes:
        unknown = p.unknown_stats
        if unknown:
            w.add(f"stats whose metadata is missing in plane '{p.name}' (skipped)", unknown)
        if p.name.startswith("/host:CPU"):
            host_planes.append(p)
        elif DEVICE.match(p.name):
            device_planes.append(p)
            dt = p.stats.get("device_type_string")
            if isinstance(dt, str) and dt:
                meta_device_types.append(dt)
            if p.name.startswith("/device:GPU"):
                device_properties.append(gpu_props(p))
        elif p.name in ("/host:metadata", "Task Environment") or p.name.startswith("/device:CUSTOM"):
            if p.lines and any(ln.events for ln in p.lines):
                b.ignore(f"events in plane '{p.name}'", sum(len(ln.events) for ln in p.lines))
        else:
            n = sum(len(ln.events) for ln in p.lines)
            if n:
                w.add(f"events in unrecognised plane '{p.name}' not analysed", n)

    launches: list[Launch] = []
    host_lines: list[tuple[XPlane, Any, str]] = []
    for p in host_planes:
        names = line_names(p)
        for ln in p.lines:
            host_lines.append((p, ln, names[id(ln)]))
            scan_host_line(b, p, ln, names[id(ln)], base_ns, launches)

    has_device_work = False
    kernel_launch: dict[tuple[str, int], list] = {}
    for p in device_planes:
        if scan_device_plane(b, p, base_ns, kernel_launch):
            has_device_work = True

    if launches or kernel_launch:
        resolve_gpu(b, host_lines, launches, kernel_launch, base_ns)

    if len(b.host_devices) <= 1:  # XLA:CPU on one device: its ops are the trace's work, as for any CPU trace
        b.ops["device"] = [None] * len(b.ops["device"])
    ops_df = _frame(b.ops, OPS_SCHEMA)
    kernels_df = _frame(b.kernels, KERNELS_SCHEMA)
    launches_df = _frame(b.launches, LAUNCHES_SCHEMA)
    markers_df = pl.DataFrame({k: [] for k in MARKERS_SCHEMA}, schema=MARKERS_SCHEMA)
    steps_df = _steps(b)

    if kernels_df.height and kernels_df["correlation"].null_count():
        w.add(
            "device activities without a correlation id cannot be linked to an op",
            kernels_df["correlation"].null_count(),
        )
    if ops_df.height == 0:
        w.add("no XLA op executions found in the profile (no XLA Ops line, no launches with hlo_op, no CPU thunks)")

    meta = {
        "format": "xplane",
        "path": source,
        "rank": None,
        "world_size": None,
        "device_properties": device_properties,
        "xla_device": meta_device_types[0] if meta_device_types else None,
        "xla_devices": sorted(set(meta_device_types)),
        "devices": len([p for p in device_planes if any(ln.events for ln in p.lines)]),
        "hostnames": list(space.hostnames),
        "programs": {str(k): v for k, v in sorted(programs.names.items())},
        "ignored_events": dict(sorted(b.ignored.items())),
        "clock_offset_ns": base_ns,
        "has_device_work": has_device_work,
    }
    return Trace(ops_df, kernels_df, launches_df, markers_df, steps_df, meta, w)


# --------------------------------------------------------------------------------------
# steps
# --------------------------------------------------------------------------------------


def _steps(b: Builder) -> pl.DataFrame:
    rows = b.steps
    if not rows and b.device_steps:
        rows = []
        for g, spans in b.device_steps.items():
            s = min(x[0] for x in spans)
            e = max(x[1] for x in spans)
            rows.append((g, f"Steps#{spans[0][4]}", spans[0][2], spans[0][3], s, e - s))
    if not rows:
        return pl.DataFrame({k: [] for k in STEPS_SCHEMA}, schema=STEPS_SCHEMA)
    # One row per step number: a step annotated on several threads spans all of them.
    by: dict[int, list] = {}
    for r in rows:
        cur = by.get(r[0])
        if cur is None:
            by[r[0]] = list(r)
        else:
            end = max(cur[4] + cur[5], r[4] + r[5])
            cur[4] = min(cur[4], r[4])
            cur[5] = end - cur[4]
    df = pl.DataFrame([tuple(v) for v in by.values()], schema=list(STEPS_SCHEMA), orient="row")
    return df.cast(STEPS_SCHEMA).sort("ts")  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant
