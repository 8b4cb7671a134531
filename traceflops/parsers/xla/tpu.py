"""TPU event builder: each event of a device plane's `XLA Ops` line becomes an op, its device activity and a launch.

Why apart: on a TPU the device runs the XLA ops themselves (no host launch, no kernels),
so the op, its kernel and the launch that links them are made together, from one event.
"""

from __future__ import annotations

from traceflops.core.vocab import DEVICE_SIDE_LAUNCH
from traceflops.parsers.xla.builder import Builder, with_metadata
from traceflops.parsers.xla.events import stat, tf_scope, us
from traceflops.parsers.xla.kinds import op_kind
from traceflops.parsers.xla.xspace_model import XPlane

_LINK_EPS_US = 1e-3  # link.nesting's tolerance


def tpu_ops(b: Builder, p: XPlane, ln, tid: str, device: int | None, base_ns: int) -> None:
    em = p.event_metadata
    for e, md in with_metadata(b, em, ln.events):
        ms = md.stats
        st = e.stats
        name = md.display_name or md.name
        if name.startswith("%"):  # metadata name is the HLO text '%name = shape opcode(...)'
            name = name[1:].split(" ", 1)[0]
        prog = stat(st, ms, "program_id")
        facts = b.facts(prog, None, name)
        category = stat(st, ms, "hlo_category")
        opcode = facts.opcode if facts else None
        kind, coll = op_kind(opcode, category if isinstance(category, str) else None, name)
        ts = us(ln.timestamp_ns, e.offset_ps, base_ns)
        dur = e.duration_ps / 1e6
        flops = stat(st, ms, "flops")
        matmul = None
        if isinstance(category, str) and "convolution" in category.lower():
            matmul = True
        scope = tf_scope(stat(st, ms, "tf_op"))
        # `link` nests with a 1 ns tolerance: an op of at most 1 ns (TPUs record zero-length
        # ones) would not contain its own launch, or a neighbour would take it. Such ops get
        # 2 ns in `ops`; their device activity keeps the measured duration.
        op_dur = dur if dur > _LINK_EPS_US else 2 * _LINK_EPS_US
        op = b.add_op(
            name=name,
            cat="xla_op",
            pid=p.name,
            tid=tid,
            ts=ts,
            dur=op_dur,
            scope=scope,
            facts=facts,
            flops=flops,
            bytes_=stat(st, ms, "bytes_accessed"),
            matmul=matmul,
        )
        corr = b.next_corr()
        size = stat(st, ms, "bytes_accessed") if kind == "memcpy" else None
        b.add_kernel(
            name=name,
            kind=kind,
            pid=p.name,
            device=device,
            stream=tid,
            ts=ts,
            dur=dur,
            corr=corr,
            ext_id=None,
            bytes_=size,
            collective=coll,
        )
        # The launch sits inside the op's span (the op itself ran it): at its midpoint, past any
        # zero-length op that starts at the same instant; at the start of a padded short op.
        at = ts + dur / 2 if dur > 4 * _LINK_EPS_US else ts
        b.add_launch(name=DEVICE_SIDE_LAUNCH, pid=p.name, tid=tid, ts=at, dur=0.0, corr=corr, ext_id=op)
