"""A small, bounded protobuf wire-format reader for XSpace (`xplane.proto`) and HloProto.

No TensorFlow, no `protobuf` runtime: the two schemas are read field by field
from their numbers (tsl/profiler/protobuf/xplane.proto, xla/service/hlo.proto,
xla/xla_data.proto). The input is untrusted, so every length is checked against
the bytes that enclose it, varints are at most 10 bytes, nesting is a fixed
schema walk (the one self-nested message, ShapeProto's tuple_shapes, is cut at
`MAX_DEPTH`), and any inconsistency raises `FormatError`, never an IndexError
or a hang. Unknown fields are skipped (the schemas grow).

Decoded messages are bounded per input byte (`message_bound`): an empty
message is 2 bytes on the wire and ~1.3 KB once decoded, so 8 MB of empty
XEvents would take minutes and gigabytes. Real profiles hold one message
(plane, line, event, metadata entry) per 28 bytes or more, and one event stat
(a dict entry, not an object) per 10 or more; the bound is one message per
`BYTES_PER_MESSAGE` bytes (at least `MIN_MESSAGES`) or
TRACEFLOPS_XSPACE_MAX_MESSAGES, and four times as many event stats. Both
readers count before they build: the protobuf runtime's message counts, this
reader's fields of each container (its scalars too: a few more).

XPlane messages are read in two passes: the stat/event metadata first (it is
serialized after the lines), so each event's stats come back as a name→value
dict with `ref_value`s already resolved to the referenced string.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from traceflops.core.errors import FormatError

MAX_DEPTH = 16  # nested tuple shapes
_U64 = 1 << 64
_I64 = 1 << 63
_DOUBLE = struct.Struct("<d")
_TODO = "re-export the profile (the file is truncated or not an XSpace protobuf)"


MAX_MESSAGES_ENV = "TRACEFLOPS_XSPACE_MAX_MESSAGES"
BYTES_PER_MESSAGE = 12
MIN_MESSAGES = 100_000
STATS_PER_MESSAGE = 4


class WireError(Exception):
    """Raised inside the decoder; turned into FormatError with the path at the boundary."""


class TooManyMessages(Exception):
    """More decoded messages than the input's bound (`Budget`); `too_many` makes it the one-line FormatError."""

    def __init__(self, what: str, bound: int, n_bytes: int):
        super().__init__(what)
        self.what, self.bound, self.n_bytes = what, bound, n_bytes


