"""Per-op facts from a program's HLO (FLOPs, shapes, name stack, matmul parts) and the dataflow walks behind them.

Why apart: the analysis of the compiled program (`ModuleFacts` for one HLO module, `Programs`
for the profile's modules by program id) is independent of how events are turned into rows;
the GPU, TPU and CPU builders all ask it the same question: what did this HLO op compute?
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from traceflops.core.errors import FormatError
from traceflops.core.trace import Warnings
from traceflops.core.vocab import (
    JAX_BACKWARD_SCOPE_RE,
    JAX_REMAT_SCOPE_RE,
)
from traceflops.flops import hlo
from traceflops.parsers.xla.hlo_proto import (
    HloInstruction,
    HloModule,
    Shape,
    decode_hlo_proto,
)
from traceflops.parsers.xla.xspace_model import XSpace

_U64 = (1 << 64) - 1
_MAX_CALL_DEPTH = 64  # fusion → nested fusion → ... walk bound
_REMAT_SCOPE = re.compile(JAX_REMAT_SCOPE_RE)
_BACKWARD_SCOPE = re.compile(JAX_BACKWARD_SCOPE_RE)
_MAX_USERS = 100_000  # instructions a dataflow walk visits at most

# HLO element types as Kineto's `Input type` spells them (so dtype code reads both formats).
_KINETO_TYPE = {
    "f32": "float",
    "f64": "double",
    "f16": "c10::Half",
    "bf16": "c10::BFloat16",
    "s8": "signed char",
    "u8": "unsigned char",
    "s16": "short int",
    "s32": "int",
    "s64": "long int",
    "u16": "unsigned short",
    "u32": "unsigned int",
    "u64": "unsigned long long",
    "pred": "bool",
    "c64": "c10::complex<float>",
    "c128": "c10::complex<double>",
    "f8e4m3fn": "c10::Float8_e4m3fn",
    "f8e5m2": "c10::Float8_e5m2",
    "f8e4m3fnuz": "c10::Float8_e4m3fnuz",
    "f8e5m2fnuz": "c10::Float8_e5m2fnuz",
    "f8e8m0fnu": "c10::Float8_e8m0fnu",
}

_GEMM_TARGET = re.compile(r"cublas|hipblas|rocblas|gemm|matmul", re.IGNORECASE)
_CONV_TARGET = re.compile(r"cudnn\$conv|miopen.*conv|\$conv", re.IGNORECASE)
_ATTN_TARGET = re.compile(r"fused_attn|fmha|flash_attn|attention|cudnn\$fmha", re.IGNORECASE)
_MODULE_ID = re.compile(r"\((\d+)\)$")


@dataclass(slots=True)
class OpFacts:
    scope: str | None = None
    opcode: str | None = None
    dims: str | None = None
    types: str | None = None
    flops: int | None = None
    recompute_flops: int | None = None  # of `flops`, recomputed inside the kernel (a fused attention backward)
    mask: str | None = None  # attention mask of a fused attention op
    matmul: bool = False
    flops_reason: str | None = None  # why flops is None for a matmul op
    parts: tuple[OpFacts, ...] = ()  # a fusion of matmuls from several name stacks: one OpFacts per name stack
    feeds_forward: bool | None = (
        None  # a recomputed copy: does the forward use its result (CSE merged its twin into it)?
    )


def _array(shape: Shape | None) -> Shape | None:
    """The array part of a shape: the first tuple element for (result, workspace) custom calls."""
    depth = 0
    while shape is not None and shape.element_type == "tuple" and depth < 8:
        shape = shape.tuple_shapes[0] if shape.tuple_shapes else None
        depth += 1
    return shape


def _ktype(shape: Shape | None) -> str | None:
    if shape is None:
        return None
    return _KINETO_TYPE.get(shape.element_type, shape.element_type)


class ModuleFacts:
    """Index of one HLO module: instructions by name and id, and per-op facts (cached)."""

    def __init__(self, module: HloModule):
        self.module = module
        self.by_name: dict[str, HloInstruction] = {}
        self.by_id: dict[int, HloInstruction] = {}
        self.comps = {c.id: c for c in module.computations}
        self.comp_of: dict[int, int] = {}
        for c in module.computations:
            for ins in c.instructions:
                self.by_name.setdefault(ins.name, ins)
                self.by_id.setdefault(ins.id, ins)
                self.comp_of[id(ins)] = c.id
        self._local: dict[int, dict[int, HloInstruction]] = {}
        self._cache: dict[str, OpFacts | None] = {}
        self._users: dict[int, dict[int, list[HloInstruction]]] = {}

    def operand(self, ins: HloInstruction, k: int) -> HloInstruction | None:
        if k >= len(ins.operand_ids):
            return None
        oid = ins.operand_ids[k]
        cid = self.comp_of.get(id(ins))
        local = self._local.get(cid) if cid is not None else None
        if local is None and cid is not None:
            local = {i.id: i for i in self.comps[cid].instructions}
            self._local[cid] = local
        hit = local.get(oid) if local else None
        return hit if hit is not None else self.by_id.get(oid)

    def operand_shape(self, ins: HloInstruction, k: int) -> Shape | None:
        op = self.operand(ins, k)
        return _array(op.shape) if op is not None else None

    def facts(self, name: str) -> OpFacts | None:
        if name in self._cache:
            return self._cache[name]
        ins = self.by_name.get(name)
        f = None if ins is None else self._facts(ins)
        self._cache[name] = f
        return f

    def users(self, ins: HloInstruction) -> list[HloInstruction]:
        """The instructions of `ins`'s computation that take it as an operand."""
        cid = self.comp_of.get(id(ins))
        if cid is None:
            return []
        if cid not in self._users:
            table: dict[int, list[HloInstruction]] = {}
            for u in self.comps[cid].instructions:
                for k in range(len(u.operand_ids)):
                    op = self.operand(u, k)
                    if op is not None:
                        table.setdefault(id(op), []).append(u)
            self._users[cid] = table
        return self._users[cid].get(id(ins), [])

    def feeds_forward(self, ins: HloInstruction) -> bool:
        """Whether a recomputed copy's result reaches a forward op, through other recomputed or unnamed ops.

        A copy that only recomputes feeds the backward alone. When XLA's CSE merged
        the forward twin into it, the forward's own consumers now read the copy:
        then it is the forward, executed once for both.
        """
        todo, seen = list(self.users(ins)), {id(ins)}
        while todo and len(seen) < _MAX_USERS:
            u = todo.pop()
            if id(u) in seen:
                continue
            seen.add(id(u))
            name = u.op_name or ""
            if not name or _REMAT_SCOPE.search(name):  # the copy's own chain, or plumbing (tuple, bitcast)
                todo.extend(self.users(u))
            elif not _BACKWARD_SCOPE.search(name):
                return True
        return False

    # -- matmul-class work inside an op ------------------------------------------------

    def matmuls(self, ins: HloInstruction) -> list[HloInstruction]:
        """Dots, convolutions and GEMM/conv/attention custom calls this op executes.

        Descends into fused and called computations (fusion, call, async wrappers,
        custom calls with a body), never into loops or conditionals, whose bodies run
        as ops of their own. Iterative, bounded, with a visited set.
        """
        found: list[HloInstruction] = []
        stack = [(ins, 0)]
        seen: set[int] = set()
        while stack:
            cur, depth = stack.pop()
            if _is_matmul_instr(cur):
                found.append(cur)
                continue
            if depth >= _MAX_CALL_DEPTH or cur.opcode in (
                "while",
                "conditional",
                "map",
                "reduce",
                "sort",
                "scatter",
                "reduce-window",
                "select-and-scatter",
                "all-reduce",
            ):
                continue
            for cid in cur.called_computation_ids:
                if cid in seen or cid not in self.comps:
                    continue
                seen.add(cid)
                for sub in reversed(self.comps[cid].instructions):
                    stack.append((sub, depth + 1))
        return found

    def _facts(self, ins: HloInstruction) -> OpFacts:
        mms = self.matmuls(ins)
        if not mms:
            f = OpFacts(opcode=ins.opcode, scope=ins.op_name or None)
            shapes = [self.operand_shape(ins, k) for k in range(min(len(ins.operand_ids), 16))]
            _set_shapes(f, [s for s in shapes if s is not None])
            return f
        f = self._matmul_facts(ins, mms)
        by_scope: dict[str | None, list[HloInstruction]] = {}
        for m in mms:
            by_scope.setdefault(m.op_name or ins.op_name or None, []).append(m)
        if f.scope and _REMAT_SCOPE.search(f.scope):
            f.feeds_forward = self.feeds_forward(ins)
        if len(by_scope) > 1 and f.flops is not None:
            # XLA fused matmuls of different layers (or of a forward and a recomputed copy) into one op: each
            # part keeps its own name stack, so its phase is decided as if the fusion had not happened.
            f.parts = tuple(self._matmul_facts(ins, group) for group in by_scope.values())
        return f

    def _matmul_facts(self, ins: HloInstruction, mms: list[HloInstruction]) -> OpFacts:
        """Facts of matmuls `mms` inside `ins`: their FLOPs summed, the name stack and shapes of the first."""
        f = OpFacts(opcode=ins.opcode, matmul=True)
        total, recompute, masks, reasons = 0, 0, set(), []
        for m in mms:
            got, why = self.matmul_flops(m)
            if got is None:
                reasons.append(why)
                continue
            total += got.flops
            recompute += got.recompute
            if got.mask is not None:
                masks.add(got.mask)
        f.flops = None if reasons else total
        f.recompute_flops = None if reasons else recompute
        f.mask = masks.pop() if len(masks) == 1 else ("unknown" if masks else None)
        f.flops_reason = "; ".join(sorted(set(reasons))) or None
        first = mms[0]
        f.scope = first.op_name or ins.op_name or None
        _set_shapes(f, [s for s in (self.operand_shape(first, 0), self.operand_shape(first, 1)) if s is not None])
        return f

    def matmul_flops(self, m: HloInstruction) -> tuple[hlo.HloFlops | None, str]:
        """The instruction's FLOPs (`flops.hlo`) from its HLO shapes, or None and why not."""
        out = _array(m.shape)
        if m.opcode == "dot" or (m.opcode == "custom-call" and _GEMM_TARGET.search(m.custom_call_target)):
            lhs = self.operand_shape(m, 0)
            dnums = m.dot
            if dnums is None and m.opcode == "custom-call":
                dnums = _gemm_dnums(m.backend_config)
            if out is None or lhs is None or dnums is None:
                return None, "dot without operand shapes or dimension numbers"
            try:
                return hlo.HloFlops(hlo.dot(out.dims, lhs.dims, dnums.lhs_contracting)), ""
            except IndexError:
                return None, "dot dimension numbers do not fit the operand"
        if m.opcode == "convolution" or (m.opcode == "custom-call" and _CONV_TARGET.search(m.custom_call_target)):
            d = m.conv
            a, b = self.operand_shape(m, 0), self.operand_shape(m, 1)
            if d is None or out is None or a is None or b is None:
                return None, "convolution without shapes or dimension numbers"
            try:
                return hlo.HloFlops(
                    hlo.convolution(
                        m.custom_call_target, out.dims, a.dims, b.dims, d.kernel_input_feature, d.kernel_spatial
                    )
                ), ""
            except IndexError:
                return None, "convolution dimension numbers do not fit the kernel"
        if m.opcode == "custom-call" and _TE_ATTN_TARGET.search(m.custom_call_target):
            te = self.te_attention(m)
            if te is not None:
                return te, ""
        return None, f"fused attention / custom call '{m.custom_call_target or m.opcode}': FLOPs not derived"

    def te_attention(self, m: HloInstruction) -> hlo.HloFlops | None:
        """A Transformer Engine fused-attention call (`flops.hlo.te_attention`) from its backend config and output
        shape."""
        backward = "backward" in m.custom_call_target
        out = self.operand_shape(m, 6) if backward else _array(m.shape)
        return hlo.te_attention(_te_config(m.backend_config), backward, None if out is None else out.dims)


