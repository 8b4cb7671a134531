"""Streaming split of a chrome-trace JSON document into batches of whole events.

The file is read in chunks (decompressing as it goes). Each chunk is cut at its
last likely boundary between events, and a validating skim in C proves the
cut; where it does not, numpy finds the string, escape and nesting structure
of the chunk. The rest of the top-level object (device
properties, distributed info) comes out as a small document of its own. Neither the whole file nor its decoded form is held
at once. A document cut short yields every event that was complete.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from traceflops.core.errors import FormatError
from traceflops.parsers.io import chunks

_QUOTE, _BSLASH = ord('"'), ord("\\")
_OPEN = (ord("{"), ord("["))
_CLOSE = (ord("}"), ord("]"))
_KEY = b'"traceEvents"'


@dataclass
class StreamResult:
    head: bytes = b""  # the top-level object without its traceEvents array
    truncated: bool = False  # the document ended before it was closed
    stray: int = 0  # array entries after the last object that are not objects
    events_complete: bool = False  # the traceEvents array closed: a cut, if any, came after it
    notes: list[str] = field(default_factory=list)


class _Scanner:
    """Carries string/escape/depth state across chunks and cuts events out of them."""

    def __init__(self) -> None:
        self.in_string = False
        self.escaped = False  # the previous chunk ended inside an odd run of backslashes
        self.depth = 0
        self.state = "before"  # before | key | array | after
        self.head = bytearray()
        self.pending = bytearray()  # bytes of the event in progress (array state)
        self.prefix = bytearray()  # bytes before the array, while looking for it
        self.stray = 0

    def structure(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of structural (outside-string) braces/brackets, and the depth after each.

        Works on the sparse positions of quotes, backslashes and braces only: a
        quote is escaped by an odd run of backslashes before it (runs carry over
        chunks), a brace is structural when an even number of real quotes precede it.
        """
        n = len(buf)
        quotes = np.flatnonzero(buf == _QUOTE)
        bs = np.flatnonzero(buf == _BSLASH)
        braces = np.flatnonzero((buf == _OPEN[0]) | (buf == _OPEN[1]) | (buf == _CLOSE[0]) | (buf == _CLOSE[1]))
        # Backslash runs: start position of the run each backslash belongs to.
        if len(bs):
            new_run = np.empty(len(bs), dtype=bool)
            new_run[0] = True
            new_run[1:] = np.diff(bs) != 1
            run_start = np.maximum.accumulate(np.where(new_run, bs, 0))
            carried = (run_start == 0) & (bs[0] == 0) if self.escaped else np.zeros(len(bs), dtype=bool)
        # Real quotes: not preceded by an odd run of backslashes.
        if len(quotes) and (len(bs) or self.escaped):
            k = np.searchsorted(bs, quotes) if len(bs) else np.zeros(len(quotes), dtype=np.int64)
            run_len = np.zeros(len(quotes), dtype=np.int64)
            if len(bs):
                prev = np.maximum(k - 1, 0)
                adjacent = (k > 0) & (bs[prev] == quotes - 1)
                run_len = np.where(adjacent, quotes - run_start[prev], 0)
                run_len = run_len + np.where(adjacent & carried[prev], 1, 0)
            if self.escaped:
                run_len = np.where(quotes == 0, 1, run_len)  # the chunk starts right after an odd run
            real = quotes[run_len % 2 == 0]
        else:
            real = quotes
        before = np.searchsorted(real, braces) + (1 if self.in_string else 0)
        struct = braces[before % 2 == 0]
        delta = np.where((buf[struct] == _OPEN[0]) | (buf[struct] == _OPEN[1]), 1, -1)
        depth_after = self.depth + np.cumsum(delta, dtype=np.int64)
        # Carry the state into the next chunk.
        self.in_string = (len(real) + (1 if self.in_string else 0)) % 2 == 1
        if n and buf[-1] == _BSLASH:
            tail = n - int(run_start[-1])
            if int(run_start[-1]) == 0 and bs[0] == 0 and self.escaped:
                tail += 1
            self.escaped = tail % 2 == 1
        else:
            self.escaped = False
        return struct, depth_after

    def enter(self, data: bytes) -> bytes | None:
        """Before the array: the bytes after its '[' once it has arrived, else None (kept for the next chunk)."""
        # The prefix before the array is small: rescan it whole until the key and '[' are in.
        self.prefix += data
        at = _locate(bytes(self.prefix))
        if at is None:
            return None
        self.head += self.prefix[:at]
        rest = bytes(self.prefix[at + 1 :])
        self.prefix = bytearray()
        self.state, self.depth, self.in_string, self.escaped = "array", 2, False, False
        return rest

    def feed(self, data: bytes) -> list[bytes]:
        """Consume a chunk inside the array (see `enter`); return the complete events it closed (raw JSON objects)."""
        if self.state == "after":
            self.head += data
            return []
        buf = np.frombuffer(data, dtype=np.uint8)
        if len(buf) == 0:
            return []
        struct, depth_after = self.structure(buf)
        array_end = struct[depth_after == 1]
        stop = int(array_end[0]) if len(array_end) else len(data)
        ends = struct[(depth_after == 2) & (struct < stop) & np.isin(buf[struct], _CLOSE)]
        # One block per chunk: the run of complete events, separators included, decoded as one array.
        events: list[bytes] = []
        start = 0
        if len(ends):
            last = int(ends[-1]) + 1
            block = data[:last]
            if self.pending:
                block = bytes(self.pending) + block
                self.pending.clear()
            events.append(block)
            start = last
        if stop < len(data):
            leftover = (bytes(self.pending) + data[start:stop]).strip(b", \n\r\t")
            if leftover:
                self.stray += leftover.count(b",") + 1
            self.pending.clear()
            self.state = "after"
            self.head += b"[]"  # the head stays a valid object: "traceEvents": []
            self.head += data[stop + 1 :]
        else:
            # between events only separators: keep nothing until an event starts
            self.pending += data[start:] if self.pending else data[start:].lstrip(b", \n\r\t")
        if len(depth_after):
            self.depth = int(depth_after[-1])
        return events


