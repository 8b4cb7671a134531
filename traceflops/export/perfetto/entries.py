"""The input's traceEvents entries decoded and numbered as the Kineto parser numbers them, so each meets its analysis
row.

Device activities are matched to `Analysis.kernels` by `kernel_id`, which the
Kineto parser assigns as the order, in the file, of the complete ('X') events
of a device category with a usable name, ts and dur (see
`parsers/kineto_tables.py: event_table`, `parsers/kineto.py: build_trace`); ops likewise by `op_id`.
This module recomputes that numbering with the parser's own rules and checks
names and timestamps agree, so an analysis of another trace is refused.
An entry that does not decode is kept as it was read (its bytes, or a
`Verbatim` where the parser still reads it), to be written through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Union

import msgspec
import numpy as np
import orjson
import polars as pl

from traceflops.core.errors import FormatError
from traceflops.export.perfetto.added import Members
from traceflops.parsers.jsonstream import REFUSED, SEP, split_events
from traceflops.parsers.kineto import read_event
from traceflops.parsers.kineto_events import IGNORED_CATS, KERNEL_CATS, OP_CATS, OTHER_PHASES

# The parser's typed decode refuses nesting deeper than the interpreter's recursion limit, orjson only past 1024 levels:
# this skim (in C, no values built) says where the parser would have skipped an entry.
_SKIM = msgspec.json.Decoder(list[msgspec.Raw])
_UNREADABLE = (orjson.JSONDecodeError, msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _decoded(text: bytes | bytearray) -> list:
    """A JSON array of entries decoded, if both orjson and the parser's decoder read it whole (else it raises)."""
    _SKIM.decode(text)
    return orjson.loads(text)


class _Kept(msgspec.Struct, gc=False):
    """What is read of any entry: its pid, and its args as their text (an empty text where it has no args key)."""

    pid: Any = None
    args: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _Numbered(_Kept, gc=False):
    """What numbering reads of an entry besides its phase."""

    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None


class Fields(_Numbered, gc=False):
    """What numbering reads of an entry of any phase (the fallback of `claim_parts`)."""

    ph: Any = None


_FIELDS = msgspec.json.Decoder(list[Fields])


class Complete(_Numbered, tag_field="ph", tag="X", gc=False):
    """`Fields` of a complete ('X') entry, its phase the tag of a union: only these are numbered."""


# Every other phase keeps only what is read of any entry: its name, category and times were most of the fields
# decode's work, for entries nobody numbers (flows and instants are two in five of a Kineto trace).
_OTHERS = tuple(
    msgspec.defstruct(f"_Other{i}", [], bases=(_Kept,), tag_field="ph", tag=ph, gc=False)
    for i, ph in enumerate(OTHER_PHASES)
)
# An entry of no phase listed, or two different phases, fails the union: the whole array is then decoded as `Fields`.
_TAGGED = msgspec.json.Decoder(list[Union[(Complete, *_OTHERS)]])  # type: ignore[valid-type]  # structs made at run time


@dataclass
class Parts:
    """An array of entries a claim proved: its text, each entry's own bytes (views into the text) and its fields."""

    text: bytes | bytearray
    raws: list[msgspec.Raw]
    fields: list  # `Complete` and the other phases' structs, or `Fields` where an entry fits none of them


def claim_parts(text: bytearray):
    """The stream's proof of a cut that keeps each entry's bytes: `Parts`, else REFUSED (the scanner splits it; an
    array holding anything but objects is read the decoded way, `array_entries`)."""
    try:
        raws = _SKIM.decode(text)
        try:
            fields: list = _TAGGED.decode(text)
        except msgspec.ValidationError:
            fields = _FIELDS.decode(text)
        return Parts(text, raws, fields)
    except _UNREADABLE:
        return REFUSED


_NUMBERED_CATS = frozenset(KERNEL_CATS) | OP_CATS


def positions(fields: list) -> tuple[list[int], list[int]] | None:
    """`numbering` of decoded fields (`Parts.fields`): the device activities' and the ops' indices; None where a
    numbered category's ts or dur is neither an integer nor a float (for those, `numbering`'s own casts decide)."""
    kernels: list[int] = []
    ops: list[int] = []
    for i, f in enumerate(fields):
        k = f.__class__
        if k is not Complete and (k is not Fields or f.ph != "X"):
            continue
        c = f.cat
        if c.__class__ is not str or c not in _NUMBERED_CATS or f.name.__class__ is not str:
            continue
        ts, dur = f.ts, f.dur
        if ts is None or dur is None:
            continue
        if (ts.__class__ is not int and ts.__class__ is not float) or (
            dur.__class__ is not int and dur.__class__ is not float
        ):
            return None
        if dur >= 0:
            (kernels if c in KERNEL_CATS else ops).append(i)
    return kernels, ops


class Verbatim(dict):
    """An entry the parser reads but orjson cannot (a number no double holds, in a field the parser skips): numbered
    by the fields the parser read, written through as its own bytes (`raw`), so unannotated."""

    def __init__(self, fields: dict, raw: bytes) -> None:
        super().__init__(fields)
        self.raw = raw


def _entry(piece: bytes):
    """A piece orjson cannot decode: a `Verbatim` where the parser still reads it, else its bytes (numbered as
    nothing)."""
    ev = read_event(piece)
    if ev is None:
        return piece
    return Verbatim({"ph": ev.ph, "cat": ev.cat, "name": ev.name, "ts": ev.ts, "dur": ev.dur}, piece)