def _set_shapes(f: OpFacts, shapes: list[Shape]) -> None:
    if shapes:
        f.dims = orjson.dumps([list(s.dims) for s in shapes]).decode()
        f.types = orjson.dumps([_ktype(s) for s in shapes]).decode()


def _is_matmul_instr(ins: HloInstruction) -> bool:
    if ins.opcode in ("dot", "convolution", "ragged-dot"):
        return True
    if ins.opcode == "custom-call":
        t = ins.custom_call_target
        return bool(_GEMM_TARGET.search(t) or _CONV_TARGET.search(t) or _ATTN_TARGET.search(t))
    return False


_TE_ATTN_TARGET = re.compile(r"^te_fused_attn_(forward|backward)(_ffi)?$")
_TE_CFG_ITEM = re.compile(r"(\w+)\s*=\s*([^,{}:]+?)\s*(?::\s*\w+)?\s*(?=[,}])")


def _te_config(backend_config: bytes) -> dict[str, str]:
    """Transformer Engine's FFI attributes: '{attn_heads = 16 : i64, ..., is_training = true}'."""
    try:
        text = backend_config.decode("utf-8", "replace")
    except AttributeError:
        return {}
    return {k: v.strip() for k, v in _TE_CFG_ITEM.findall(text)}


def _gemm_dnums(backend_config: bytes):
    """Dot dimension numbers of a GEMM custom call from its (JSON) backend config."""
    from traceflops.parsers.xla.hlo_proto import DotDims

    if not backend_config or backend_config[:1] != b"{":
        return None
    try:
        cfg = orjson.loads(backend_config)
    except orjson.JSONDecodeError:
        return None
    g = cfg.get("gemm_backend_config") if isinstance(cfg, dict) else None
    dn = g.get("dot_dimension_numbers") if isinstance(g, dict) else None
    if not isinstance(dn, dict):
        return None
    try:
        return DotDims(
            [int(x) for x in dn.get("lhs_contracting_dimensions", [])],
            [int(x) for x in dn.get("rhs_contracting_dimensions", [])],
            [int(x) for x in dn.get("lhs_batch_dimensions", [])],
            [int(x) for x in dn.get("rhs_batch_dimensions", [])],
        )
    except (TypeError, ValueError):
        return None


