"""The row accumulator (`Builder`): ops, kernels, launches and steps as column lists, with the op's HLO facts merged in.

Why apart: the GPU, TPU and host scans all emit rows through it, so the columns, the
correlation numbering and the warnings about missing facts are decided once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traceflops.core.trace import Warnings
from traceflops.parsers.values import as_count
from traceflops.parsers.xla.hlo_facts import OpFacts, Programs
from traceflops.parsers.xla.kinds import collective_of


@dataclass(slots=True)
class Launch:
    plane: str
    line: str
    ts: float
    dur: float
    name: str
    corr: int
    hlo_op: str | None
    program_id: Any
    module: Any
    scope: str | None


class Builder:
    def __init__(self, warnings: Warnings, programs: Programs):
        self.w = warnings
        self.programs = programs
        self.ops: dict[str, list] = {k: [] for k in _OP_COLS}
        self.kernels: dict[str, list] = {k: [] for k in _KERNEL_COLS}
        self.launches: dict[str, list] = {k: [] for k in _LAUNCH_COLS}
        self.steps: list[tuple[int, str, str, str, float, float]] = []
        self.device_steps: dict[int, list] = {}
        self.ignored: dict[str, int] = {}
        self._corr = 0
        self._missing_modules: set[tuple] = set()
        self.host_devices: set[int] = set()  # XLA:CPU device ordinals of the host XLA ops

    # -- rows --------------------------------------------------------------------------

    def ignore(self, reason: str, n: int = 1) -> None:
        if n:
            self.ignored[reason] = self.ignored.get(reason, 0) + n

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def facts(self, program_id: Any, module: Any, hlo_op: str | None) -> OpFacts | None:
        if not hlo_op:
            return None
        mod = self.programs.module(program_id, module)
        if mod is None:
            key = (program_id, module)
            if key not in self._missing_modules:
                self._missing_modules.add(key)
            self.w.add(
                "XLA ops whose HLO module is not in the profile (no 'Hlo Proto' in /host:metadata): no shapes or "
                "shape-derived FLOPs"
            )
            return None
        f = mod.facts(hlo_op)
        if f is None:
            self.w.add("XLA ops not found in their HLO module: no shapes or shape-derived FLOPs")
        return f

    def add_op(
        self,
        *,
        name,
        cat,
        pid,
        tid,
        ts,
        dur,
        scope=None,
        facts: OpFacts | None = None,
        flops=None,
        bytes_=None,
        matmul=None,
        ext_id=None,
        device=None,
        collective=None,
    ) -> int:
        o = self.ops
        op_id = len(o["op_id"])
        if facts is not None:
            scope = facts.scope or scope
            if flops is None:
                flops = facts.flops
            matmul = facts.matmul if matmul is None else (matmul or facts.matmul)
            if facts.matmul and facts.flops is None and flops is None:
                self.w.add(f"matmul-class XLA ops without FLOPs ({facts.flops_reason})")
        o["op_id"].append(op_id)
        o["name"].append(name)
        o["cat"].append(cat)
        o["pid"].append(pid)
        o["tid"].append(tid)
        o["ts"].append(ts)
        o["dur"].append(dur)
        o["ext_id"].append(ext_id)
        o["seq"].append(None)
        o["fwd_tid"].append(None)
        o["dims"].append(facts.dims if facts else None)
        o["types"].append(facts.types if facts else None)
        o["concrete"].append(None)
        o["strides"].append(None)
        o["scope"].append(scope)
        o["flops_hint"].append(as_count(flops))
        o["bytes_hint"].append(as_count(bytes_))
        o["matmul_hint"].append(bool(matmul) if matmul is not None else False)
        own = facts is not None and flops == facts.flops  # the recompute share belongs to the parser's own count
        o["recompute_hint"].append(facts.recompute_flops if facts is not None and own else None)
        o["mask_hint"].append(facts.mask if facts else None)
        o["feeds_forward_hint"].append(facts.feeds_forward if facts else None)
        o["device"].append(device)
        o["collective"].append(collective)
        return op_id

    def add_host_xla_op(
        self,
        *,
        name,
        pid,
        tid,
        ts,
        dur,
        scope,
        facts: OpFacts | None,
        flops,
        bytes_,
        device: int | None = None,
        run: int | None = None,
    ) -> None:
        """An op XLA:CPU ran on a host thread; a fusion of several name stacks' matmuls becomes one op per name stack.

        The parts run back to back inside the op's span, each for its share of the
        FLOPs (the profile times the fusion only), so the thread's busy time is unchanged.
        `device` is the XLA:CPU device the op ran for (`device_ordinal`): kept when the
        profile's host XLA ops ran for more than one (`build_trace`). A collective
        (by its HLO opcode) is named in `collective`; `run` (the event's `run_id`: one id per
        execution of a program, increasing in dispatch order) is kept in `ext_id`.
        """
        if device is not None:
            self.host_devices.add(device)
        coll = collective_of(facts.opcode if facts is not None else None, name)
        given = as_count(flops)
        if facts is None or not facts.parts or (given is not None and given != facts.flops) or not facts.flops:
            self.add_op(
                name=name,
                cat="xla_op",
                pid=pid,
                tid=tid,
                ts=ts,
                dur=dur,
                scope=scope,
                facts=facts,
                flops=flops,
                bytes_=bytes_,
                device=device,
                collective=coll,
                ext_id=run,
            )
            return
        at = ts
        for k, part in enumerate(facts.parts):
            share = dur * part.flops / facts.flops if k < len(facts.parts) - 1 else ts + dur - at
            self.add_op(
                name=name,
                cat="xla_op",
                pid=pid,
                tid=tid,
                ts=at,
                dur=share,
                scope=scope,
                facts=part,
                bytes_=bytes_ if k == 0 else None,
                device=device,
                collective=coll,
                ext_id=run,
            )
            at += share

    def add_kernel(self, *, name, kind, pid, device, stream, ts, dur, corr, ext_id, bytes_=None, collective=None):
        k = self.kernels
        k["kernel_id"].append(len(k["kernel_id"]))
        k["name"].append(name)
        k["kind"].append(kind)
        k["pid"].append(pid)
        k["device"].append(device)
        k["stream"].append(stream)
        k["ts"].append(ts)
        k["dur"].append(dur)
        k["correlation"].append(corr)
        k["ext_id"].append(ext_id)
        k["bytes"].append(as_count(bytes_))
        k["collective"].append(collective)

    def add_launch(self, *, name, pid, tid, ts, dur, corr, ext_id=None):
        la = self.launches
        la["name"].append(name)
        la["pid"].append(pid)
        la["tid"].append(tid)
        la["ts"].append(ts)
        la["dur"].append(dur)
        la["correlation"].append(corr)
        la["ext_id"].append(ext_id)


# The columns this parser fills; any other column of the model's schemas comes out null.
_OP_COLS = (
    "op_id",
    "name",
    "cat",
    "pid",
    "tid",
    "ts",
    "dur",
    "ext_id",
    "seq",
    "fwd_tid",
    "dims",
    "types",
    "concrete",
    "strides",
    "scope",
    "flops_hint",
    "bytes_hint",
    "matmul_hint",
    "recompute_hint",
    "mask_hint",
    "feeds_forward_hint",
    "device",
    "collective",
)
_KERNEL_COLS = (
    "kernel_id",
    "name",
    "kind",
    "pid",
    "device",
    "stream",
    "ts",
    "dur",
    "correlation",
    "ext_id",
    "bytes",
    "collective",
)
_LAUNCH_COLS = ("name", "pid", "tid", "ts", "dur", "correlation", "ext_id")


def with_metadata(b: Builder, em: dict, events):
    """Events with their metadata; an event whose metadata is missing is counted and skipped."""
    for e in events:
        md = em.get(e.metadata_id)
        if md is None:
            b.w.add("events whose metadata is missing (skipped)")
            continue
        yield e, md
