"""Walking a plane's lines: each host or device event routed to the builder that makes its rows, or counted as ignored.

Why apart: host planes (CPU XLA ops, GPU launches, step annotations) and device planes
(TPU ops, GPU stream kernels, `Steps` lines) are recognised here by line and stat names,
so the builders see only the events they make rows of.
"""

from __future__ import annotations

import re

from traceflops.parsers.values import as_int as _int
from traceflops.parsers.xla.builder import Builder, Launch, with_metadata
from traceflops.parsers.xla.events import line_names, plane_device, stat, tf_scope, us
from traceflops.parsers.xla.kinds import gpu_kernel_kind
from traceflops.parsers.xla.tpu import tpu_ops
from traceflops.parsers.xla.xspace_model import XPlane

_MEMCPY_SIZE = re.compile(r"size:(\d+)")

# Host events the analysis needs nothing from (runtime annotations): counted in meta, not warned.
_DERIVED_GPU_LINES = (
    "XLA Ops",
    "XLA Modules",
    "TensorFlow Ops",
    "TensorFlow Name Scope",
    "Source",
    "Framework Ops",
    "Framework Name Scope",
    "XLA TraceMe",
    "Async XLA Ops",
    "Overlay",
    "SparseCore",
    "Sparse Core",
)


# --------------------------------------------------------------------------------------
# host planes: CPU XLA ops, launches, step annotations
# --------------------------------------------------------------------------------------


def scan_host_line(b: Builder, p: XPlane, ln, tid: str, base_ns: int, launches: list[Launch]) -> None:
    em = p.event_metadata
    pid = p.name
    lts = ln.timestamp_ns
    other = 0
    for e, md in with_metadata(b, em, ln.events):
        st = e.stats
        if e.num_occurrences and not e.offset_ps:
            b.w.add("aggregated events (num_occurrences, no timestamp) not analysed")
            continue
        if st is None and not md.stats:
            other += 1
            continue
        corr = stat(st, md.stats, "correlation_id")
        ts = us(lts, e.offset_ps, base_ns)
        dur = e.duration_ps / 1e6
        if dur < 0:
            b.w.add("events with negative duration (skipped)")
            continue
        if corr is not None:
            c = _int(corr)
            if c is None:
                b.w.add("launches with a non-integer correlation id (skipped)")
                continue
            launches.append(
                Launch(
                    pid,
                    tid,
                    ts,
                    dur,
                    md.name,
                    c,
                    stat(st, md.stats, "hlo_op"),
                    stat(st, md.stats, "program_id"),
                    stat(st, md.stats, "hlo_module"),
                    stat(st, md.stats, "name") or tf_scope(stat(st, md.stats, "tf_op")),
                )
            )
            continue
        hlo_op = stat(st, md.stats, "hlo_op")
        if isinstance(hlo_op, str) and hlo_op:
            module = stat(st, md.stats, "hlo_module")
            prog = stat(st, md.stats, "program_id")
            facts = b.facts(prog, module, hlo_op)
            scope = stat(st, md.stats, "name") or tf_scope(stat(st, md.stats, "tf_op"))
            b.add_host_xla_op(
                name=hlo_op,
                pid=pid,
                tid=tid,
                ts=ts,
                dur=dur,
                scope=scope,
                facts=facts,
                flops=stat(st, md.stats, "flops"),
                bytes_=stat(st, md.stats, "bytes_accessed"),
                device=_int(stat(st, md.stats, "device_ordinal")),
                run=_int(stat(st, md.stats, "run_id")),
            )
            continue
        step = stat(st, md.stats, "step_num")
        if step is not None and (n := _int(step)) is not None:
            b.steps.append((n, f"{md.name}#{n}", pid, tid, ts, dur))
            continue
        other += 1
    b.ignore("host runtime annotations (TraceMe), not XLA ops", other)


# --------------------------------------------------------------------------------------
# device planes: TPU XLA ops, GPU stream kernels, Steps lines
# --------------------------------------------------------------------------------------


def scan_device_plane(b: Builder, p: XPlane, base_ns: int, kernel_launch: dict) -> bool:
    device = plane_device(p.name)
    is_tpu = p.name.startswith("/device:TPU")
    names = line_names(p)
    em = p.event_metadata
    work = False
    for ln in p.lines:
        tid = names[id(ln)]
        lname = ln.name
        if lname == "Steps":
            for e in ln.events:
                md = em.get(e.metadata_id)
                st = e.stats or {}
                g = _int(st.get("group_id"))
                if g is None and md is not None:
                    g = _int(md.name)
                if g is None:
                    b.w.add("device 'Steps' events without a group id (skipped)")
                    continue
                ts = us(ln.timestamp_ns, e.offset_ps, base_ns)
                b.device_steps.setdefault(g, []).append(
                    (ts, ts + e.duration_ps / 1e6, p.name, tid, md.name if md else str(g))
                )
            continue
        if is_tpu and lname == "XLA Ops":
            tpu_ops(b, p, ln, tid, device, base_ns)
            work = work or bool(ln.events)
            continue
        if not is_tpu and lname.startswith("Stream"):
            for e, md in with_metadata(b, em, ln.events):
                st = e.stats
                corr = _int(stat(st, md.stats, "correlation_id"))
                ts = us(ln.timestamp_ns, e.offset_ps, base_ns)
                dur = e.duration_ps / 1e6
                kind = gpu_kernel_kind(lname, md.name, st)
                size = None
                details = stat(st, md.stats, "memcpy_details") or stat(st, md.stats, "memset_details")
                if isinstance(details, str):
                    m = _MEMCPY_SIZE.search(details)
                    size = int(m.group(1)) if m else None
                rec = [md.name, kind, p.name, device, tid, ts, dur, corr, size, st or {}, md.stats]
                if corr is None:
                    b.add_kernel(
                        name=md.name,
                        kind=kind,
                        pid=p.name,
                        device=device,
                        stream=tid,
                        ts=ts,
                        dur=dur,
                        corr=None,
                        ext_id=None,
                        bytes_=size,
                    )
                else:
                    kernel_launch.setdefault((p.name, corr), []).append(rec)
                work = True
            continue
        n = len(ln.events)
        if lname in _DERIVED_GPU_LINES or lname.startswith(("TensorFlow", "XLA", "Framework")):
            b.ignore(f"device line '{lname}' (derived from the op and kernel lines)", n)
        elif n:
            b.w.add(f"events in unrecognised device line '{lname}' not analysed", n)
    return work