def split_events(block: bytes) -> list[bytes]:
    """The events of a block (a run of array entries), one by one: the slow path for a bad block."""
    sc = _Scanner()
    sc.depth = 2
    buf = np.frombuffer(block, dtype=np.uint8)
    if len(buf) == 0:
        return []
    struct, depth_after = sc.structure(buf)
    ends = struct[(depth_after == 2) & np.isin(buf[struct], _CLOSE)]
    out, start = [], 0
    for e in ends.tolist():
        out.append(block[start : e + 1])
        start = e + 1
    if block[start:].strip(b", \n\r\t"):
        out.append(block[start:])
    return out


def _locate(prefix: bytes) -> int | None:
    """Offset of the '[' that opens the root object's traceEvents array, once it has arrived."""
    sc = _Scanner()
    struct, depth_after = sc.structure(np.frombuffer(prefix, dtype=np.uint8))
    at = prefix.find(_KEY)
    while at != -1:
        i = np.searchsorted(struct, at)
        depth_here = int(depth_after[i - 1]) if i > 0 else 0
        in_root = depth_here == 1 and _outside_string(prefix, at, struct)
        colon = prefix.find(b":", at + len(_KEY))
        if in_root and colon != -1 and not prefix[at + len(_KEY) : colon].strip():
            j = colon + 1
            while j < len(prefix) and prefix[j : j + 1].isspace():
                j += 1
            if j < len(prefix):
                return j if prefix[j : j + 1] == b"[" else None
            return None  # the value has not arrived yet
        at = prefix.find(_KEY, at + 1)
    return None


def _outside_string(prefix: bytes, at: int, struct: np.ndarray) -> bool:
    """The key's opening quote is a real quote starting a string at root level."""
    sc = _Scanner()
    sc.structure(np.frombuffer(prefix[:at], dtype=np.uint8)) if at else None
    return not sc.in_string


_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_SEP = b", \n\r\t"


def last_cut(data: bytes) -> int:
    """Offset just past the last '}' followed by ', {': a likely boundary between two events, or -1.

    Only a likely one: it may sit inside a string or an event's args. The
    caller proves it by decoding what precedes it (see `stream_events`).
    """
    n = len(data)
    for window in (1 << 16, 1 << 20, n):
        lo = max(0, n - window)
        found = None
        for found in _CUT.finditer(data, lo):
            pass
        if found is not None:
            return found.start() + 1
        if lo == 0:
            break
    return -1


