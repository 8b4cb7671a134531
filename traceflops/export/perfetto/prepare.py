"""The first half of `annotate`, which needs no analysis: the input read, numbered and redacted into a spool of
records, each entry's place for its added args marked; `stream` fills them once the analysis is done.

Reading the trace this way is most of annotate's work (decoding each entry's
fields, looking for what a rule could change): the command runs it in a
process of its own (`prepare_worker`) beside the analysis, on the core the
analysis leaves idle.

The spool holds one record per array of entries read: a frame of its places
(`Places`) and a frame of its text (compressed with ISA-L's fastest level where
its wheel is installed), the entries as written joined by ',' with nothing
added. A place is where one numbered entry (a device activity or an
op, in the parser's numbering order) takes its args: an insertion point and
how the members go in (`added.FORMS`), or, for an entry decoded here (a rule
could change it, or its args cannot take members as bytes), its span, holding the
entry as orjson writes it after the key rules and before the shape rules, to be
decoded again and given its args there. Each place carries the entry's name
(and, for ops, start time) so the analysis can be checked against the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import BinaryIO

import numpy as np
import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.frames import Readable, read_frame, write_frame
from traceflops.core.redact import MAY_CHANGE_LITERALS, Redactor, redact_bytes
from traceflops.export.perfetto.added import AS_READ, DECODED, holes
from traceflops.export.perfetto.entries import (
    Parts,
    Verbatim,
    array_entries,
    as_read,
    claim_parts,
    numbering,
    positions,
    unredactable,
)
from traceflops.export.perfetto.redact import PlainKeys
from traceflops.export.perfetto.tracks import known_pids, used_pids
from traceflops.parsers.io import max_bytes_default
from traceflops.parsers.jsonstream import MAX_ENTRY_BYTES, REFUSED, Claimed, StreamResult, stream_events

try:  # ISA-L's fastest deflate: a record's text in ~1 ms per MiB, a tenth of its size (fresh page-cache pages for a
    # trace-sized spool cost more than that on a loaded machine); without its wheel the text is stored as it is
    from isal import isal_zlib as _deflate
except ImportError:  # pragma: no cover - a platform without the wheel
    _deflate = None  # type: ignore[assignment]

CHUNK = (
    2 << 20
)  # input bytes decoded at a time: one array of whole entries is held (its dicts ~10x its text), never the file

_OPTS = orjson.OPT_SERIALIZE_NUMPY


@dataclass
class Prepared:
    """What reading the input found, besides the records: the pieces of the document the written events do not
    hold, and the counts for the `traceflops` record."""

    head: bytes = b""  # the top-level object with "traceEvents": []
    events_in: int = 0  # entries written, in file order
    redacted: int = 0  # values redacted by the key rules and, where nothing is added, by the shape rules
    pids: set = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Places:
    """One array's places, kernels' then ops', each kind in numbering order."""

    kernels: int  # how many of the places are device activities' (the first ones)
    start: np.ndarray  # int64: insertion point, or a decoded entry's first byte, in the record's text
    end: np.ndarray  # int64: start, or a decoded entry's end
    form: np.ndarray  # uint8: how it takes its members (`added.FORMS`, AS_READ, DECODED)
    ts: np.ndarray  # float64: each op's start time as read (kernels' are not checked)
    names: list  # each entry's name as read (after the key rules, for a decoded one)

    def encode(self) -> bytes:
        n = len(self.form)
        head = np.array([n, self.kernels], dtype=np.int64).tobytes()
        body = [self.start.astype(np.int64), self.end.astype(np.int64), self.ts.astype(np.float64)]
        arrays = b"".join(a.tobytes() for a in body) + self.form.astype(np.uint8).tobytes()
        return head + arrays + orjson.dumps(self.names)

    @classmethod
    def decode(cls, blob: bytes) -> Places:
        n, kernels = np.frombuffer(blob, np.int64, 2).tolist()
        at = 16
        start, end, ts = (np.frombuffer(blob, np.float64 if i == 2 else np.int64, n, at + 8 * n * i) for i in range(3))
        at += 24 * n
        form = np.frombuffer(blob, np.uint8, n, at)
        return cls(kernels, start, end, form, ts, orjson.loads(memoryview(blob)[at + n :]))


