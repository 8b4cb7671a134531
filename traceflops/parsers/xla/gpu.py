"""GPU event builder: kernel ↔ launch ↔ op, each kernel given a correlation, a launch row and the op enclosing it.

Why apart: on a GPU the op (a host thunk event, a TensorFlow op, or one synthesized from
consecutive launches) and its kernels live on different planes and are joined by correlation ids.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from traceflops.parsers.values import as_int as _int
from traceflops.parsers.xla.builder import Builder, Launch
from traceflops.parsers.xla.events import plane_device, stat, tf_scope, us
from traceflops.parsers.xla.xspace_model import XPlane

_TF_OP = re.compile(r"^[^\s:$][^\s]*:[A-Za-z_]\w*$")


def gpu_props(p: XPlane) -> dict:
    s = p.stats
    vendor = s.get("device_vendor")
    props: dict[str, Any] = {"id": plane_device(p.name)}
    if isinstance(vendor, str) and vendor:
        props["name"] = f"{vendor} GPU"
        props["vendor"] = vendor
    for src, dst in (
        ("core_count", "numSms"),
        ("compute_cap_major", "computeMajor"),
        ("compute_cap_minor", "computeMinor"),
        ("memory_size", "totalGlobalMem"),
        ("clock_rate", "clockRate"),
        ("memory_bandwidth", "memoryBandwidth"),
    ):
        v = _int(s.get(src))
        if v is not None:
            props[dst] = v
    return props


# --------------------------------------------------------------------------------------
# GPU: kernel ↔ launch ↔ op
# --------------------------------------------------------------------------------------


def resolve_gpu(b: Builder, host_lines, launches: list[Launch], kernel_launch: dict, base_ns: int) -> None:
    """Give each kernel a correlation, a launch row, and an op that encloses the launch."""
    by_corr: dict[int, list[Launch]] = {}
    for la in launches:
        by_corr.setdefault(la.corr, []).append(la)

    # Kernels per launch (one launch may run several kernels: a graph launch).
    kernels_of: dict[int, list[tuple[tuple[str, int], list]]] = {}
    orphan = 0
    for key, recs in kernel_launch.items():
        corr = key[1]
        if corr in by_corr:
            kernels_of.setdefault(id(by_corr[corr][0]), []).append((key, recs))
        else:
            orphan += len(recs)

    # Host events that could be the op of a launch: thunk events named after HLO ops,
    # and TF op events ('name:Type') enclosing launches without hlo_op.
    wanted = {la.hlo_op for la in launches if isinstance(la.hlo_op, str)}
    thunks: dict[str, list[tuple[float, float, str, str]]] = {}
    tf_lines = {la.line for la in launches if not la.hlo_op}
    tf_events: dict[str, list[tuple[float, float, str]]] = {}
    for p, ln, tid in host_lines:
        em = p.event_metadata
        lts = ln.timestamp_ns
        collect_tf = tid in tf_lines
        for e in ln.events:
            md = em.get(e.metadata_id)
            if md is None:
                continue
            n = md.name
            if n in wanted and not (e.stats and "correlation_id" in e.stats):
                ts = us(lts, e.offset_ps, base_ns)
                thunks.setdefault(n, []).append((ts, ts + e.duration_ps / 1e6, p.name, tid))
            elif collect_tf and _TF_OP.match(n) and "::" not in n:
                ts = us(lts, e.offset_ps, base_ns)
                tf_events.setdefault(tid, []).append((ts, ts + e.duration_ps / 1e6, n))
    for v in thunks.values():
        v.sort()
    for tf in tf_events.values():
        tf.sort()
    thunk_starts = {k: [x[0] for x in v] for k, v in thunks.items()}
    tf_starts = {k: [x[0] for x in v] for k, v in tf_events.items()}

    op_of_thunk: dict[tuple, int] = {}
    op_of_tf: dict[tuple, int] = {}
    pending: dict[str, list[Launch]] = {}  # launches needing a synthesized op, per launch line

    def enclosing(starts, spans, t):
        """Innermost span containing t: the latest start at or before t that still covers it.

        Same-named host events barely nest, so a few predecessors suffice (bounded work).
        """
        i = bisect.bisect_right(starts, t) - 1
        for j in range(i, max(-1, i - 8), -1):
            if spans[j][1] >= t:
                return j
        return None

    seen_launch: set[int] = set()
    ordered = sorted(launches, key=lambda la: (la.line, la.ts))
    for la in ordered:
        if id(la) in seen_launch:
            continue
        seen_launch.add(id(la))
        ks = kernels_of.get(id(la))
        if not ks:
            b.ignore("launches whose device activity is not in the profile")
            continue
        op_pid, op_tid, t_lo, t_hi = la.plane, la.line, la.ts, la.ts + la.dur
        if not la.hlo_op:
            # Older profiles annotate the kernel, not the launch: take the op from the kernel.
            r = ks[0][1][0]
            hlo = stat(r[9], r[10], "hlo_op")
            if isinstance(hlo, str) and hlo:
                la.hlo_op = hlo
                la.program_id = stat(r[9], r[10], "program_id")
                la.module = stat(r[9], r[10], "hlo_module")
                la.scope = la.scope or stat(r[9], r[10], "name") or tf_scope(stat(r[9], r[10], "tf_op"))
        if isinstance(la.hlo_op, str) and la.hlo_op:
            spans = thunks.get(la.hlo_op)
            i = enclosing(thunk_starts[la.hlo_op], spans, la.ts) if spans else None
            if spans and i is not None:
                s, e, tp, tt = spans[i]
                key = (la.hlo_op, tp, tt, s)
                if key not in op_of_thunk:
                    facts = b.facts(la.program_id, la.module, la.hlo_op)
                    op_of_thunk[key] = b.add_op(
                        name=la.hlo_op, cat="xla_op", pid=tp, tid=tt, ts=s, dur=e - s, scope=la.scope, facts=facts
                    )
                _emit(b, la, ks, tp, tt, max(s, min(la.ts, e)), e)
                continue
            pending.setdefault(la.line, []).append(la)
            continue
        tf_spans = tf_events.get(la.line)
        i = enclosing(tf_starts[la.line], tf_spans, la.ts) if tf_spans else None
        if tf_spans and i is not None:
            s, e, n = tf_spans[i]
            key = (la.line, s, n)
            if key not in op_of_tf:
                scope = n.rsplit(":", 1)[0]
                op_of_tf[key] = b.add_op(
                    name=n,
                    cat="tf_op",
                    pid=la.plane,
                    tid=la.line,
                    ts=s,
                    dur=e - s,
                    scope=scope,
                    matmul=bool(re.search(r":(MatMul|BatchMatMul\w*|Einsum|Conv\w*|_FusedMatMul|_FusedConv2D)$", n)),
                )
            _emit(b, la, ks, la.plane, la.line, max(s, min(la.ts, e)), e)
            continue
        # No op: e.g. an input transfer issued by the runtime. Keep the launch, no op encloses it.
        _emit(b, la, ks, op_pid, op_tid, t_lo, t_hi)

    if pending:
        n = _synthesize(b, pending, kernels_of)
        b.w.add("XLA ops synthesized from their kernel launches (no host thunk event in the profile)", n)

    if orphan:
        for key, recs in kernel_launch.items():
            if key[1] in by_corr:
                continue
            for r in recs:
                corr = b.next_corr()
                b.add_kernel(
                    name=r[0],
                    kind=r[1],
                    pid=r[2],
                    device=r[3],
                    stream=r[4],
                    ts=r[5],
                    dur=r[6],
                    corr=corr,
                    ext_id=r[7],
                    bytes_=r[8],
                    collective=None,
                )
        b.w.add("device activities whose launch is not in the profile (no host op; phase 'other')", orphan)


def _emit(b: Builder, la: Launch, ks, pid: str, tid: str, ts: float, end: float) -> None:
    corr = b.next_corr()
    for _key, recs in ks:
        for r in recs:
            b.add_kernel(
                name=r[0],
                kind=r[1],
                pid=r[2],
                device=r[3],
                stream=r[4],
                ts=r[5],
                dur=r[6],
                corr=corr,
                ext_id=r[7],
                bytes_=r[8],
                collective=None,
            )
    b.add_launch(name=la.name, pid=pid, tid=tid, ts=ts, dur=max(0.0, min(la.dur, end - ts)), corr=corr, ext_id=la.corr)


def _synthesize(b: Builder, pending: dict[str, list[Launch]], kernels_of) -> int:
    """Group consecutive launches of one HLO op into executions; a repeated kernel name starts a new one."""
    made = 0
    for line, las in pending.items():
        las.sort(key=lambda la: la.ts)
        groups: list[list[Launch]] = []
        names: set[str] = set()
        prev_key = None
        for la in las:
            key = (la.program_id, la.module, la.hlo_op)
            knames = {r[0] for _k, recs in kernels_of[id(la)] for r in recs}
            if key != prev_key or names & knames:
                groups.append([])
                names = set()
            groups[-1].append(la)
            names |= knames
            prev_key = key
        for group in groups:
            la0 = group[0]
            s = la0.ts
            e = max(la.ts + la.dur for la in group)
            facts = b.facts(la0.program_id, la0.module, la0.hlo_op)
            b.add_op(
                name=la0.hlo_op, cat="xla_op", pid=la0.plane, tid=line, ts=s, dur=e - s, scope=la0.scope, facts=facts
            )
            made += 1
            for la in group:
                _emit(b, la, kernels_of[id(la)], la0.plane, line, la.ts, e)
    return made
