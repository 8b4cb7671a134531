"""Streaming split of a chrome-trace JSON document into batches of whole events.

The file is read in chunks (decompressing as it goes). Each chunk is cut at its
last likely boundary between events, and a validating skim in C proves the
cut; where it does not, numpy finds the string, escape and nesting structure
of the chunk. The rest of the top-level object (device
properties, distributed info) comes out as a small document of its own.
Neither the whole file nor its decoded form is held at once. A document cut short yields every event that was complete.

Hostile layouts are bounded, not trusted: a UTF-8 byte-order mark is dropped,
a second root-level traceEvents array is read too (and counted), an entry
longer than `MAX_ENTRY_BYTES` is skipped by the structural scan without being
held (and counted), top-level fields beside the events longer than
`MAX_HEAD_BYTES` refuse the file, and bytes after the root object's close
(another document appended, garbage) are counted, never read as events.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import msgspec
import numpy as np

from traceflops.core.errors import FormatError, NotATraceError
from traceflops.parsers.io import chunks

_QUOTE, _BSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_OPEN = (ord("{"), ord("["))
_CLOSE = (ord("}"), ord("]"))
_KEY = b'"traceEvents"'
_BOM = b"\xef\xbb\xbf"
# No profiler writes one event this long (the largest real ones, ops of thousands of tensors, are kilobytes);
# a longer entry is a corrupt or hostile value and holding it would cost its size several times over.
MAX_ENTRY_BYTES = 16 << 20
# deviceProperties and distributedInfo are kilobytes: more beside the events is not a trace to read.
MAX_HEAD_BYTES = 64 << 20
SEP = b", \n\r\t"  # what may stand between two array entries
HEAD_PIECE = 64 << 10  # how much of a chunk is first searched for the array's start


@dataclass
class StreamResult:
    head: bytes = b""  # the top-level object without its traceEvents array
    opening: bytes | None = None  # the root object up to its first traceEvents array's '[' (set as it opens)
    truncated: bool = False  # the document ended before it was closed
    stray: int = 0  # array entries after the last object that are not objects
    events_complete: bool = False  # the traceEvents array closed: a cut, if any, came after it
    arrays: int = 0  # root-level traceEvents arrays found (a merged or rewritten file may hold two)
    oversized: int = 0  # entries longer than MAX_ENTRY_BYTES, skipped unread
    trailing: int = 0  # non-blank bytes after the root object's close (another document, garbage), not read
    notes: list[str] = field(default_factory=list)


class _Scanner:
    """Carries string/escape/depth state across chunks and cuts events out of them."""

    def __init__(self) -> None:
        self.in_string = False
        self.escaped = False  # the previous chunk ended inside an odd run of backslashes
        self.depth = 0
        self.state = "before"  # before (looking for a traceEvents array) | array
        self.head = bytearray()
        self.pending = bytearray()  # bytes of the event in progress (array state)
        self.prefix = bytearray()  # bytes before the array, while looking for it
        self.stray = 0
        self.arrays = 0  # traceEvents arrays closed so far
        self.rest = b""  # what followed the array that just closed, to look for another
        self.waiting = False  # a root-level key was found whose value has not arrived
        self.tail: _Scanner | None = None  # after an array: the root object's own structure, to see where it closes
        self.closed = False  # the root object has closed: what follows is no part of the trace
        self.trailing = 0  # non-blank bytes after the root object's close

    def structure(self, buf: np.ndarray, commas: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Positions of structural (outside-string) braces/brackets, and the depth after each.

        Works on the sparse positions of quotes, backslashes and braces only: a
        quote is escaped by an odd run of backslashes before it (runs carry over
        chunks), a brace is structural when an even number of real quotes precede it.
        With `commas`, structural commas are among the positions too (depth unchanged).
        """
        n = len(buf)
        quotes = np.flatnonzero(buf == _QUOTE)
        bs = np.flatnonzero(buf == _BSLASH)
        marks = (buf == _OPEN[0]) | (buf == _OPEN[1]) | (buf == _CLOSE[0]) | (buf == _CLOSE[1])
        braces = np.flatnonzero(marks | (buf == _COMMA) if commas else marks)
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
        ch = buf[struct]
        delta = np.where((ch == _OPEN[0]) | (ch == _OPEN[1]), 1, np.where(ch == _COMMA, 0, -1))
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
        """Before an array: the bytes after its '[' once it has arrived, else None (kept for the next chunk).

        After an array closed, the rest of the root object is searched the same way
        for another traceEvents array (its depth starts at 1, inside the root).
        The chunk's first `HEAD_PIECE` bytes are looked at alone first: the
        array opens within a trace's first kilobytes, and scanning the whole
        chunk as head (twice: for the root's close and for the key) cost as
        much as decoding a 50 MB trace's first chunk.
        """
        if len(data) <= HEAD_PIECE:
            return self._enter(data)
        rest = self._enter(data[:HEAD_PIECE])
        return self._enter(data[HEAD_PIECE:]) if rest is None else rest + data[HEAD_PIECE:]

    def _enter(self, data: bytes) -> bytes | None:
        if self.closed:
            self.trailing += _non_blank(data)
            return None
        data = self._until_root_close(data)  # anything after the root object's close is not the trace's
        # Rescan the prefix whole only when a key may have arrived: a long head is then read once, not per chunk.
        seam = bytes(self.prefix[-(len(_KEY) - 1) :])
        self.prefix += data
        if not self.waiting and _KEY not in seam + data:
            return None
        at, self.waiting = _locate(bytes(self.prefix), 1 if self.arrays else 0)
        if at is None:
            return None
        self.head += self.prefix[:at]
        rest = bytes(self.prefix[at + 1 :])
        self.prefix = bytearray()
        self.state, self.depth, self.in_string, self.escaped = "array", 2, False, False
        self.closed = False  # a close already seen lies after this array: found again once the array has closed
        return rest

    def _until_root_close(self, data: bytes) -> bytes:
        """`data` up to the root object's closing brace, counting what follows it as trailing (never kept).

        A second document appended to the file (or garbage after it) is no part
        of this trace: its events are not read, and its bytes are counted.
        """
        if self.tail is None:  # at the document's start, or just after an array (inside the root)
            self.tail = _Scanner()
            self.tail.depth = 1 if self.arrays else 0
        buf = np.frombuffer(data, dtype=np.uint8)
        if len(buf) == 0:
            return data
        struct, depth_after = self.tail.structure(buf)
        closes = np.flatnonzero(depth_after <= 0)
        if len(closes) == 0:
            if len(depth_after):
                self.tail.depth = int(depth_after[-1])
            return data
        end = int(struct[closes[0]]) + 1
        self.closed = True
        self.trailing += _non_blank(data[end:])
        return data[:end]

    def take_rest(self) -> bytes:
        rest, self.rest = self.rest, b""
        return rest

    def feed(self, data: bytes) -> list[bytes]:
        """Consume a chunk inside the array (see `enter`); return the complete events it closed (raw JSON objects).

        When the array closes, what follows it is left in `rest` and the state
        is back to "before": the root object may hold another array.
        """
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
            leftover = (bytes(self.pending) + data[start:stop]).strip(SEP)
            if leftover:
                self.stray += leftover.count(b",") + 1
            self.pending.clear()
            self.state = "before"
            self.arrays += 1
            self.tail = None  # the root's structure is followed afresh from just after this array
            self.head += b"[]"  # the head stays a valid object: "traceEvents": []
            self.rest = data[stop + 1 :]
        else:
            # between events only separators: keep nothing until an event starts
            self.pending += data[start:] if self.pending else data[start:].lstrip(SEP)
        if len(depth_after):
            self.depth = int(depth_after[-1])
        return events


