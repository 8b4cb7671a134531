"""XLA profiler XSpace (`.xplane.pb`) → `Trace`.

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

import bisect
import re
from dataclasses import dataclass
from typing import Any

import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.trace import (
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    OPS_SCHEMA,
    STEPS_SCHEMA,
    Trace,
    Warnings,
)
from traceflops.core.vocab import (
    DEVICE_SIDE_LAUNCH,
    JAX_BACKWARD_SCOPE_RE,
    JAX_REMAT_SCOPE_RE,
)
from traceflops.flops import hlo
from traceflops.parsers.io import read_bytes
from traceflops.parsers.values import as_count
from traceflops.parsers.values import as_int as _int
from traceflops.parsers.xplane_proto import (
    HloInstruction,
    HloModule,
    Shape,
    XPlane,
    XSpace,
    decode_hlo_proto,
)
from traceflops.parsers.xspace import decode_xspace

_U64 = (1 << 64) - 1
_EPOCH_NS = 10**17  # line timestamps above this are wall-clock ns since 1970
_MAX_CALL_DEPTH = 64  # fusion → nested fusion → ... walk bound
_REMAT_SCOPE = re.compile(JAX_REMAT_SCOPE_RE)
_BACKWARD_SCOPE = re.compile(JAX_BACKWARD_SCOPE_RE)
_MAX_USERS = 100_000  # instructions a dataflow walk visits at most
_LINK_EPS_US = 1e-3  # link.nesting's tolerance

# HLO element types as Kineto's `Input type` spells them (so dtype code reads both formats).
_KINETO_TYPE = {
    "f32": "float", "f64": "double", "f16": "c10::Half", "bf16": "c10::BFloat16",
    "s8": "signed char", "u8": "unsigned char", "s16": "short int", "s32": "int",
    "s64": "long int", "u16": "unsigned short", "u32": "unsigned int", "u64": "unsigned long long",
    "pred": "bool", "c64": "c10::complex<float>", "c128": "c10::complex<double>",
    "f8e4m3fn": "c10::Float8_e4m3fn", "f8e5m2": "c10::Float8_e5m2",
    "f8e4m3fnuz": "c10::Float8_e4m3fnuz", "f8e5m2fnuz": "c10::Float8_e5m2fnuz",
    "f8e8m0fnu": "c10::Float8_e8m0fnu",
}

_COMM_OP = re.compile(
    r"^(all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute|"
    r"collective-broadcast|send|recv)(-start|-done)?$"
)
_MEMCPY_OP = re.compile(r"^(copy-start|copy-done|infeed|outfeed|host-transfer)$")
_COMM_KERNEL = re.compile(
    r"nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|"
    r"cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce",
    re.IGNORECASE,
)
_GEMM_TARGET = re.compile(r"cublas|hipblas|rocblas|gemm|matmul", re.IGNORECASE)
_CONV_TARGET = re.compile(r"cudnn\$conv|miopen.*conv|\$conv", re.IGNORECASE)
_ATTN_TARGET = re.compile(r"fused_attn|fmha|flash_attn|attention|cudnn\$fmha", re.IGNORECASE)
_TF_OP = re.compile(r"^[^\s:$][^\s]*:[A-Za-z_]\w*$")
_SUFFIX = re.compile(r"\.\d+$")
_MODULE_ID = re.compile(r"\((\d+)\)$")
_MEMCPY_SIZE = re.compile(r"size:(\d+)")
_DEVICE = re.compile(r"^/device:(GPU|TPU):(\d+)$")

# Host events the analysis needs nothing from (runtime annotations): counted in meta, not warned.
_DERIVED_GPU_LINES = ("XLA Ops", "XLA Modules", "TensorFlow Ops", "TensorFlow Name Scope", "Source", "Framework Ops",
                      "Framework Name Scope", "XLA TraceMe", "Async XLA Ops", "Overlay", "SparseCore", "Sparse Core")


# ======================================================================================
# HLO: per-op facts (FLOPs, shapes, name stack) from the `Hlo Proto` of a program
# ======================================================================================


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
    feeds_forward: bool | None = None  # a recomputed copy: does the forward use its result (CSE merged its twin into it)?


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
            if depth >= _MAX_CALL_DEPTH or cur.opcode in ("while", "conditional", "map", "reduce", "sort",
                                                          "scatter", "reduce-window", "select-and-scatter", "all-reduce"):
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
                return hlo.HloFlops(hlo.convolution(m.custom_call_target, out.dims, a.dims, b.dims,
                                                    d.kernel_input_feature, d.kernel_spatial)), ""
            except IndexError:
                return None, "convolution dimension numbers do not fit the kernel"
        if m.opcode == "custom-call" and _TE_ATTN_TARGET.search(m.custom_call_target):
            te = self.te_attention(m)
            if te is not None:
                return te, ""
        return None, f"fused attention / custom call '{m.custom_call_target or m.opcode}': FLOPs not derived"

    def te_attention(self, m: HloInstruction) -> hlo.HloFlops | None:
        """A Transformer Engine fused-attention call (`flops.hlo.te_attention`) from its backend config and output shape."""
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
    from traceflops.parsers.xplane_proto import DotDims

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


# ======================================================================================
# the builder
# ======================================================================================


def _us(line_ts_ns: int, offset_ps: int, base_ns: int) -> float:
    return ((line_ts_ns - base_ns) * 1000 + offset_ps) / 1e6


def _stat(ev_stats: dict | None, md_stats: dict, key: str) -> Any:
    if ev_stats is not None:
        v = ev_stats.get(key)
        if v is not None:
            return v
    return md_stats.get(key)


def _tf_scope(v: Any) -> str | None:
    """Name stack from a `tf_op` stat ('jit(f)/jit(main)/add:' → 'jit(f)/jit(main)/add')."""
    if not isinstance(v, str) or not v or v == "XlaModule:":
        return None
    return v.removesuffix(":")


@dataclass(slots=True)
class _Launch:
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


class _Builder:
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
            self.w.add("XLA ops whose HLO module is not in the profile (no 'Hlo Proto' in /host:metadata): no shapes or shape-derived FLOPs")
            return None
        f = mod.facts(hlo_op)
        if f is None:
            self.w.add("XLA ops not found in their HLO module: no shapes or shape-derived FLOPs")
        return f

    def add_op(self, *, name, cat, pid, tid, ts, dur, scope=None, facts: OpFacts | None = None,
               flops=None, bytes_=None, matmul=None, ext_id=None, device=None, collective=None) -> int:
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
        o["recompute_hint"].append(facts.recompute_flops if own else None)
        o["mask_hint"].append(facts.mask if facts else None)
        o["feeds_forward_hint"].append(facts.feeds_forward if facts else None)
        o["device"].append(device)
        o["collective"].append(collective)
        return op_id

    def add_host_xla_op(self, *, name, pid, tid, ts, dur, scope, facts: OpFacts | None, flops, bytes_,
                        device: int | None = None, run: int | None = None) -> None:
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
        coll = _collective(facts.opcode if facts is not None else None, name)
        given = as_count(flops)
        if facts is None or not facts.parts or (given is not None and given != facts.flops) or not facts.flops:
            self.add_op(name=name, cat="xla_op", pid=pid, tid=tid, ts=ts, dur=dur, scope=scope, facts=facts, flops=flops,
                        bytes_=bytes_, device=device, collective=coll, ext_id=run)
            return
        at = ts
        for k, part in enumerate(facts.parts):
            share = dur * part.flops / facts.flops if k < len(facts.parts) - 1 else ts + dur - at
            self.add_op(name=name, cat="xla_op", pid=pid, tid=tid, ts=at, dur=share, scope=scope, facts=part,
                        bytes_=bytes_ if k == 0 else None, device=device, collective=coll, ext_id=run)
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
_OP_COLS = ("op_id", "name", "cat", "pid", "tid", "ts", "dur", "ext_id", "seq", "fwd_tid", "dims", "types",
            "concrete", "strides", "scope", "flops_hint", "bytes_hint", "matmul_hint", "recompute_hint", "mask_hint",
            "feeds_forward_hint", "device", "collective")
_KERNEL_COLS = ("kernel_id", "name", "kind", "pid", "device", "stream", "ts", "dur", "correlation", "ext_id",
                "bytes", "collective")
_LAUNCH_COLS = ("name", "pid", "tid", "ts", "dur", "correlation", "ext_id")


def _frame(cols: dict[str, list], schema: dict) -> pl.DataFrame:
    known = {k: v for k, v in cols.items() if k in schema}
    df = pl.DataFrame(known, schema={k: schema[k] for k in known})
    missing = [pl.lit(None, dtype).alias(k) for k, dtype in schema.items() if k not in known]
    return df.with_columns(missing).select(list(schema)) if missing else df.select(list(schema))


def _kind(opcode: str | None, category: str | None, name: str) -> tuple[str, str | None]:
    """(kind, collective) of an XLA op from its opcode, xprof category or name."""
    for s in (opcode, category, _SUFFIX.sub("", name)):
        if not s:
            continue
        s = s.strip().lower()
        if _COMM_OP.match(s.replace("_", "-")):
            return "communication", s.replace("_", "-")
        if _MEMCPY_OP.match(s) or "host-to-device" in s or "device-to-host" in s:
            return "memcpy", None
    if _COMM_KERNEL.search(name):
        return "communication", None
    return "compute", None


def _collective(opcode: str | None, name: str) -> str | None:
    """The collective an XLA op is, by its HLO opcode (by its name without the `.N` suffix when the HLO is not in the
    profile): 'all-reduce', 'all-gather-start', 'reduce-scatter', ... spelled with dashes; None for any other op."""
    s = opcode if opcode else _SUFFIX.sub("", name or "")
    s = s.strip().lower().replace("_", "-")
    return s if _COMM_OP.match(s) else None


def _gpu_kernel_kind(line_name: str, name: str, stats: dict | None) -> str:
    if stats and ("memset_details" in stats or "memcpy_details" in stats):
        return "memset" if "memset_details" in stats else "memcpy"
    key = (line_name, name)
    kind = _KIND_CACHE.get(key)
    if kind is None:
        kind = _KIND_CACHE[key] = _gpu_kernel_kind_uncached(line_name, name)
        if len(_KIND_CACHE) > 100_000:
            _KIND_CACHE.clear()
    return kind


_KIND_CACHE: dict[tuple[str, str], str] = {}


def _gpu_kernel_kind_uncached(line_name: str, name: str) -> str:
    ln = line_name.lower()
    n = name.lower()
    if "memset" in ln or "memset" in n or "fillbuffer" in n:
        return "memset"
    if "memcpy" in ln or n.startswith("memcpy") or "copybuffer" in n or (n.startswith("copy") and "device" in n):
        return "memcpy"
    if _COMM_KERNEL.search(name):
        return "communication"
    return "compute"


def _plane_device(name: str) -> int | None:
    m = _DEVICE.match(name)
    return int(m.group(2)) if m else None


def _line_names(plane: XPlane) -> dict[int, str]:
    """A unique tid per line: its name, disambiguated by id when two lines share one."""
    seen: dict[str, int] = {}
    for ln in plane.lines:
        seen[ln.name] = seen.get(ln.name, 0) + 1
    return {id(ln): (ln.name or str(ln.id)) if seen[ln.name] == 1 and ln.name else f"{ln.name or 'line'}#{ln.id}"
            for ln in plane.lines}


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
    b = _Builder(w, programs)

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
        elif _DEVICE.match(p.name):
            device_planes.append(p)
            dt = p.stats.get("device_type_string")
            if isinstance(dt, str) and dt:
                meta_device_types.append(dt)
            if p.name.startswith("/device:GPU"):
                device_properties.append(_gpu_props(p))
        elif p.name in ("/host:metadata", "Task Environment") or p.name.startswith("/device:CUSTOM"):
            if p.lines and any(ln.events for ln in p.lines):
                b.ignore(f"events in plane '{p.name}'", sum(len(ln.events) for ln in p.lines))
        else:
            n = sum(len(ln.events) for ln in p.lines)
            if n:
                w.add(f"events in unrecognised plane '{p.name}' not analysed", n)

    launches: list[_Launch] = []
    host_lines: list[tuple[XPlane, Any, str]] = []
    for p in host_planes:
        names = _line_names(p)
        for ln in p.lines:
            host_lines.append((p, ln, names[id(ln)]))
            _scan_host_line(b, p, ln, names[id(ln)], base_ns, launches)

    has_device_work = False
    kernel_launch: dict[tuple[str, int], list] = {}
    for p in device_planes:
        if _scan_device_plane(b, p, base_ns, kernel_launch):
            has_device_work = True

    if launches or kernel_launch:
        _resolve_gpu(b, host_lines, launches, kernel_launch, base_ns)

    if len(b.host_devices) <= 1:  # XLA:CPU on one device: its ops are the trace's work, as for any CPU trace
        b.ops["device"] = [None] * len(b.ops["device"])
    ops_df = _frame(b.ops, OPS_SCHEMA)
    kernels_df = _frame(b.kernels, KERNELS_SCHEMA)
    launches_df = _frame(b.launches, LAUNCHES_SCHEMA)
    markers_df = pl.DataFrame({k: [] for k in MARKERS_SCHEMA}, schema=MARKERS_SCHEMA)
    steps_df = _steps(b)

    if kernels_df.height and kernels_df["correlation"].null_count():
        w.add("device activities without a correlation id cannot be linked to an op", kernels_df["correlation"].null_count())
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


def _gpu_props(p: XPlane) -> dict:
    s = p.stats
    vendor = s.get("device_vendor")
    props: dict[str, Any] = {"id": _plane_device(p.name)}
    if isinstance(vendor, str) and vendor:
        props["name"] = f"{vendor} GPU"
        props["vendor"] = vendor
    for src, dst in (("core_count", "numSms"), ("compute_cap_major", "computeMajor"), ("compute_cap_minor", "computeMinor"),
                     ("memory_size", "totalGlobalMem"), ("clock_rate", "clockRate"), ("memory_bandwidth", "memoryBandwidth")):
        v = _int(s.get(src))
        if v is not None:
            props[dst] = v
    return props


# --------------------------------------------------------------------------------------
# host planes: CPU XLA ops, launches, step annotations
# --------------------------------------------------------------------------------------


def _with_metadata(b: _Builder, em: dict, events):
    """Events with their metadata; an event whose metadata is missing is counted and skipped."""
    for e in events:
        md = em.get(e.metadata_id)
        if md is None:
            b.w.add("events whose metadata is missing (skipped)")
            continue
        yield e, md


def _scan_host_line(b: _Builder, p: XPlane, ln, tid: str, base_ns: int, launches: list[_Launch]) -> None:
    em = p.event_metadata
    pid = p.name
    lts = ln.timestamp_ns
    other = 0
    for e, md in _with_metadata(b, em, ln.events):
        st = e.stats
        if e.num_occurrences and not e.offset_ps:
            b.w.add("aggregated events (num_occurrences, no timestamp) not analysed")
            continue
        if st is None and not md.stats:
            other += 1
            continue
        corr = _stat(st, md.stats, "correlation_id")
        ts = _us(lts, e.offset_ps, base_ns)
        dur = e.duration_ps / 1e6
        if dur < 0:
            b.w.add("events with negative duration (skipped)")
            continue
        if corr is not None:
            c = _int(corr)
            if c is None:
                b.w.add("launches with a non-integer correlation id (skipped)")
                continue
            launches.append(_Launch(pid, tid, ts, dur, md.name, c, _stat(st, md.stats, "hlo_op"),
                                    _stat(st, md.stats, "program_id"), _stat(st, md.stats, "hlo_module"),
                                    _stat(st, md.stats, "name") or _tf_scope(_stat(st, md.stats, "tf_op"))))
            continue
        hlo_op = _stat(st, md.stats, "hlo_op")
        if isinstance(hlo_op, str) and hlo_op:
            module = _stat(st, md.stats, "hlo_module")
            prog = _stat(st, md.stats, "program_id")
            facts = b.facts(prog, module, hlo_op)
            scope = _stat(st, md.stats, "name") or _tf_scope(_stat(st, md.stats, "tf_op"))
            b.add_host_xla_op(name=hlo_op, pid=pid, tid=tid, ts=ts, dur=dur, scope=scope, facts=facts,
                              flops=_stat(st, md.stats, "flops"), bytes_=_stat(st, md.stats, "bytes_accessed"),
                              device=_int(_stat(st, md.stats, "device_ordinal")), run=_int(_stat(st, md.stats, "run_id")))
            continue
        step = _stat(st, md.stats, "step_num")
        if step is not None and _int(step) is not None:
            b.steps.append((_int(step), f"{md.name}#{_int(step)}", pid, tid, ts, dur))
            continue
        other += 1
    b.ignore("host runtime annotations (TraceMe), not XLA ops", other)


# --------------------------------------------------------------------------------------
# device planes: TPU XLA ops, GPU stream kernels, Steps lines
# --------------------------------------------------------------------------------------


def _scan_device_plane(b: _Builder, p: XPlane, base_ns: int, kernel_launch: dict) -> bool:
    device = _plane_device(p.name)
    is_tpu = p.name.startswith("/device:TPU")
    names = _line_names(p)
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
                ts = _us(ln.timestamp_ns, e.offset_ps, base_ns)
                b.device_steps.setdefault(g, []).append((ts, ts + e.duration_ps / 1e6, p.name, tid, md.name if md else str(g)))
            continue
        if is_tpu and lname == "XLA Ops":
            _tpu_ops(b, p, ln, tid, device, base_ns)
            work = work or bool(ln.events)
            continue
        if not is_tpu and lname.startswith("Stream"):
            for e, md in _with_metadata(b, em, ln.events):
                st = e.stats
                corr = _int(_stat(st, md.stats, "correlation_id"))
                ts = _us(ln.timestamp_ns, e.offset_ps, base_ns)
                dur = e.duration_ps / 1e6
                kind = _gpu_kernel_kind(lname, md.name, st)
                size = None
                details = _stat(st, md.stats, "memcpy_details") or _stat(st, md.stats, "memset_details")
                if isinstance(details, str):
                    m = _MEMCPY_SIZE.search(details)
                    size = int(m.group(1)) if m else None
                rec = [md.name, kind, p.name, device, tid, ts, dur, corr, size, st or {}, md.stats]
                if corr is None:
                    b.add_kernel(name=md.name, kind=kind, pid=p.name, device=device, stream=tid, ts=ts, dur=dur,
                                 corr=None, ext_id=None, bytes_=size)
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


def _tpu_ops(b: _Builder, p: XPlane, ln, tid: str, device: int | None, base_ns: int) -> None:
    em = p.event_metadata
    for e, md in _with_metadata(b, em, ln.events):
        ms = md.stats
        st = e.stats
        name = md.display_name or md.name
        if name.startswith("%"):  # metadata name is the HLO text '%name = shape opcode(...)'
            name = name[1:].split(" ", 1)[0]
        prog = _stat(st, ms, "program_id")
        facts = b.facts(prog, None, name)
        category = _stat(st, ms, "hlo_category")
        opcode = facts.opcode if facts else None
        kind, coll = _kind(opcode, category if isinstance(category, str) else None, name)
        ts = _us(ln.timestamp_ns, e.offset_ps, base_ns)
        dur = e.duration_ps / 1e6
        flops = _stat(st, ms, "flops")
        matmul = None
        if isinstance(category, str) and "convolution" in category.lower():
            matmul = True
        scope = _tf_scope(_stat(st, ms, "tf_op"))
        # `link` nests with a 1 ns tolerance: an op of at most 1 ns (TPUs record zero-length
        # ones) would not contain its own launch, or a neighbour would take it. Such ops get
        # 2 ns in `ops`; their device activity keeps the measured duration.
        op_dur = dur if dur > _LINK_EPS_US else 2 * _LINK_EPS_US
        op = b.add_op(name=name, cat="xla_op", pid=p.name, tid=tid, ts=ts, dur=op_dur, scope=scope, facts=facts,
                      flops=flops, bytes_=_stat(st, ms, "bytes_accessed"), matmul=matmul)
        corr = b.next_corr()
        size = _stat(st, ms, "bytes_accessed") if kind == "memcpy" else None
        b.add_kernel(name=name, kind=kind, pid=p.name, device=device, stream=tid, ts=ts, dur=dur, corr=corr,
                     ext_id=None, bytes_=size, collective=coll)
        # The launch sits inside the op's span (the op itself ran it): at its midpoint, past any
        # zero-length op that starts at the same instant; at the start of a padded short op.
        at = ts + dur / 2 if dur > 4 * _LINK_EPS_US else ts
        b.add_launch(name=DEVICE_SIDE_LAUNCH, pid=p.name, tid=tid, ts=at, dur=0.0, corr=corr, ext_id=op)


# --------------------------------------------------------------------------------------
# GPU: kernel ↔ launch ↔ op
# --------------------------------------------------------------------------------------


def _resolve_gpu(b: _Builder, host_lines, launches: list[_Launch], kernel_launch: dict, base_ns: int) -> None:
    """Give each kernel a correlation, a launch row, and an op that encloses the launch."""
    by_corr: dict[int, list[_Launch]] = {}
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
                ts = _us(lts, e.offset_ps, base_ns)
                thunks.setdefault(n, []).append((ts, ts + e.duration_ps / 1e6, p.name, tid))
            elif collect_tf and _TF_OP.match(n) and "::" not in n:
                ts = _us(lts, e.offset_ps, base_ns)
                tf_events.setdefault(tid, []).append((ts, ts + e.duration_ps / 1e6, n))
    for v in thunks.values():
        v.sort()
    for v in tf_events.values():
        v.sort()
    thunk_starts = {k: [x[0] for x in v] for k, v in thunks.items()}
    tf_starts = {k: [x[0] for x in v] for k, v in tf_events.items()}

    op_of_thunk: dict[tuple, int] = {}
    op_of_tf: dict[tuple, int] = {}
    pending: dict[str, list[_Launch]] = {}  # launches needing a synthesized op, per launch line

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
            hlo = _stat(r[9], r[10], "hlo_op")
            if isinstance(hlo, str) and hlo:
                la.hlo_op = hlo
                la.program_id = _stat(r[9], r[10], "program_id")
                la.module = _stat(r[9], r[10], "hlo_module")
                la.scope = la.scope or _stat(r[9], r[10], "name") or _tf_scope(_stat(r[9], r[10], "tf_op"))
        if isinstance(la.hlo_op, str) and la.hlo_op:
            spans = thunks.get(la.hlo_op)
            i = enclosing(thunk_starts[la.hlo_op], spans, la.ts) if spans else None
            if i is not None:
                s, e, tp, tt = spans[i]
                key = (la.hlo_op, tp, tt, s)
                if key not in op_of_thunk:
                    facts = b.facts(la.program_id, la.module, la.hlo_op)
                    op_of_thunk[key] = b.add_op(name=la.hlo_op, cat="xla_op", pid=tp, tid=tt, ts=s, dur=e - s,
                                                scope=la.scope, facts=facts)
                _emit(b, la, ks, tp, tt, max(s, min(la.ts, e)), e)
                continue
            pending.setdefault(la.line, []).append(la)
            continue
        spans = tf_events.get(la.line)
        i = enclosing(tf_starts[la.line], spans, la.ts) if spans else None
        if i is not None:
            s, e, n = spans[i]
            key = (la.line, s, n)
            if key not in op_of_tf:
                scope = n.rsplit(":", 1)[0]
                op_of_tf[key] = b.add_op(name=n, cat="tf_op", pid=la.plane, tid=la.line, ts=s, dur=e - s, scope=scope,
                                         matmul=bool(re.search(r":(MatMul|BatchMatMul\w*|Einsum|Conv\w*|_FusedMatMul|_FusedConv2D)$", n)))
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
                b.add_kernel(name=r[0], kind=r[1], pid=r[2], device=r[3], stream=r[4], ts=r[5], dur=r[6], corr=corr,
                             ext_id=r[7], bytes_=r[8], collective=None)
        b.w.add("device activities whose launch is not in the profile (no host op; phase 'other')", orphan)


def _emit(b: _Builder, la: _Launch, ks, pid: str, tid: str, ts: float, end: float) -> None:
    corr = b.next_corr()
    for _key, recs in ks:
        for r in recs:
            b.add_kernel(name=r[0], kind=r[1], pid=r[2], device=r[3], stream=r[4], ts=r[5], dur=r[6], corr=corr,
                         ext_id=r[7], bytes_=r[8], collective=None)
    b.add_launch(name=la.name, pid=pid, tid=tid, ts=ts, dur=max(0.0, min(la.dur, end - ts)), corr=corr, ext_id=la.corr)


def _synthesize(b: _Builder, pending: dict[str, list[_Launch]], kernels_of) -> int:
    """Group consecutive launches of one HLO op into executions; a repeated kernel name starts a new one."""
    made = 0
    for line, las in pending.items():
        las.sort(key=lambda la: la.ts)
        groups: list[list[_Launch]] = []
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
            b.add_op(name=la0.hlo_op, cat="xla_op", pid=la0.plane, tid=line, ts=s, dur=e - s, scope=la0.scope, facts=facts)
            made += 1
            for la in group:
                _emit(b, la, kernels_of[id(la)], la0.plane, line, la.ts, e)
    return made


# --------------------------------------------------------------------------------------
# steps
# --------------------------------------------------------------------------------------


def _steps(b: _Builder) -> pl.DataFrame:
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
    return df.cast(STEPS_SCHEMA).sort("ts")