def array_entries(text: bytes | bytearray) -> list:
    """One array of whole traceEvents entries (a `jsonstream.stream_events` text), decoded.

    An array that does not decode whole is split and decoded entry by entry; an
    entry that still does not stays as it was and is written through: its bytes
    where the parser skips it too (nested too deeply, not JSON), numbered as
    nothing; a `Verbatim` where the parser reads it, numbered as the parser does.
    """
    try:
        return _decoded(text)
    except _UNREADABLE:
        pass
    out: list = []
    for piece in split_events(bytes(text).strip()[1:-1]):
        piece = piece.strip(SEP)
        if not piece:
            continue
        try:
            out.extend(_decoded(b"[" + piece + b"]"))
        except _UNREADABLE:
            out.append(_entry(piece))
    return out


_MAYBE_META = re.compile(rb'"M"|\\u')


def unredactable(x) -> bool:
    """A metadata entry the key rules cannot reach: one the parser read as 'M', or bytes nobody reads that may be one
    (an "M" string, or an escape that could spell it). Written through, its labels would be copied unredacted."""
    if x.__class__ is Verbatim:
        return x.get("ph") == "M"
    return x.__class__ is bytes and _MAYBE_META.search(x) is not None


def as_read(x) -> bool:
    """An entry written through as it was read (bytes, or a `Verbatim`), not re-serialized."""
    return x.__class__ is bytes or x.__class__ is Verbatim


def _usable(e: Any) -> bool:
    """What the Kineto parser decodes as an event: an object (args that are not an object are dropped, the event
    kept)."""
    return isinstance(e, dict)


def numbering(events: list) -> tuple[np.ndarray, np.ndarray]:
    """Indices into `events` of the device activities (position = kernel_id) and of the ops (position = op_id).

    The parser's rules: complete ('X') events; categories in IGNORED_CATS
    dropped; a string name and numeric ts and dur, dur ≥ 0; then the device
    categories, resp. the op categories, in file order.
    """
    idx = [i for i, e in enumerate(events) if _usable(e) and e.get("ph") == "X"]
    xs = [events[i] for i in idx]
    ev = pl.DataFrame(
        {
            "i": pl.Series(idx, dtype=pl.Int64),
            "cat": pl.Series([e.get("cat") for e in xs], dtype=pl.Utf8, strict=False),
            "name": pl.Series([e.get("name") if e.get("name").__class__ is str else None for e in xs], dtype=pl.Utf8),
            "ts": pl.Series([e.get("ts") for e in xs], dtype=pl.Float64, strict=False),
            "dur": pl.Series([e.get("dur") for e in xs], dtype=pl.Float64, strict=False),
        }
    )
    ev = ev.filter(~pl.col("cat").is_in(list(IGNORED_CATS)) | pl.col("cat").is_null())
    ev = ev.filter(
        pl.col("ts").is_not_null() & pl.col("dur").is_not_null() & pl.col("name").is_not_null() & (pl.col("dur") >= 0)
    )
    kernels = ev.filter(pl.col("cat").is_in(list(KERNEL_CATS)))["i"].to_numpy()
    ops = ev.filter(pl.col("cat").is_in(list(OP_CATS)))["i"].to_numpy()
    return kernels, ops


class Numbered:
    """The analysis' rows of one numbered kind (device activities by kernel_id, ops by op_id), sorted by id.

    The trace streams through in arrays; each array holds a run of ids, and its
    rows are one slice of the sorted frame (two binary searches), not a lookup
    in a table of every row.
    """

    def __init__(self, frame: pl.DataFrame, col: str, what: str, check_ts: bool) -> None:
        self.frame = frame.sort(col, maintain_order=True)
        self.ids = self.frame[col].to_numpy()
        self.col, self.what, self.check_ts = col, what, check_ts
        self.seen = 0  # ids numbered so far in the file
        self.members = Members(pl.Series("m", [], dtype=pl.Utf8), {}, {})  # per row: the args added (`added`)

    def slots(self, n: int) -> tuple[np.ndarray, pl.DataFrame, int]:
        """For one array holding the next `n` numbered events: which of them (0 … n - 1) have a row, the rows and
        where the slice starts."""
        lo, hi = np.searchsorted(self.ids, [self.seen, self.seen + n])
        part = self.frame.slice(int(lo), int(hi - lo))
        slots = self.ids[lo:hi] - self.seen
        self.seen += n
        return slots, part, int(lo)

    def finish(self, path: str) -> None:
        """Every id of the analysis was in the file."""
        if len(self.ids) and int(self.ids[-1]) >= self.seen:
            raise FormatError(
                path,
                f"the analysis has more {self.what} than this trace",
                "annotate a trace with the analysis of that same trace",
            )


def agree(names: list, ts: list | None, part: pl.DataFrame, kind: Numbered, path: str) -> None:
    """The analysis is of this trace: same names (and, for ops, start times: `ts`) at the same positions.

    Kernel start times are not compared: the analysis trims a kernel that overlaps
    an earlier one on its stream (a profiler artefact), the file keeps it as written.
    """
    if names == part["name"].to_list() and (
        ts is None or [float(t) for t in ts] == part["ts"].cast(pl.Float64).to_list()
    ):
        return  # the usual case, compared as lists; the columns below name the first that differs
    got = pl.Series(names, dtype=pl.Utf8)
    bad = got.ne_missing(part["name"])
    if ts is not None:
        bad = bad | pl.Series([float(t) for t in ts], dtype=pl.Float64).ne_missing(part["ts"].cast(pl.Float64))
    if bad.any():
        j = int(bad.arg_true()[0])
        raise FormatError(
            path,
            f"{kind.what} {part[kind.col][j]} is '{got[j]}' here but '{part['name'][j]}' in the analysis",
            "annotate a trace with the analysis of that same trace",
        )