def _non_blank(data: bytes) -> int:
    """Bytes that are not JSON whitespace: the same count however the data was cut into chunks."""
    return len(data.translate(None, b" \t\r\n"))


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
    if block[start:].strip(SEP):
        out.append(block[start:])
    return out


def root_members(doc: bytes) -> list[bytes]:
    """The `"key": value` texts of a JSON object's root level, split at its structural commas.

    Lets a head whose whole decode fails (one field nested too deeply, one
    number out of range) be read field by field, keeping the fields that decode.
    """
    buf = np.frombuffer(doc, dtype=np.uint8)
    struct, depth_after = _Scanner().structure(buf, commas=True)
    ch = buf[struct] if len(struct) else buf[:0]
    opens = np.flatnonzero((ch == _OPEN[0]) & (depth_after == 1))
    if len(opens) == 0:
        return []
    start = int(struct[opens[0]])
    closes = np.flatnonzero((ch == _CLOSE[0]) & (depth_after == 0))
    end = int(struct[closes[-1]]) if len(closes) else len(doc)
    cuts = struct[(ch == _COMMA) & (depth_after == 1) & (struct > start) & (struct < end)].tolist()
    bounds = [start, *cuts, end]
    pieces = (doc[a + 1 : b].strip() for a, b in pairwise(bounds))
    return [p for p in pieces if p]


