"""The HloProto reader (`decode_hlo_proto`): a program's computations, instructions, shapes and dimension numbers.

Why apart: the `Hlo Proto` stat of /host:metadata is a second schema (xla/service/hlo.proto),
decoded lazily per program by `hlo_facts`; the XSpace decoders never need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traceflops.core.errors import FormatError
from traceflops.parsers.xla.wire import (
    FORMAT_TODO,
    WireError,
    bad,
    fields,
    packed_ints,
    signed,
    wire_str,
)

MAX_DEPTH = 16  # nested tuple shapes

# xla.PrimitiveType → (name, bytes per element); sub-byte types use a fractional size.
PRIMITIVE_TYPES: dict[int, tuple[str, float]] = {
    1: ("pred", 1),
    2: ("s8", 1),
    3: ("s16", 2),
    4: ("s32", 4),
    5: ("s64", 8),
    6: ("u8", 1),
    7: ("u16", 2),
    8: ("u32", 4),
    9: ("u64", 8),
    10: ("f16", 2),
    11: ("f32", 4),
    12: ("f64", 8),
    13: ("tuple", 0),
    14: ("opaque", 0),
    15: ("c64", 8),
    16: ("bf16", 2),
    17: ("token", 0),
    18: ("c128", 16),
    19: ("f8e5m2", 1),
    20: ("f8e4m3fn", 1),
    21: ("s4", 0.5),
    22: ("u4", 0.5),
    23: ("f8e4m3b11fnuz", 1),
    24: ("f8e5m2fnuz", 1),
    25: ("f8e4m3fnuz", 1),
    26: ("s2", 0.25),
    27: ("u2", 0.25),
    28: ("f8e4m3", 1),
    29: ("f8e3m4", 1),
    30: ("s1", 0.125),
    31: ("u1", 0.125),
    32: ("f4e2m1fn", 0.5),
    33: ("f8e8m0fnu", 1),
}


@dataclass(slots=True)
class Shape:
    element_type: str  # 'f32', 'bf16', 'tuple', ...
    dims: list[int]
    tuple_shapes: list[Shape] = field(default_factory=list)

    def text(self) -> str:
        if self.element_type == "tuple":
            return "(" + ", ".join(s.text() for s in self.tuple_shapes) + ")"
        return f"{self.element_type}[{','.join(map(str, self.dims))}]"


@dataclass(slots=True)
class DotDims:
    lhs_contracting: list[int] = field(default_factory=list)
    rhs_contracting: list[int] = field(default_factory=list)
    lhs_batch: list[int] = field(default_factory=list)
    rhs_batch: list[int] = field(default_factory=list)


@dataclass(slots=True)
class ConvDims:
    input_batch: int = 0
    input_feature: int = 0
    input_spatial: list[int] = field(default_factory=list)
    kernel_input_feature: int = 0
    kernel_output_feature: int = 0
    kernel_spatial: list[int] = field(default_factory=list)
    output_batch: int = 0
    output_feature: int = 0
    output_spatial: list[int] = field(default_factory=list)


@dataclass(slots=True)
class WindowDim:
    size: int = 0
    stride: int = 0
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 0
    base_dilation: int = 0


@dataclass(slots=True)
class HloInstruction:
    name: str = ""
    opcode: str = ""
    shape: Shape | None = None
    op_name: str = ""  # metadata.op_name: the framework name stack
    op_type: str = ""
    id: int = 0
    operand_ids: list[int] = field(default_factory=list)
    called_computation_ids: list[int] = field(default_factory=list)
    dot: DotDims | None = None
    conv: ConvDims | None = None
    window: list[WindowDim] = field(default_factory=list)
    feature_group_count: int = 0
    batch_group_count: int = 0
    custom_call_target: str = ""
    fusion_kind: str = ""
    backend_config: bytes = b""


@dataclass(slots=True)
class HloComputation:
    name: str = ""
    id: int = 0
    root_id: int = 0
    instructions: list[HloInstruction] = field(default_factory=list)


@dataclass(slots=True)
class HloModule:
    name: str = ""
    id: int = 0
    entry_computation_name: str = ""
    entry_computation_id: int = 0
    computations: list[HloComputation] = field(default_factory=list)


def _shape(buf: bytes, pos: int, end: int, depth: int = 0) -> Shape:
    if depth > MAX_DEPTH:
        bad(f"shape nesting deeper than {MAX_DEPTH}")
    et = 0
    dims: list[int] = []
    tup: list[Shape] = []
    for fno, wt, v in fields(buf, pos, end):
        if fno == 2 and wt == 0:
            et = v
        elif fno == 3:
            packed_ints(buf, wt, v, dims)
        elif fno == 4 and wt == 2:
            tup.append(_shape(buf, v[0], v[1], depth + 1))
    name = PRIMITIVE_TYPES.get(et, (f"type{et}", 0))[0]
    return Shape(name, dims, tup)


def _ints_msg(buf: bytes, pos: int, end: int, repeated: dict[int, str], scalar: dict[int, str], obj) -> Any:
    for fno, wt, v in fields(buf, pos, end):
        if fno in repeated:
            packed_ints(buf, wt, v, getattr(obj, repeated[fno]))
        elif fno in scalar and wt == 0:
            setattr(obj, scalar[fno], signed(v))
    return obj


_DOT_REP = {1: "lhs_contracting", 2: "rhs_contracting", 3: "lhs_batch", 4: "rhs_batch"}
_CONV_REP = {11: "input_spatial", 6: "kernel_spatial", 12: "output_spatial"}
_CONV_SCALAR = {
    7: "input_batch",
    8: "input_feature",
    3: "kernel_input_feature",
    4: "kernel_output_feature",
    9: "output_batch",
    10: "output_feature",
}
_WIN_SCALAR = {1: "size", 2: "stride", 3: "padding_low", 4: "padding_high", 5: "window_dilation", 6: "base_dilation"}


def _instruction(buf: bytes, pos: int, end: int) -> HloInstruction:
    ins = HloInstruction()
    for fno, wt, v in fields(buf, pos, end):
        if wt == 0:
            if fno == 35:
                ins.id = signed(v)
            elif fno == 36:
                ins.operand_ids.append(signed(v))
            elif fno == 38:
                ins.called_computation_ids.append(signed(v))
            elif fno == 50:
                ins.feature_group_count = signed(v)
            elif fno == 58:
                ins.batch_group_count = signed(v)
            continue
        if wt != 2:
            continue
        if fno == 1:
            ins.name = wire_str(buf, v)
        elif fno == 2:
            ins.opcode = wire_str(buf, v)
        elif fno == 3:
            ins.shape = _shape(buf, v[0], v[1])
        elif fno == 7:
            for f2, w2, v2 in fields(buf, v[0], v[1]):
                if w2 == 2 and f2 == 2:
                    ins.op_name = wire_str(buf, v2)
                elif w2 == 2 and f2 == 1:
                    ins.op_type = wire_str(buf, v2)
        elif fno == 36:
            packed_ints(buf, wt, v, ins.operand_ids)
        elif fno == 38:
            packed_ints(buf, wt, v, ins.called_computation_ids)
        elif fno == 30:
            ins.dot = _ints_msg(buf, v[0], v[1], _DOT_REP, {}, DotDims())
        elif fno == 16:
            ins.conv = _ints_msg(buf, v[0], v[1], _CONV_REP, _CONV_SCALAR, ConvDims())
        elif fno == 15:
            for f2, w2, v2 in fields(buf, v[0], v[1]):
                if f2 == 1 and w2 == 2:
                    ins.window.append(_ints_msg(buf, v2[0], v2[1], {}, _WIN_SCALAR, WindowDim()))
        elif fno == 28:
            ins.custom_call_target = wire_str(buf, v)
        elif fno == 11:
            ins.fusion_kind = wire_str(buf, v)
        elif fno == 43:
            ins.backend_config = buf[v[0] : v[1]]
    return ins


def _computation(buf: bytes, pos: int, end: int) -> HloComputation:
    comp = HloComputation()
    for fno, wt, v in fields(buf, pos, end):
        if fno == 1 and wt == 2:
            comp.name = wire_str(buf, v)
        elif fno == 2 and wt == 2:
            comp.instructions.append(_instruction(buf, v[0], v[1]))
        elif fno == 5 and wt == 0:
            comp.id = signed(v)
        elif fno == 6 and wt == 0:
            comp.root_id = signed(v)
    return comp


def decode_hlo_proto(buf: bytes, path: str | None = None) -> HloModule:
    """HloProto (or a bare HloModuleProto) → the module's computations and instructions."""
    try:
        top = fields(buf, 0, len(buf))
        # HloProto{hlo_module=1, buffer_assignment=3}; a bare HloModuleProto has name=1, computations=3.
        mod_fields = top
        span = next((v for fno, wt, v in top if fno == 1 and wt == 2), None)
        if span is not None:
            try:
                inner = fields(buf, span[0], span[1])
            except WireError:
                inner = None  # field 1 is the module's name: a bare HloModuleProto
            if inner is not None and any(fno == 3 and wt == 2 for fno, wt, _ in inner):
                mod_fields = inner
        mod = HloModule()
        for fno, wt, v in mod_fields:
            if fno == 1 and wt == 2:
                mod.name = wire_str(buf, v)
            elif fno == 2 and wt == 2:
                mod.entry_computation_name = wire_str(buf, v)
            elif fno == 3 and wt == 2:
                mod.computations.append(_computation(buf, v[0], v[1]))
            elif fno == 5 and wt == 0:
                mod.id = signed(v)
            elif fno == 6 and wt == 0:
                mod.entry_computation_id = signed(v)
        return mod
    except WireError as e:
        raise FormatError(path, f"malformed 'Hlo Proto' stat ({e})", FORMAT_TODO) from None