class Programs:
    """HLO modules of the profile by program id (from `/host:metadata`), decoded lazily."""

    def __init__(self, space: XSpace, warnings: Warnings, path: str | None):
        self.raw: dict[int, bytes] = {}
        self.by_name: dict[str, list[int]] = {}
        self.names: dict[int, str] = {}
        self._facts: dict[int, ModuleFacts | None] = {}
        self.warnings = warnings
        self.path = path
        for plane in space.planes:
            if plane.name != "/host:metadata":
                continue
            for key, md in plane.event_metadata.items():
                proto = md.stats.get("Hlo Proto")
                if not isinstance(proto, bytes):
                    continue
                pid = md.stats.get("program_id")
                if not isinstance(pid, int):
                    m = _MODULE_ID.search(md.name)
                    pid = int(m.group(1)) if m else key
                pid &= _U64
                self.raw[pid] = proto
                name = _MODULE_ID.sub("", md.name)
                self.names[pid] = name
                self.by_name.setdefault(name, []).append(pid)

    def module(self, program_id: Any, module_name: Any) -> ModuleFacts | None:
        pid = None
        if isinstance(program_id, int):
            pid = program_id & _U64
            if pid not in self.raw:
                pid = None
        if pid is None and isinstance(module_name, str):
            cands = self.by_name.get(module_name, [])
            if len(cands) == 1:
                pid = cands[0]
        if pid is None:
            return None
        if pid not in self._facts:
            try:
                self._facts[pid] = ModuleFacts(decode_hlo_proto(self.raw[pid], self.path))
            except FormatError as e:
                self.warnings.add(f"an 'Hlo Proto' could not be decoded ({e.what}): its ops have no shapes or FLOPs")
                self._facts[pid] = None
        return self._facts[pid]