def _locate(prefix: bytes, depth: int = 0) -> tuple[int | None, bool]:
    """Offset of the '[' that opens a root-level traceEvents array once it has arrived, and whether one may still
    arrive.

    `depth` is the nesting at the prefix's start: 0 before the root object, 1 inside it.
    The second answer is True when a root-level key was found whose value is not in yet.
    """
    sc = _Scanner()
    sc.depth = depth
    struct, depth_after = sc.structure(np.frombuffer(prefix, dtype=np.uint8))
    at = prefix.find(_KEY)
    while at != -1:
        i = np.searchsorted(struct, at)
        depth_here = int(depth_after[i - 1]) if i > 0 else depth
        in_root = depth_here == 1 and _outside_string(prefix, at, struct)
        colon = prefix.find(b":", at + len(_KEY))
        if in_root and colon == -1 and not prefix[at + len(_KEY) :].strip():
            return None, True  # the key's colon has not arrived yet
        if in_root and colon != -1 and not prefix[at + len(_KEY) : colon].strip():
            j = colon + 1
            while j < len(prefix) and prefix[j : j + 1].isspace():
                j += 1
            if j < len(prefix):
                if prefix[j : j + 1] == b"[":
                    return j, False
            else:
                return None, True  # the value has not arrived yet
        at = prefix.find(_KEY, at + 1)
    return None, False


def _outside_string(prefix: bytes, at: int, struct: np.ndarray) -> bool:
    """The key's opening quote is a real quote starting a string at root level."""
    sc = _Scanner()
    sc.structure(np.frombuffer(prefix[:at], dtype=np.uint8)) if at else None
    return not sc.in_string


_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")


def last_cut(data: bytes) -> int:
    """Offset just past the last '}' followed by ', {': a likely boundary between two events, or -1.

    Only a likely one: it may sit inside a string or an event's args. The
    caller proves it by decoding what precedes it (see `stream_events`).
    """
    n = len(data)
    for window in (1 << 16, 1 << 20, n):
        lo = max(0, n - window)
        last = deque(_CUT.finditer(data, lo), maxlen=1)  # the last match
        if last:
            return last[0].start() + 1
        if lo == 0:
            break
    return -1


def _wrap(entries: bytes) -> bytes:
    return b"[" + entries.lstrip(SEP) + b"]"


def _as_array(pending: bytes, data: bytes, end: int) -> bytearray:
    """'[' + pending + data[:end] + ']' in one buffer: each chunk is copied once."""
    start = 0
    if not pending:
        while start < end and data[start] in SEP:
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
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # too deep: the scanner's to split
        return False


REFUSED = object()  # a claim's answer: the array did not decode whole, so its cut is not proven


@dataclass
class Claimed:
    """An array a claim decoded (and so proved) as it was cut: its decoded value."""

    value: Any


def _without_bom(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The pieces with a leading UTF-8 byte-order mark dropped (editors on Windows write one; JSON allows it)."""
    head: bytes | None = b""
    for piece in pieces:
        if head is None:
            yield piece
            continue
        head += piece
        if len(head) < len(_BOM) and _BOM.startswith(head):
            continue  # too short to tell yet
        rest = head.removeprefix(_BOM)
        head = None
        if rest:
            yield rest
    if head:
        yield head


def _skip_entry(sc: _Scanner, data: bytes) -> int | None:
    """Where the entry being skipped ends in `data` (the offset of what follows it), else None.

    The scanner's state carries across chunks, so nothing of the entry is held.
    An entry ends where the depth returns to the array's (2) on a close, or
    where a new entry opens at the array's depth (the skipped one was not an
    object), or at the array's own ']' (left for the caller to see).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    if len(buf) == 0:
        return None
    struct, depth_after = sc.structure(buf)
    if len(struct) == 0:
        return None
    opens = np.isin(buf[struct], _OPEN)
    before = depth_after - np.where(opens, 1, -1)
    ends = (opens & (before == 2)) | (~opens & (depth_after <= 2))
    hit = np.flatnonzero(ends)
    if len(hit) == 0:
        sc.depth = int(depth_after[-1])
        return None
    k = int(hit[0])
    closed_entry = not opens[k] and depth_after[k] == 2
    return int(struct[k]) + (1 if closed_entry else 0)