def message_bound(n_bytes: int) -> int:
    """How many messages an XSpace of n_bytes may decode into: TRACEFLOPS_XSPACE_MAX_MESSAGES when it is a whole
    number, else one per BYTES_PER_MESSAGE bytes and at least MIN_MESSAGES."""
    import os

    env = os.environ.get(MAX_MESSAGES_ENV, "").strip()
    if env.isdigit():
        return int(env)
    return max(MIN_MESSAGES, n_bytes // BYTES_PER_MESSAGE)


class Budget:
    """Messages left to decode; `take` raises TooManyMessages past the bound, before the messages are built."""

    __slots__ = ("bound", "left", "n_bytes", "stats_left")

    def __init__(self, n_bytes: int):
        self.bound = self.left = message_bound(n_bytes)
        self.stats_left = STATS_PER_MESSAGE * self.bound
        self.n_bytes = n_bytes

    def take(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise TooManyMessages(what, self.bound, self.n_bytes)

    def take_stats(self, n: int, what: str) -> None:
        """Stats of events and of event metadata: dict entries, four allowed for each message."""
        self.stats_left -= n
        if self.stats_left < 0:
            raise TooManyMessages(what, STATS_PER_MESSAGE * self.bound, self.n_bytes)


def too_many(path: str | None, e: TooManyMessages) -> FormatError:
    """The error line: the file, what overflowed, and how to go on."""
    return FormatError(path, f"more than {e.bound:,} messages ({e.what}) in {e.n_bytes:,} bytes of XSpace: not a real profile's "
                       f"density (one message per {BYTES_PER_MESSAGE} bytes, {STATS_PER_MESSAGE} event stats per message at most)",
                       f"re-export the profile, or set {MAX_MESSAGES_ENV}=N (messages) to raise the bound")


def _bad(what: str):
    raise WireError(what)


# --------------------------------------------------------------------------------------
# wire primitives
# --------------------------------------------------------------------------------------


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    b = buf[pos] if pos < end else _bad("truncated varint")
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            _bad("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            _bad("varint longer than 10 bytes")


def signed(v: int) -> int:
    """int64 from its (two's complement, 64-bit) varint value."""
    v &= _U64 - 1
    return v - _U64 if v >= _I64 else v


def fields(buf: bytes, pos: int, end: int, budget: Budget | None = None, what: str = "fields"):
    """(field number, wire type, value) for each field in buf[pos:end].

    value: int for varint / fixed64 / fixed32 (raw bits), (start, stop) for
    length-delimited. Groups (deprecated wire types 3/4) are rejected.
    With a `budget`, the fields are taken from it: counted while they are read
    when the span could hold more than it has left (a field is 2 bytes at least).
    """
    out = []
    append = out.append
    capped = budget is not None and (end - pos) // 2 > budget.left
    while pos < end:
        if capped and len(out) > budget.left:
            budget.take(len(out), what)
        b = buf[pos]
        if b < 0x80:
            tag = b
            pos += 1
        else:
            tag, pos = varint(buf, pos, end)
        wt = tag & 7
        fno = tag >> 3
        if fno == 0:
            _bad("field number 0")
        if wt == 0:
            b = buf[pos] if pos < end else _bad("truncated varint")
            if b < 0x80:
                append((fno, 0, b))
                pos += 1
            else:
                v, pos = varint(buf, pos, end)
                append((fno, 0, v))
        elif wt == 2:
            b = buf[pos] if pos < end else _bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                _bad(f"field {fno}: length {n} runs past its message")
            append((fno, 2, (pos, stop)))
            pos = stop
        elif wt == 1:
            if pos + 8 > end:
                _bad("truncated fixed64")
            append((fno, 1, int.from_bytes(buf[pos : pos + 8], "little")))
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                _bad("truncated fixed32")
            append((fno, 5, int.from_bytes(buf[pos : pos + 4], "little")))
            pos += 4
        else:
            _bad(f"unsupported wire type {wt} (field {fno})")
    if budget is not None:
        budget.take(len(out), what)
    return out


def _str(buf: bytes, span: tuple[int, int]) -> str:
    return buf[span[0] : span[1]].decode("utf-8", "replace")


def _double(bits: int) -> float:
    return _DOUBLE.unpack(bits.to_bytes(8, "little"))[0]


def packed_ints(buf: bytes, wt: int, v, into: list, *, is_signed: bool = True) -> None:
    """Append a repeated int64 field's values (packed or not) to `into`."""
    if wt == 0:
        into.append(signed(v) if is_signed else v)
        return
    if wt != 2:
        _bad("repeated integer field with a non-varint wire type")
    pos, stop = v
    while pos < stop:
        x, pos = varint(buf, pos, stop)
        into.append(signed(x) if is_signed else x)


# --------------------------------------------------------------------------------------
# XSpace
# --------------------------------------------------------------------------------------


@dataclass(slots=True)
class XEventMetadata:
    id: int
    name: str = ""
    display_name: str = ""
    metadata: bytes = b""
    stats: dict[str, Any] = field(default_factory=dict)
    child_id: list[int] = field(default_factory=list)


@dataclass(slots=True)
class XEvent:
    metadata_id: int
    offset_ps: int
    num_occurrences: int
    duration_ps: int
    stats: dict[str, Any] | None  # None when the event has none


@dataclass(slots=True)
class XLine:
    id: int = 0
    display_id: int = 0
    name: str = ""
    display_name: str = ""
    timestamp_ns: int = 0
    duration_ps: int = 0
    events: list[XEvent] = field(default_factory=list)


@dataclass(slots=True)
class XPlane:
    id: int = 0
    name: str = ""
    lines: list[XLine] = field(default_factory=list)
    event_metadata: dict[int, XEventMetadata] = field(default_factory=dict)
    stat_metadata: dict[int, str] = field(default_factory=dict)  # id -> name
    stat_descriptions: dict[int, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    unknown_stats: int = 0  # stats whose metadata id is not in stat_metadata


@dataclass(slots=True)
class XSpace:
    planes: list[XPlane] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)


class _PlaneCtx:
    __slots__ = ("budget", "buf", "names", "unknown")

    def __init__(self, buf: bytes, names: dict[int, str], budget: Budget | None = None):
        self.buf = buf
        self.names = names
        self.unknown = 0
        self.budget = budget


def _stat(ctx: _PlaneCtx, pos: int, end: int, out: dict) -> None:
    """One XStat into out[name] = value (ref_value resolved to the referenced name).

    Hand-inlined field loop: stats are the most numerous messages in a profile.
    """
    buf = ctx.buf
    mid = 0
    val: Any = None
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = varint(buf, pos - 1, end)
        wt = tag & 7
        if wt == 0:
            v = 0
            shift = 0
            while True:
                if pos >= end or shift >= 70:
                    _bad("truncated or overlong varint")
                b = buf[pos]
                pos += 1
                v |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
            fno = tag >> 3
            if fno == 1:
                mid = v
            elif fno == 3:
                val = v & (_U64 - 1)
            elif fno == 4:
                val = signed(v)
            elif fno == 7:
                ref = ctx.names.get(v)
                if ref is None:
                    ctx.unknown += 1
                val = ref
        elif wt == 2:
            b = buf[pos] if pos < end else _bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                _bad("stat value runs past its message")
            fno = tag >> 3
            if fno == 5:
                val = buf[pos:stop].decode("utf-8", "replace")
            elif fno == 6:
                val = buf[pos:stop]
            pos = stop
        elif wt == 1:
            if pos + 8 > end:
                _bad("truncated fixed64")
            if tag >> 3 == 2:
                val = _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                _bad("truncated fixed32")
            pos += 4
        else:
            _bad(f"unsupported wire type {wt} in a stat")
    name = ctx.names.get(mid)
    if name is None:
        ctx.unknown += 1
        return
    out[name] = val


def _stats_of(ctx: _PlaneCtx, spans: list) -> dict:
    d: dict = {}
    for s, e in spans:
        _stat(ctx, s, e, d)
    return d


def _event(ctx: _PlaneCtx, pos: int, end: int) -> XEvent:
    buf = ctx.buf
    mid = off = dur = occ = 0
    stats = None
    nst = 0
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = varint(buf, pos - 1, end)
        wt = tag & 7
        if wt == 0:
            # inline varint (offsets and durations are several bytes long)
            v = 0
            shift = 0
            while True:
                if pos >= end or shift >= 70:
                    _bad("truncated or overlong varint")
                b = buf[pos]
                pos += 1
                v |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
            fno = tag >> 3
            if fno == 1:
                mid = v
            elif fno == 2:
                off = v if v < _I64 else signed(v)
            elif fno == 3:
                dur = v if v < _I64 else signed(v)
            elif fno == 5:
                occ = v if v < _I64 else signed(v)
        elif wt == 2:
            b = buf[pos] if pos < end else _bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                _bad("event field runs past its message")
            if tag >> 3 == 4:
                if stats is None:
                    stats = {}
                nst += 1
                if ctx.budget is not None and nst > ctx.budget.stats_left:
                    ctx.budget.take_stats(nst, "stats of one event")
                _stat(ctx, pos, stop, stats)
            pos = stop
        elif wt == 1:
            if pos + 8 > end:
                _bad("truncated fixed64")
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                _bad("truncated fixed32")
            pos += 4
        else:
            _bad(f"unsupported wire type {wt} in an event")
    if nst and ctx.budget is not None:
        ctx.budget.take_stats(nst, "event stats")
    return XEvent(mid, off, occ, dur, stats)


def _line(ctx: _PlaneCtx, pos: int, end: int) -> XLine:
    buf = ctx.buf
    line = XLine()
    for fno, wt, v in fields(buf, pos, end, ctx.budget, "events of one line"):
        if wt == 0:
            if fno == 1:
                line.id = signed(v)
            elif fno == 10:
                line.display_id = signed(v)
            elif fno == 3:
                line.timestamp_ns = signed(v)
            elif fno == 9:
                line.duration_ps = signed(v)
        elif wt == 2:
            if fno == 4:
                line.events.append(_event(ctx, v[0], v[1]))
            elif fno == 2:
                line.name = _str(buf, v)
            elif fno == 11:
                line.display_name = _str(buf, v)
    return line


def _map_entry(buf: bytes, pos: int, end: int) -> tuple[int, tuple[int, int] | None]:
    key, value = 0, None
    for fno, wt, v in fields(buf, pos, end):
        if fno == 1 and wt == 0:
            key = signed(v)
        elif fno == 2 and wt == 2:
            value = v
    return key, value


def _plane(buf: bytes, pos: int, end: int, *, with_lines: bool = True, budget: Budget | None = None) -> XPlane:
    plane = XPlane()
    line_spans, em_spans, sm_spans, stat_spans = [], [], [], []
    for fno, wt, v in fields(buf, pos, end, budget, "lines, metadata and stats of one plane"):
        if fno == 1 and wt == 0:
            plane.id = signed(v)
        elif wt != 2:
            continue
        elif fno == 2:
            plane.name = _str(buf, v)
        elif fno == 3:
            line_spans.append(v)
        elif fno == 4:
            em_spans.append(v)
        elif fno == 5:
            sm_spans.append(v)
        elif fno == 6:
            stat_spans.append(v)
    names: dict[int, str] = {}
    for s, e in sm_spans:
        key, val = _map_entry(buf, s, e)
        name, desc = "", ""
        if val is not None:
            for fno, wt, v in fields(buf, val[0], val[1], budget, "stat metadata fields"):
                if fno == 2 and wt == 2:
                    name = _str(buf, v)
                elif fno == 3 and wt == 2:
                    desc = _str(buf, v)
        names[key] = name
        if desc:
            plane.stat_descriptions[key] = desc
    plane.stat_metadata = names
    ctx = _PlaneCtx(buf, names, budget)
    for s, e in em_spans:
        key, val = _map_entry(buf, s, e)
        md = XEventMetadata(key)
        if val is not None:
            sspans = []
            for fno, wt, v in fields(buf, val[0], val[1], budget, "event metadata fields"):
                if fno == 6:
                    packed_ints(buf, wt, v, md.child_id)
                elif wt != 2:
                    continue
                elif fno == 2:
                    md.name = _str(buf, v)
                elif fno == 4:
                    md.display_name = _str(buf, v)
                elif fno == 3:
                    md.metadata = buf[v[0] : v[1]]
                elif fno == 5:
                    sspans.append(v)
            if sspans:
                md.stats = _stats_of(ctx, sspans)
        plane.event_metadata[key] = md
    plane.stats = _stats_of(ctx, stat_spans)
    if with_lines:
        plane.lines = [_line(ctx, s, e) for s, e in line_spans]
    plane.unknown_stats = ctx.unknown
    return plane


def decode_xspace_python(buf: bytes, path: str | None = None) -> XSpace:
    """The pure-Python reader."""
    try:
        space = XSpace()
        budget = Budget(len(buf))
        for fno, wt, v in fields(buf, 0, len(buf), budget, "planes and strings"):
            if wt != 2:
                continue
            if fno == 1:
                space.planes.append(_plane(buf, v[0], v[1], budget=budget))
            elif fno == 2:
                space.errors.append(_str(buf, v))
            elif fno == 3:
                space.warnings.append(_str(buf, v))
            elif fno == 4:
                space.hostnames.append(_str(buf, v))
        return space
    except WireError as e:
        raise FormatError(path, f"not a valid XSpace protobuf ({e})", _TODO) from None
    except TooManyMessages as e:
        raise too_many(path, e) from None
    except RecursionError:  # pragma: no cover - the walk is iterative; belt and braces
        raise FormatError(path, "XSpace nesting too deep", _TODO) from None


# --------------------------------------------------------------------------------------
# HloProto (the `Hlo Proto` stat of /host:metadata)
# --------------------------------------------------------------------------------------

# xla.PrimitiveType → (name, bytes per element); sub-byte types use a fractional size.
PRIMITIVE_TYPES: dict[int, tuple[str, float]] = {
    1: ("pred", 1), 2: ("s8", 1), 3: ("s16", 2), 4: ("s32", 4), 5: ("s64", 8),
    6: ("u8", 1), 7: ("u16", 2), 8: ("u32", 4), 9: ("u64", 8),
    10: ("f16", 2), 11: ("f32", 4), 12: ("f64", 8), 13: ("tuple", 0), 14: ("opaque", 0),
    15: ("c64", 8), 16: ("bf16", 2), 17: ("token", 0), 18: ("c128", 16),
    19: ("f8e5m2", 1), 20: ("f8e4m3fn", 1), 21: ("s4", 0.5), 22: ("u4", 0.5),
    23: ("f8e4m3b11fnuz", 1), 24: ("f8e5m2fnuz", 1), 25: ("f8e4m3fnuz", 1),
    26: ("s2", 0.25), 27: ("u2", 0.25), 28: ("f8e4m3", 1), 29: ("f8e3m4", 1),
    30: ("s1", 0.125), 31: ("u1", 0.125), 32: ("f4e2m1fn", 0.5), 33: ("f8e8m0fnu", 1),
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
        _bad(f"shape nesting deeper than {MAX_DEPTH}")
    et, dims, tup = 0, [], []
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
_CONV_SCALAR = {7: "input_batch", 8: "input_feature", 3: "kernel_input_feature", 4: "kernel_output_feature", 9: "output_batch", 10: "output_feature"}
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
            ins.name = _str(buf, v)
        elif fno == 2:
            ins.opcode = _str(buf, v)
        elif fno == 3:
            ins.shape = _shape(buf, v[0], v[1])
        elif fno == 7:
            for f2, w2, v2 in fields(buf, v[0], v[1]):
                if w2 == 2 and f2 == 2:
                    ins.op_name = _str(buf, v2)
                elif w2 == 2 and f2 == 1:
                    ins.op_type = _str(buf, v2)
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
            ins.custom_call_target = _str(buf, v)
        elif fno == 11:
            ins.fusion_kind = _str(buf, v)
        elif fno == 43:
            ins.backend_config = buf[v[0] : v[1]]
    return ins


def _computation(buf: bytes, pos: int, end: int) -> HloComputation:
    comp = HloComputation()
    for fno, wt, v in fields(buf, pos, end):
        if fno == 1 and wt == 2:
            comp.name = _str(buf, v)
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
                mod.name = _str(buf, v)
            elif fno == 2 and wt == 2:
                mod.entry_computation_name = _str(buf, v)
            elif fno == 3 and wt == 2:
                mod.computations.append(_computation(buf, v[0], v[1]))
            elif fno == 5 and wt == 0:
                mod.id = signed(v)
            elif fno == 6 and wt == 0:
                mod.entry_computation_id = signed(v)
        return mod
    except WireError as e:
        raise FormatError(path, f"malformed 'Hlo Proto' stat ({e})", _TODO) from None