def _packed(text: bytes) -> bytes:
    if _deflate is None:
        return b"r" + text
    return b"z" + _deflate.compress(text, 0)


def _unpacked(blob: bytes) -> bytes:
    return _deflate.decompress(memoryview(blob)[1:]) if blob[:1] == b"z" else blob[1:]


def read_records(spool: Readable, end: int | None = None) -> Iterator[tuple[Places, bytes]]:
    """The spool's records from its position on, in order: (places, text); up to byte `end`, if given."""
    while (end is None or spool.tell() < end) and (meta := read_frame(spool)) is not None:
        yield Places.decode(meta), _unpacked(read_frame(spool) or b"r")


def prepare(
    path: str, spool: BinaryIO, chunk: int | None = None, spooled: Callable[[bytes | None], None] | None = None
) -> Prepared:
    """The input's events, array by array, numbered, key-redacted and written to `spool` as records; what was found.

    Only one array's entries (about CHUNK bytes of the file) are held at a time.
    `spooled(opening)`, if given, is called after each record is written, with the root object up to its
    traceEvents array's '[' (`jsonstream.StreamResult.opening`).
    """
    got = Prepared()
    unread = meta_left_out = 0
    res: StreamResult | None = None
    rules = Redactor()  # one for the whole file: each distinct name, key and value decided once
    keys = PlainKeys()  # the plain args keys met so far
    for texts, result in stream_events(path, max_bytes_default(), chunk=chunk or CHUNK, claim=claim_parts):
        res = result  # the last one is the whole stream's, read after the loop
        for text in texts:
            # an array the scanner cut (the file's tail, an odd layout) is claimed here as the stream claims the others
            parts = text.value if text.__class__ is Claimed else claim_parts(text)
            record = None if parts is REFUSED else _from_parts(parts, got, rules, keys)
            if record is None:
                record, left_out, not_decoded = _from_entries(parts.text if parts is not REFUSED else text, got, rules)
                meta_left_out += left_out
                unread += not_decoded
            places, data = record
            write_frame(spool, places.encode())
            write_frame(spool, _packed(data))
            if spooled is not None:
                spooled(result.opening)
    got.redacted += rules.count
    if res is None or res.truncated:
        raise FormatError(
            path,
            "not a complete JSON document (it ends before its JSON closes)",
            "annotate needs a whole Kineto (PyTorch profiler) JSON trace (a cut file can be analysed, not annotated)",
        )
    got.head = res.head
    got.warnings = _stream_warnings(res, unread, meta_left_out)
    return got