def _wrap(entries: bytes) -> bytes:
    return b"[" + entries.lstrip(_SEP) + b"]"


def _as_array(pending: bytes, data: bytes, end: int) -> bytearray:
    """'[' + pending + data[:end] + ']' in one buffer: each chunk is copied once."""
    start = 0
    if not pending:
        while start < end and data[start] in _SEP:
            start += 1
    buf = bytearray(b"[")
    buf += pending
    buf += memoryview(data)[start:end]
    buf += b"]"
    return buf


_PROOF = msgspec.json.Decoder(msgspec.Raw)


def _whole(text: bytearray) -> bool:
    """The text is one complete JSON array (msgspec skips it in C, validating, with nothing after it)."""
    try:
        _PROOF.decode(text)
        return True
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


REFUSED = object()  # a claim's answer: the array did not decode whole, so its cut is not proven


@dataclass
class Claimed:
    """An array a claim decoded (and so proved) as it was cut: its decoded value."""

    value: Any


def stream_events(path: str, limit: int, chunk: int = 8 << 20, progress=None, claim=None) -> Iterator[tuple[list, StreamResult]]:
    """The traceEvents array as JSON arrays of whole entries, chunk by chunk; the last yield carries the head.

    The fast path cuts each chunk at its last likely event boundary and proves
    the cut by checking, in C, that the text before it is a sequence of complete
    JSON values. Every array starts between two entries, so one that holds only
    complete values also ends between two entries: no structural scan is
    needed, and the typed decode can run anywhere (another process). A cut that
    fails the proof (an odd layout, a malformed event, the array's end) sends
    that chunk through the structural scanner. Either way each array yielded
    holds whole entries; entries that are not events are the decoder's to count.

    `claim(text)`, if given, may decode a cut array strictly itself: a decode
    that succeeds is the proof (no skim), and the stream yields `Claimed(value)`
    in its place; REFUSED sends the chunk to the scanner; None leaves the array
    to be skimmed and yielded as text.
    """
    sc = _Scanner()
    res = StreamResult()
    pending = b""  # bytes from the start of an entry (between entries) to the end of what was read
    first = True

    def scan(data: bytes) -> list[bytes]:
        nonlocal pending
        sc.depth, sc.in_string, sc.escaped = 2, False, False
        out = [_wrap(b) for b in sc.feed(data)]
        pending = bytes(sc.pending)
        sc.pending.clear()
        return out

    for data in chunks(path, limit, chunk, progress):
        if first:
            if not data.lstrip().startswith(b"{"):
                raise FormatError(path, "not a JSON object (a Kineto trace is a JSON object with traceEvents)", "pass a PyTorch profiler trace")
            first = False
        if sc.state == "before":
            data = sc.enter(data)
            if data is None:
                continue
            data = data.lstrip(_SEP)  # the rest of the chunk takes the fast path like any other
        if sc.state == "after":
            sc.head += data
            continue
        cut = last_cut(data)
        if cut >= 0:
            text = _as_array(pending, data, cut)
            got = claim(text) if claim is not None else None
            if got is None:
                proven, item = _whole(text), text
            else:
                proven, item = got is not REFUSED, Claimed(got)
            if proven:
                pending = data[cut:].lstrip(_SEP)
                yield [item], res
                continue
        elif len(pending) < 4 * chunk:
            pending = pending + data if pending else data.lstrip(_SEP)  # no boundary yet: an entry longer than a chunk
            continue
        yield scan(pending + data), res
    if first:
        raise FormatError(path, "the file is empty", "re-export the trace")
    if sc.state == "array" and pending:
        yield scan(pending), res
    res.stray = sc.stray
    res.events_complete = sc.state == "after"
    res.truncated = sc.state in ("before", "array") or (sc.state == "after" and not bytes(sc.head).rstrip().endswith(b"}"))
    if sc.state == "before":
        raise FormatError(path, "no traceEvents array found", "pass a PyTorch profiler (Kineto) trace")
    head = bytes(sc.head)
    if sc.state == "array":
        head += b"[]"
    if res.truncated:
        # close what is open so the head decodes: the root object, nothing else matters
        head = head.rstrip().rstrip(b",") + b"}" if not head.rstrip().endswith(b"}") else head
    res.head = head
    yield [], res
