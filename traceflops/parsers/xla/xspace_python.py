"""The XSpace reader (`decode_xspace`): a serialized XSpace → `xspace_model` dataclasses, bounded by `wire`.

Why by hand: it needs nothing but the standard library (no `protobuf` runtime, no
copy of the schema), and it counts each container's messages against the input's
budget as it reads them, so hostile input is refused before it is built
(the protobuf runtime would decode the whole buffer before anything could be counted).

XPlane messages are read in two passes: the stat/event metadata first (it is
serialized after the lines), so each event's stats come back as a name→value
dict with `ref_value`s already resolved to the referenced string.
"""

from __future__ import annotations

from typing import Any

from traceflops.core.errors import FormatError
from traceflops.parsers.xla.wire import (
    DOUBLE,
    FORMAT_TODO,
    I64,
    U64,
    Budget,
    TooManyMessages,
    WireError,
    bad,
    fields,
    packed_ints,
    signed,
    too_many,
    varint,
    wire_str,
)
from traceflops.parsers.xla.xspace_model import (
    XEvent,
    XEventMetadata,
    XLine,
    XPlane,
    XSpace,
)


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
                    bad("truncated or overlong varint")
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
                val = v & (U64 - 1)
            elif fno == 4:
                val = signed(v)
            elif fno == 7:
                ref = ctx.names.get(v)
                if ref is None:
                    ctx.unknown += 1
                val = ref
        elif wt == 2:
            b = buf[pos] if pos < end else bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                bad("stat value runs past its message")
            fno = tag >> 3
            if fno == 5:
                val = buf[pos:stop].decode("utf-8", "replace")
            elif fno == 6:
                val = buf[pos:stop]
            pos = stop
        elif wt == 1:
            if pos + 8 > end:
                bad("truncated fixed64")
            if tag >> 3 == 2:
                val = DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                bad("truncated fixed32")
            pos += 4
        else:
            bad(f"unsupported wire type {wt} in a stat")
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
    stats: dict[str, Any] | None = None
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
                    bad("truncated or overlong varint")
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
                off = v if v < I64 else signed(v)
            elif fno == 3:
                dur = v if v < I64 else signed(v)
            elif fno == 5:
                occ = v if v < I64 else signed(v)
        elif wt == 2:
            b = buf[pos] if pos < end else bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                bad("event field runs past its message")
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
                bad("truncated fixed64")
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                bad("truncated fixed32")
            pos += 4
        else:
            bad(f"unsupported wire type {wt} in an event")
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
                line.name = wire_str(buf, v)
            elif fno == 11:
                line.display_name = wire_str(buf, v)
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
            plane.name = wire_str(buf, v)
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
                    name = wire_str(buf, v)
                elif fno == 3 and wt == 2:
                    desc = wire_str(buf, v)
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
                    md.name = wire_str(buf, v)
                elif fno == 4:
                    md.display_name = wire_str(buf, v)
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


def decode_xspace(buf: bytes, path: str | None = None) -> XSpace:
    """Decode a serialized XSpace; raises FormatError on malformed input or more messages than `wire.Budget` allows."""
    try:
        space = XSpace()
        budget = Budget(len(buf))
        for fno, wt, v in fields(buf, 0, len(buf), budget, "planes and strings"):
            if wt != 2:
                continue
            if fno == 1:
                space.planes.append(_plane(buf, v[0], v[1], budget=budget))
            elif fno == 2:
                space.errors.append(wire_str(buf, v))
            elif fno == 3:
                space.warnings.append(wire_str(buf, v))
            elif fno == 4:
                space.hostnames.append(wire_str(buf, v))
        return space
    except WireError as e:
        raise FormatError(path, f"not a valid XSpace protobuf ({e})", FORMAT_TODO) from None
    except TooManyMessages as e:
        raise too_many(path, e) from None
    except RecursionError:  # pragma: no cover - the walk is iterative; belt and braces
        raise FormatError(path, "XSpace nesting too deep", FORMAT_TODO) from None