def _joined(pieces: list) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The pieces joined by ',' and where each starts and ends in the result."""
    lens = np.fromiter(map(len, pieces), np.int64, len(pieces))
    ends = np.cumsum(lens + 1) - 1
    return b",".join(pieces), ends - lens, ends


def _from_parts(p: Parts, got: Prepared, rules: Redactor, keys: PlainKeys) -> tuple[Places, bytes] | None:
    """One proven array as a record: most entries as their bytes, places found in column operations; only those a
    rule could change (`_decode_first`) or whose args cannot take members as bytes decoded. None where the array is
    to be read the decoded way instead (a ts or dur numbering's casts decide, text that is not UTF-8, an entry
    orjson refuses), before anything of it is counted."""
    found = positions(p.fields)
    first = None if found is None else _decode_first(p, keys)
    if found is None or first is None:
        return None
    raws, fields = p.raws, p.fields
    numbered = found[0] + found[1]  # kernels' then ops', each in file order
    firsts = set(first)
    plain = (
        np.flatnonzero(np.fromiter((i not in firsts for i in numbered), bool, len(numbered)))
        if first
        else np.arange(len(numbered))
    )
    at = np.asarray(numbered, dtype=np.int64)
    taken = at[plain].tolist()
    fits, offset, form = holes(
        list(map(bytes, map(raws.__getitem__, taken))),
        list(map(bytes, map(_ARGS_OF, map(fields.__getitem__, taken)))),  # empty where there is no args key
    )  # ASCII without a backslash (else a rule decodes it first)
    decoded: dict[int, dict] = {}
    try:
        for i in first + at[plain[~fits]].tolist():
            decoded[i] = orjson.loads(memoryview(raws[i]))
    except orjson.JSONDecodeError:
        return None
    for d in decoded.values():
        rules.event(d)
    got.pids |= used_pids(list(decoded.values())) | known_pids(list(map(_PID_OF, fields)))
    got.events_in += len(raws)
    pieces: list = list(raws)
    numbered_set = set(numbered)
    for i, d in decoded.items():
        if i in numbered_set:  # the shape rules run once its args are added
            pieces[i] = orjson.dumps(d, option=_OPTS)
        else:
            pieces[i], n = redact_bytes(orjson.dumps(d, option=_OPTS))
            got.redacted += n
    text, starts, ends = _joined(pieces)
    start, end = starts[at], ends[at]  # a decoded entry's span
    forms = np.full(len(numbered), DECODED, dtype=np.uint8)
    spliced = plain[fits]
    start[spliced] += offset[fits]
    end[spliced] = start[spliced]
    forms[spliced] = form[fits]
    mine = list(map(fields.__getitem__, numbered))
    names = list(map(_NAME_OF, mine))
    if decoded:
        for j, i in enumerate(numbered):
            if i in decoded:  # its name after the key rules
                names[j] = decoded[i]["name"]
    ts = np.fromiter(map(_TS_OF, mine), np.float64, len(mine))
    return Places(len(found[0]), start, end, forms, ts, names), text


def _from_entries(text: bytes | bytearray, got: Prepared, rules: Redactor) -> tuple[tuple[Places, bytes], int, int]:
    """An array read the decoded way (`entries.array_entries`): each entry decoded; one that does not decode written
    through as read (a metadata entry, or bytes that may be one, left out). The record, how many entries were left
    out and how many were written through."""
    items = array_entries(text)
    for e in items:  # before numbering: the analysis holds the parser's names, redacted by the same rules
        if isinstance(e, dict):
            rules.event(e)
    kern_at, op_at = numbering(items)
    got.pids |= used_pids(items)
    got.events_in += len(items)
    kind = {int(i): 0 for i in kern_at} | {int(i): 1 for i in op_at}
    left_out = written_through = 0
    pieces: list[bytes] = []
    run: list[bytes] = []  # entries between decoded numbered ones: the shape rules run over them here
    places: list[tuple] = []  # (kind, index, start, end, form, name, ts) by numbered entry
    size = 0

    def flush() -> None:
        nonlocal size
        if run:
            data, n = redact_bytes(b",".join(run))
            got.redacted += n
            pieces.append(data)
            size += len(data) + 1
            run.clear()

    for i, x in enumerate(items):
        if as_read(x) and unredactable(x):
            left_out += 1
            continue
        written_through += as_read(x)
        raw = x if x.__class__ is bytes else x.raw if x.__class__ is Verbatim else None
        k = kind.get(i)
        if k is None or raw is not None:
            run.append(raw if raw is not None else orjson.dumps(x, option=_OPTS))
            if k is not None:  # written through as read: its name is checked, nothing is added
                places.append((k, i, size, size, AS_READ, x["name"], x["ts"]))
            continue
        flush()
        data = orjson.dumps(x, option=_OPTS)
        places.append((k, i, size, size + len(data), DECODED, x["name"], x["ts"]))
        pieces.append(data)
        size += len(data) + 1
    flush()
    places.sort(key=lambda p: (p[0], p[1]))  # kernels then ops, each in file order
    data = b",".join(pieces)
    return (
        (
            Places(
                sum(1 for p in places if p[0] == 0),
                np.array([p[2] for p in places], dtype=np.int64),
                np.array([p[3] for p in places], dtype=np.int64),
                np.array([p[4] for p in places], dtype=np.uint8),
                np.array([float(p[6]) for p in places], dtype=np.float64),  # numbering required a number
                [p[5] for p in places],
            ),
            data,
        ),
        left_out,
        written_through,
    )


# An entry is written as its bytes (its added args spliced in, `added.holes`) unless decoding and re-encoding it
# could change it: then it is decoded, redacted and re-encoded as orjson writes it. Looked for in the whole
# array first (one scan in native code), entry by entry only where found: an escape (the decoded text is not the
# bytes, and the shape rules read the decoded text); text other than ASCII; any literal of `MAY_CHANGE` (a value the
# secrets rules may change, a shape `redact_bytes` may: each rule starts with one); args of an earlier annotation
# (overwritten in place); a number orjson refuses (an exponent, or 309 digits: digits are all read as '0'); args
# that are not objects of plain keys (`redact.PlainKeys`) or that nest an object.
_LITERALS = ["\\", "traceflops.", *MAY_CHANGE_LITERALS, "0e"]


_META = set("\\.+*?()|[]{}^$#&-~")  # what the regex syntax reads as more than itself


def _digits_any(literal: str) -> str:
    """A literal as a regex, each '0' in it any digit (a literal's digits are read as '0')."""
    return "".join("[0-9]" if c == "0" else "\\" + c if c in _META else c for c in literal)


# One regex for all of them, ASCII case folded, over the text as it is: reading each text's digits as '0' first and
# searching the literals after took twice as long (the copy and the decode, not the search).
_LITERAL_RE = "(?i-u)" + "|".join([*map(_digits_any, _LITERALS), "[0-9]{309}"])  # and a number no double holds


def _literal(texts: list[bytes | bytearray]) -> pl.Series:
    """Per text, whether it holds anything but ASCII, 309 digits in a row or one of `_LITERALS` (any ASCII case,
    digits read as '0')."""
    plain = [t.isascii() for t in texts]
    ascii_texts = pl.Series([bytes(t) if a else b"" for t, a in zip(texts, plain)], dtype=pl.Binary).cast(pl.Utf8)
    return ascii_texts.str.contains(_LITERAL_RE) | ~pl.Series(plain, dtype=pl.Boolean)


def _decode_first(p: Parts, keys: PlainKeys) -> list[int] | None:
    """The entries of `p` to decode before writing (see `_LITERALS`); None where its text is not UTF-8 throughout
    (the array is read the decoded way)."""
    if not p.text.isascii():  # ASCII is UTF-8: only other text is decoded to check
        try:
            p.text.decode()
        except UnicodeDecodeError:
            return None
    args = list(filter(None, map(_ARGS_OF, p.fields)))
    joined = b",".join(args)
    if not _literal([p.text]).item() and joined.count(b"{") == len(args) and keys.plain(b"[" + joined + b"]"):
        return []
    hit = _literal([bytes(r) for r in p.raws])
    for i, f in enumerate(p.fields):
        a = bytes(f.args)
        if a and not hit[i] and (a.count(b"{") != 1 or not keys.plain(b"[" + a + b"]")):
            hit[i] = True
    return hit.arg_true().to_list()


_PID_OF, _ARGS_OF, _NAME_OF, _TS_OF = attrgetter("pid"), attrgetter("args"), attrgetter("name"), attrgetter("ts")


def _stream_warnings(res: StreamResult, unread: int, meta_left_out: int) -> list[str]:
    """What of the input is not in the output as decoded events, each counted (the parser counts the same in its
    warnings)."""
    out = []
    if res.arrays > 1:
        out.append(
            f"the file holds {res.arrays} root-level traceEvents arrays (a merged or rewritten trace): written as one, "
            "in file order"
        )
    if res.trailing:
        out.append(
            f"{res.trailing} bytes after the end of the trace's JSON document left out (not read, as the parser does)"
        )
    if res.oversized:
        out.append(
            f"{res.oversized} traceEvents entries longer than {MAX_ENTRY_BYTES >> 20} MiB left out (skipped unread, as "
            "the parser does)"
        )
    if res.stray:
        out.append(f"{res.stray} traceEvents entries after the last object that are not objects left out")
    if unread:
        out.append(
            f"{unread} traceEvents entries that do not decode (nested too deeply, a number no double holds, not JSON) "
            "written through unchanged, unannotated"
        )
    if meta_left_out:
        out.append(
            f"{meta_left_out} metadata ('M') entries that do not decode left out (their labels could not be "
            "checked for secrets)"
        )
    return out
