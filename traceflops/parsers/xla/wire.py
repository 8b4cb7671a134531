"""Protobuf wire-format primitives and the decoded-message budget: the bounded base both hand readers stand on.

Why apart: the XSpace reader (`xspace_python`) and the HloProto reader (`hlo_proto`)
share these checks, so both bound untrusted input the same way.

No TensorFlow, no `protobuf` runtime: the two schemas are read field by field
from their numbers (tsl/profiler/protobuf/xplane.proto, xla/service/hlo.proto,
xla/xla_data.proto). The input is untrusted, so every length is checked against
the bytes that enclose it, varints are at most 10 bytes, nesting is a fixed
schema walk (the one self-nested message, ShapeProto's tuple_shapes, is cut at
`hlo_proto.MAX_DEPTH`), and any inconsistency raises `FormatError`, never an IndexError
or a hang. Unknown fields are skipped (the schemas grow).

Decoded messages are bounded per input byte (`message_bound`): an empty
message is 2 bytes on the wire and ~1.3 KB once decoded, so 8 MB of empty
XEvents would take minutes and gigabytes. Real profiles hold one message
(plane, line, event, metadata entry) per 28 bytes or more, and one event stat
(a dict entry, not an object) per 10 or more; the bound is one message per
`BYTES_PER_MESSAGE` bytes (at least `MIN_MESSAGES`) or
TRACEFLOPS_XSPACE_MAX_MESSAGES, and four times as many event stats. The XSpace
reader counts before it builds: the fields of each container (its scalars too: a few more).
"""

from __future__ import annotations

import struct
from typing import Any

from traceflops.core.errors import FormatError

U64 = 1 << 64
I64 = 1 << 63
DOUBLE = struct.Struct("<d")
FORMAT_TODO = "re-export the profile (the file is truncated or not an XSpace protobuf)"

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
    return FormatError(
        path,
        f"more than {e.bound:,} messages ({e.what}) in {e.n_bytes:,} bytes of XSpace: not a real profile's "
        f"density (one message per {BYTES_PER_MESSAGE} bytes, {STATS_PER_MESSAGE} event stats per message at most)",
        f"re-export the profile, or set {MAX_MESSAGES_ENV}=N (messages) to raise the bound",
    )


def bad(what: str):
    raise WireError(what)


# --------------------------------------------------------------------------------------
# wire primitives
# --------------------------------------------------------------------------------------


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    b = buf[pos] if pos < end else bad("truncated varint")
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            bad("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            bad("varint longer than 10 bytes")


def signed(v: int) -> int:
    """int64 from its (two's complement, 64-bit) varint value."""
    v &= U64 - 1
    return v - U64 if v >= I64 else v


def fields(buf: bytes, pos: int, end: int, budget: Budget | None = None, what: str = "fields"):
    """(field number, wire type, value) for each field in buf[pos:end].

    value: int for varint / fixed64 / fixed32 (raw bits), (start, stop) for
    length-delimited. Groups (deprecated wire types 3/4) are rejected.
    With a `budget`, the fields are taken from it: counted while they are read
    when the span could hold more than it has left (a field is 2 bytes at least).
    """
    out: list[tuple[int, int, Any]] = []  # the value's type follows the wire type
    append = out.append
    capped = budget is not None and (end - pos) // 2 > budget.left
    while pos < end:
        if capped and budget is not None and len(out) > budget.left:
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
            bad("field number 0")
        if wt == 0:
            b = buf[pos] if pos < end else bad("truncated varint")
            if b < 0x80:
                append((fno, 0, b))
                pos += 1
            else:
                v, pos = varint(buf, pos, end)
                append((fno, 0, v))
        elif wt == 2:
            b = buf[pos] if pos < end else bad("truncated length")
            if b < 0x80:
                n = b
                pos += 1
            else:
                n, pos = varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                bad(f"field {fno}: length {n} runs past its message")
            append((fno, 2, (pos, stop)))
            pos = stop
        elif wt == 1:
            if pos + 8 > end:
                bad("truncated fixed64")
            append((fno, 1, int.from_bytes(buf[pos : pos + 8], "little")))
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                bad("truncated fixed32")
            append((fno, 5, int.from_bytes(buf[pos : pos + 4], "little")))
            pos += 4
        else:
            bad(f"unsupported wire type {wt} (field {fno})")
    if budget is not None:
        budget.take(len(out), what)
    return out


def wire_str(buf: bytes, span: tuple[int, int]) -> str:
    return buf[span[0] : span[1]].decode("utf-8", "replace")


def packed_ints(buf: bytes, wt: int, v, into: list, *, is_signed: bool = True) -> None:
    """Append a repeated int64 field's values (packed or not) to `into`."""
    if wt == 0:
        into.append(signed(v) if is_signed else v)
        return
    if wt != 2:
        bad("repeated integer field with a non-varint wire type")
    pos, stop = v
    while pos < stop:
        x, pos = varint(buf, pos, stop)
        into.append(signed(x) if is_signed else x)
