"""Complete Kineto events into the model's typed tables: each column built from loosely typed values (what does not
convert becomes null, counted), events grouped by the table their category feeds, unusable rows counted and dropped.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, eq, is_
from typing import Any

import orjson
import polars as pl

from traceflops.core.trace import COLLECTIVE_COLUMNS, COLLECTIVE_SCHEMA, Warnings, null_column
from traceflops.core.vocab import MAX_MESSAGE_ELEMENTS, MAX_RANKS
from traceflops.parsers.kineto_events import (
    IGNORED_CATS,
    KERNEL_CATS,
    MARKER_CATS,
    OP_CATS,
    PROFILER_RANGE_CAT,
    PROFILER_RANGES,
    RUNTIME_CATS,
    Args,
)

_EMPTY_ARGS = Args()


_I64 = 1 << 63


def _scalar(v: Any) -> Any:
    """A value polars can take: lists, objects and integers beyond 64 bits become null."""
    if v.__class__ is int:
        return v if -_I64 <= v < _I64 else None
    return v if v.__class__ in (float, str, bool) else None


def _all_none(values: tuple | list) -> bool:
    # Looks at the first value before counting: counting compares every value with None.
    return not values or (values[0] is None and values.count(None) == len(values))


def _col(values: tuple | list, dtype) -> pl.Series:
    """A typed column from loosely typed trace values; what does not convert becomes null."""
    if _all_none(values):
        return null_column(len(values), dtype)
    try:
        return pl.Series(values, dtype=dtype, strict=False)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([_scalar(v) for v in values], dtype=dtype, strict=False)


def _dumps(v: Any) -> str | None:
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return None  # nesting too deep or integers too large to be shapes


def _json_col(values: tuple | list) -> pl.Series:
    """JSON text of the present values (shapes of ops; absent on the other events)."""
    if _all_none(values):  # shapes not recorded: stored as nothing, as the other builders' null columns are
        return null_column(len(values), pl.Utf8)
    out: list = [None] * len(values)
    for i, v in enumerate(values):
        if v is not None:
            out[i] = _dumps(v)
    return _str_col(out)


def _text_col(values: tuple | list) -> pl.Series:
    """Identifiers written as integers or strings (pid, tid, stream), as text."""
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    try:
        s = pl.Series(values)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return _col(values, pl.Utf8)
    # Integers cast in one pass: converting value by value was a tenth of the parse.
    return s.cast(pl.Utf8) if s.dtype in (pl.Int64, pl.Utf8) else _col(values, pl.Utf8)


def _str_col(values: tuple | list) -> pl.Series:
    """Strings stay, anything else (a number where a name belongs) becomes null.

    Each distinct string is stored once and rows point at it: kernel names are
    long and repeat thousands of times, and storing each row's copy made them
    most of the parsed trace's memory.
    """
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    index: dict = {}
    try:
        codes = [index.setdefault(v, len(index)) for v in values]
    except TypeError:  # an unhashable value (a list where a name belongs)
        index = {}
        codes = [index.setdefault(v if v.__class__ is str else None, len(index)) for v in values]
    try:
        distinct = pl.Series(list(index), dtype=pl.Utf8)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        distinct = pl.Series([v if v.__class__ is str else None for v in index], dtype=pl.Utf8)
    return distinct.gather(pl.Series(codes, dtype=pl.UInt32))


def _text_or_json_col(values: tuple | list) -> pl.Series:
    """Text as recorded; a list or an object (a newer profiler's `Process Group Ranks`) as its JSON text."""
    if _all_none(values):
        return null_column(len(values), pl.Utf8)
    return _str_col([v if v is None or v.__class__ is str else _dumps(v) for v in values])


def _float(values):
    return _col(values, pl.Float64)


def _rank_col(values) -> pl.Series:
    """A rank recorded as an integer or as its decimal text (PyTorch writes `Src Rank` / `Dst Rank` as text); anything
    else, or a rank no job has (`MAX_RANKS`), is null."""
    if _all_none(values):
        return null_column(len(values), pl.Int64)
    return _within(pl.Series(values, dtype=pl.Utf8, strict=False).str.to_integer(strict=False), 0, MAX_RANKS - 1)


def _integer(values):
    return _col(values, pl.Int64)


def _within(s: pl.Series, lo: int, hi: int) -> pl.Series:
    """`s` where it lies in [lo, hi], else null."""
    return s.to_frame("v").select(pl.when(pl.col("v").is_between(lo, hi)).then(pl.col("v")))["v"]


def _count_col(values) -> pl.Series:
    """A collective's element count (`In msg nelems`): a whole number up to MAX_MESSAGE_ELEMENTS, else null."""
    return _within(_integer(values), 0, MAX_MESSAGE_ELEMENTS)


def _group_size_col(values) -> pl.Series:
    """A group's size: 1 to MAX_RANKS, else null."""
    return _within(_integer(values), 1, MAX_RANKS)


def _text(values):
    return _col(values, pl.Utf8)


# How each column is built from its values.
_BUILD = {
    "name": _str_col,
    "cat": _text,
    "pid": _text_col,
    "tid": _text_col,
    "ts": _float,
    "dur": _float,
    "ext_id": _integer,
    "correlation": _integer,
    "seq": _integer,
    "fwd_tid": _integer,
    "device": _integer,
    "stream": _text_col,
    "bytes": _integer,
    "collective": _str_col,
    "in_nelems": _count_col,
    "out_nelems": _count_col,
    "coll_dtype": _str_col,
    "pg_name": _text_col,
    "group_size": _group_size_col,
    "kernel": _str_col,
    "pg_desc": _str_col,
    "pg_ranks": _text_or_json_col,
    "coll_seq": _integer,
    "p2p_peer": _rank_col,
    "dims": _json_col,
    "types": _json_col,
    "concrete": _json_col,
    "strides": _json_col,
}
_EVENT_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur")
# A collective's parameters, which PyTorch writes together with its name (`Collective name`; torch/csrc/profiler/
# util.cpp): read on the rows that name a collective, not on every row. A map over every op and kernel cost ~80 ms a
# column per million rows, ten columns, for the few hundred collectives a trace holds (none in most chunks).
_ON_COLLECTIVES = frozenset(COLLECTIVE_COLUMNS) - {"collective"}


def _arg(c: str, args: Args):
    """Column `c`'s value in one event's args; the peer is a send's `Dst Rank`, else a receive's `Src Rank` (one
    column: a transfer has one peer)."""
    if c == "p2p_peer":
        return args.p2p_dst if args.p2p_dst is not None else args.p2p_src
    return getattr(args, c)


# Columns whose unread values are counted, and what those values were.
_UNREAD = {
    _integer: "that are not 64-bit integers",
    _json_col: "with integers beyond 64 bits or nesting too deep",
    _rank_col: "that are not ranks",
    _count_col: f"that are not element counts (0 to 2^{MAX_MESSAGE_ELEMENTS.bit_length() - 1})",
    _group_size_col: f"that are not group sizes (1 to 2^{MAX_RANKS.bit_length() - 1})",
}
# Each column's args as the trace spells them, quoted for a warning (a transfer's peer is read from either of two).
_ARG_NAMES = {f: f"'{Args.__struct_encode_fields__[i]}'" for i, f in enumerate(Args.__struct_fields__)} | {
    "p2p_peer": "'Dst Rank' / 'Src Rank'"
}
_COLLECTIVE = COLLECTIVE_COLUMNS
# What each table reads; `cat` is kept until bad rows are counted by it.
_COLUMNS = {
    "ops": (*_EVENT_FIELDS, "ext_id", "seq", "fwd_tid", "dims", "types", "concrete", "strides", *_COLLECTIVE),
    "kernels": (*_EVENT_FIELDS, "device", "stream", "correlation", "ext_id", "bytes", *_COLLECTIVE),
    "launches": (*_EVENT_FIELDS, "correlation", "ext_id", "kernel"),
    "markers": ("name", "cat", "pid", "ts", "dur", "device"),
    "unknown": ("name", "cat", "ts", "dur"),
}
_TABLE_OF = (
    {c: "ops" for c in OP_CATS}
    | {c: "kernels" for c in KERNEL_CATS}
    | {c: "launches" for c in RUNTIME_CATS}
    | {c: "markers" for c in MARKER_CATS}
)
TABLES = ("ops", "kernels", "launches", "markers")


def event_table(
    events: list, columns: tuple[str, ...] = tuple(_BUILD), warnings: Warnings | None = None
) -> pl.DataFrame:
    """Complete events as a typed table of `columns`, each built by one C-level map over the events.

    With `warnings`, integer values that could not be read are counted per field.
    """
    data: dict[str, pl.Series] = {}
    rows = [e.args or _EMPTY_ARGS for e in events] if any(c not in _EVENT_FIELDS for c in columns) else []
    named: pl.Series | None = None  # the rows that name a collective, once its column is built
    for c in columns:
        at = None  # the rows `values` are of, where not every row's
        if c in _ON_COLLECTIVES and named is not None:
            if not len(named):  # no collective in these events (most chunks): nothing to read
                data[c] = null_column(len(rows), COLLECTIVE_SCHEMA[c])
                continue
            at = named
            values = tuple(_arg(c, rows[i]) for i in at.to_list())  # a loop over the collectives only
        elif c in _EVENT_FIELDS:
            values = tuple(map(attrgetter(c), events))
        else:
            values = tuple(map(attrgetter(c), rows))
            if c == "ext_id" and None in values:  # traces before 2022 spell it 'external id' (read where it is missing)
                old = tuple(map(attrgetter("ext_id_old"), rows))
                if not _all_none(old):
                    values = tuple(n if n is not None else o for n, o in zip(values, old))
        built = _BUILD[c](values)
        why = _UNREAD.get(_BUILD[c]) if warnings is not None else None
        if why and warnings is not None:  # values given but not read (C-level counts, no loop over the events)
            warnings.add(
                f"{_ARG_NAMES.get(c, repr(c))} values {why} (read as missing)", built.null_count() - values.count(None)
            )
        if at is not None:  # the collectives' values, in place among the other rows' nulls
            built = null_column(len(rows), COLLECTIVE_SCHEMA[c]).scatter(at, built.cast(COLLECTIVE_SCHEMA[c]))
        data[c] = built
        if c == "collective":
            named = built.is_not_null().arg_true()
    return pl.DataFrame(data)


_GROUP_OF = _TABLE_OF | dict.fromkeys(IGNORED_CATS, "ignored")


def _by_table(events: list) -> tuple[dict[str, list], list]:
    """Events grouped by the table their category feeds, in file order; the unknown apart, the ignored dropped.

    C-level maps and `compress`, no per-event Python: this runs on every event of the trace.
    """
    cats = tuple(map(attrgetter("cat"), events))
    try:
        groups = tuple(map(_GROUP_OF.get, cats))
    except TypeError:  # a category that is not hashable (a list): an unknown one
        groups = tuple(_GROUP_OF.get(c) if c.__class__ is str else None for c in cats)
    out = {t: list(compress(events, map(eq, groups, repeat(t)))) for t in TABLES}
    unknown = list(compress(events, map(is_, groups, repeat(None))))
    return out, unknown


def _usable(df: pl.DataFrame, warnings: Warnings) -> pl.DataFrame:
    """Rows without a numeric ts/dur or a name, or with a negative duration, counted by category and dropped."""
    low = df["dur"].min()
    no_negative = low is None or low >= 0  # type: ignore[operator]  # polars' stub
    if not (df["ts"].null_count() or df["dur"].null_count() or df["name"].null_count()) and no_negative:
        return df  # the usual case, decided without an expression per column
    missing = df["ts"].is_null() | df["dur"].is_null() | df["name"].is_null()
    negative = (df["dur"] < 0).fill_null(False)
    for reason, mask in (
        ("without a numeric ts/dur or a name", missing),
        ("with negative duration", negative & ~missing),
    ):
        for cat, n in df.filter(mask).group_by("cat").len().iter_rows():
            warnings.add(f"'{cat}' events {reason} (skipped)", n)
    return df.filter(~missing & ~negative)


def split_tables(events: list, warnings: Warnings) -> dict[str, pl.DataFrame]:
    """One chunk's complete events as the model's tables (ids are numbered once all are in).

    Done per chunk, and per table with only its columns, so no table of every
    event and every field is ever built.
    """
    groups, unknown = _by_table(events)
    out = {t: _usable(event_table(groups[t], _COLUMNS[t], warnings), warnings) for t in TABLES}
    out["launches"] = out["launches"].drop("cat")
    ranges = [e for e in unknown if PROFILER_RANGE_CAT in (e.cat, e.name)] if unknown else []
    if ranges:
        warnings.add(PROFILER_RANGES, len(ranges))
        unknown = [e for e in unknown if PROFILER_RANGE_CAT not in (e.cat, e.name)]
    if unknown:
        for cat, n in _usable(event_table(unknown, _COLUMNS["unknown"]), warnings).group_by("cat").len().iter_rows():
            warnings.add(f"events of unknown category '{cat}' not analysed", n)
    return out