def stream_events(
    path: str, limit: int, chunk: int = 8 << 20, progress=None, claim=None, max_entry: int = MAX_ENTRY_BYTES
) -> Iterator[tuple[list, StreamResult]]:
    """The traceEvents array as JSON arrays of whole entries, chunk by chunk; the last yield carries the head.

    The fast path cuts each chunk at its last likely event boundary and proves
    the cut by checking, in C, that the text before it is a sequence of complete
    JSON values. Every array starts between two entries, so one that holds only
    complete values also ends between two entries: no structural scan is
    needed, and the typed decode can run anywhere (another process). A cut that
    fails the proof (an odd layout, a malformed event, the array's end) sends
    that chunk through the structural scanner. Either way each array yielded
    holds whole entries; entries that are not events are the decoder's to count.

    Every root-level traceEvents array is read, in file order (`res.arrays`
    says how many). An entry of which more than `max_entry` bytes are pending
    (it runs on past the chunks read) is skipped as it streams, unheld
    (`res.oversized`): with chunks no longer than the bound, every entry longer
    than twice the bound is skipped and none shorter than it. Top-level fields
    beside the events longer than MAX_HEAD_BYTES are a FormatError.

    `claim(text)`, if given, may decode a cut array strictly itself: a decode
    that succeeds is the proof (no skim), and the stream yields `Claimed(value)`
    in its place; REFUSED sends the chunk to the scanner; None leaves the array
    to be skimmed and yielded as text.
    """
    sc = _Scanner()
    res = StreamResult()
    pending = b""  # bytes from the start of an entry (between entries) to the end of what was read
    skipping = False  # inside an entry over max_entry: scanned for its end, not kept

    def scan(data: bytes) -> list[bytes]:
        nonlocal pending
        sc.depth, sc.in_string, sc.escaped = 2, False, False
        out = [_wrap(b) for b in sc.feed(data)]
        pending = bytes(sc.pending)
        sc.pending.clear()
        return out

    def bound_pending() -> Iterator[tuple[list, StreamResult]]:
        """An entry in progress past max_entry: its complete predecessors out, then it is skipped as it streams."""
        nonlocal pending, skipping
        if len(pending) <= max_entry or sc.state != "array":
            return
        yield scan(pending), res  # leaves the scanner's state at the end of what was read
        if sc.state == "before":
            yield from advance(sc.take_rest())  # the array closed inside what was pending
        elif len(pending) > max_entry:
            pending, skipping = b"", True
            res.oversized += 1

    def advance(data: bytes | None) -> Iterator[tuple[list, StreamResult]]:
        """Consume one piece of the document; after an array closes, what follows it is read on."""
        nonlocal pending, skipping
        while data:
            if sc.state == "before":
                data = sc.enter(data)
                if len(sc.prefix) + len(sc.head) > MAX_HEAD_BYTES:
                    raise FormatError(
                        path,
                        f"its top-level fields beside traceEvents exceed {MAX_HEAD_BYTES >> 20} MiB",
                        "pass a PyTorch profiler trace as the profiler wrote it",
                    )
                if data is None:
                    return
                if res.opening is None:
                    res.opening = bytes(sc.head)
                data, pending = data.lstrip(SEP), b""  # the rest of the chunk takes the fast path like any other
                continue
            if skipping:
                at = _skip_entry(sc, data)
                if at is None:
                    return
                data, skipping = data[at:].lstrip(SEP), False
                continue
            cut = last_cut(data)
            if cut >= 0:
                text = _as_array(pending, data, cut)
                got = claim(text) if claim is not None else None
                item: bytearray | Claimed
                if got is None:
                    proven, item = _whole(text), text
                else:
                    proven, item = got is not REFUSED, Claimed(got)
                if proven:
                    pending = data[cut:].lstrip(SEP)
                    yield [item], res
                    return
            elif len(pending) < 4 * chunk:
                pending = (
                    pending + data if pending else data.lstrip(SEP)
                )  # no boundary yet: an entry longer than a chunk
                yield from bound_pending()
                return
            yield scan(pending + data), res
            if sc.state == "before":
                data = sc.take_rest()
                continue
            yield from bound_pending()
            return

    first = True
    for data in _without_bom(chunks(path, limit, chunk, progress)):
        if first:
            if not data.strip():
                continue  # blank so far: the document starts in a later piece
            if not data.lstrip().startswith(b"{"):
                raise FormatError(
                    path,
                    "not a JSON object (a Kineto trace is a JSON object with traceEvents)",
                    "pass a PyTorch profiler trace",
                )
            first = False
        yield from advance(data)
    if first:
        raise FormatError(path, "the file is empty", "re-export the trace")
    while sc.state == "array" and pending and not skipping:
        last, pending = pending, b""
        yield scan(last), res
        if sc.state != "before":
            break  # the document ends inside the array: what is pending is a cut entry
        yield from advance(sc.take_rest())  # the tail may hold another array
    res.stray = sc.stray
    res.arrays = sc.arrays
    res.trailing = sc.trailing
    if sc.state == "before" and not sc.arrays:
        raise NotATraceError(path, "no traceEvents array found", "pass a PyTorch profiler (Kineto) trace")
    head = bytes(sc.head)
    if sc.state == "before":
        head += bytes(sc.prefix)  # the rest of the root object after its last array
    res.events_complete = sc.state == "before"
    res.truncated = sc.state == "array" or not head.rstrip().endswith(b"}")
    if sc.state == "array":
        head += b"[]"
    if res.truncated:
        # close what is open so the head decodes: the root object, nothing else matters
        head = head.rstrip().rstrip(b",") + b"}" if not head.rstrip().endswith(b"}") else head
    res.head = head
    yield [], res
