"""The normalized, columnar trace every parser produces and every later stage reads.

Nothing downstream of a parser knows which file format a trace came from: it
sees only these tables. Times are microseconds in the trace's own clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# What a collective records about itself (Kineto args), on the op that launched it or on the kernel.
COLLECTIVE_SCHEMA: dict[str, PolarsDataType] = {
    "collective": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "coll_dtype": pl.Utf8,
    "pg_name": pl.Utf8,
    "group_size": pl.Int64,
    "pg_desc": pl.Utf8,  # the group's description: `default_pg`, `mesh_tp`, ...
    "pg_ranks": pl.Utf8,  # the group's global ranks as JSON text ("[0, 1]"), as recorded
    "coll_seq": pl.Int64,  # the collective's sequence number within its group (`Seq`)
    # a point-to-point transfer's peer, a global rank: a send's receiver (`Dst Rank`), a receive's sender (`Src Rank`)
    "p2p_peer": pl.Int64,
}

OPS_SCHEMA: dict[str, PolarsDataType] = {
    "op_id": pl.Int64,
    "name": pl.Utf8,
    "cat": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "ext_id": pl.Int64,
    "seq": pl.Int64,
    "fwd_tid": pl.Int64,
    "dims": pl.Utf8,  # JSON text: nesting depth varies (tensor lists), so not a typed column
    "types": pl.Utf8,
    "concrete": pl.Utf8,
    "strides": pl.Utf8,
    # Collective parameters (record_param_comms, nccl:* annotations): null elsewhere.
    **COLLECTIVE_SCHEMA,
    # Set by parsers whose format says more than shapes (XLA): null elsewhere.
    "scope": pl.Utf8,  # framework name stack (JAX `jvp(...)/...`, TF op name)
    "flops_hint": pl.Int64,  # FLOPs the compiler reports for this op
    "bytes_hint": pl.Int64,  # bytes the compiler reports it accesses
    "matmul_hint": pl.Boolean,  # the op is (or fuses) a dot / convolution
    "recompute_hint": pl.Int64,  # of flops_hint, recomputed inside the kernel (a fused attention backward's Q·Kᵀ)
    "mask_hint": pl.Utf8,  # attention mask of a fused attention op: 'none' | 'causal' | 'unknown'
    "feeds_forward_hint": pl.Boolean,  # a recomputed copy whose result the forward reads (its twin merged into it)
    "device": pl.Int64,  # the device whose work the op is (XLA:CPU's `device_ordinal`, a program on several devices)
}

HINT_COLUMNS = (
    "scope",
    "flops_hint",
    "bytes_hint",
    "matmul_hint",
    "recompute_hint",
    "mask_hint",
    "feeds_forward_hint",
    "device",
)


def with_null_hints(ops: pl.DataFrame) -> pl.DataFrame:
    """Add the format-specific hint columns as nulls, for parsers whose format has none."""
    return ops.with_columns([pl.lit(None, OPS_SCHEMA[c]).alias(c) for c in HINT_COLUMNS]).select(list(OPS_SCHEMA))


KERNELS_SCHEMA: dict[str, PolarsDataType] = {
    "kernel_id": pl.Int64,
    "name": pl.Utf8,
    "kind": pl.Utf8,  # compute | communication | memcpy | memset
    "pid": pl.Utf8,
    "device": pl.Int64,
    "stream": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "correlation": pl.Int64,
    "ext_id": pl.Int64,
    "bytes": pl.Int64,
    **COLLECTIVE_SCHEMA,  # a collective kernel's own args
}

COLLECTIVE_COLUMNS = tuple(COLLECTIVE_SCHEMA)

LAUNCHES_SCHEMA: dict[str, PolarsDataType] = {
    "name": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "correlation": pl.Int64,
    "ext_id": pl.Int64,
    "kernel": pl.Utf8,  # the kernel a launch names (Kineto's `kernel` arg): what a graph capture recorded
}

MARKERS_SCHEMA: dict[str, PolarsDataType] = {
    "name": pl.Utf8,
    "cat": pl.Utf8,  # cuda_sync | gpu_user_annotation: device rows that are not device work
    "device": pl.Int64,
    "ts": pl.Float64,
    "dur": pl.Float64,
}

STEPS_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int64,
    "name": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
}


def null_column(n: int, dtype) -> pl.Series:
    return pl.Series([None], dtype=dtype).new_from_index(0, n)  # no buffers for text; no lazy query


def compact(df: pl.DataFrame) -> pl.DataFrame:
    """Columns that are null throughout (shapes, collectives in a trace without them) stored as nothing.

    Joined from chunks, read from parquet or reordered, a null column still
    holds its values: 16 bytes per row for text, 8 for a number. Ten of them
    were a fifth of a large trace's memory.
    """
    null = [null_column(df.height, df.schema[c]).alias(c) for c in all_null(df)]
    return df.with_columns(null) if null else df


def all_null(df: pl.DataFrame) -> list[str]:
    """The columns that hold no value (none in a table without rows: there is nothing to store)."""
    n = df.height
    return [c for c in df.columns if df[c].null_count() == n] if n else []


def named_by(names: pl.Series, rule: Callable[[pl.Expr], pl.Expr]) -> pl.Series:
    """Per row, whether its name satisfies `rule` (an expression over a column of names); a null name satisfies none.
    The rule runs once per distinct name: kernel names are long and repeat thousands of times, a runtime call's or an
    op's name repeats for every launch or step (per row it was most of a stage). One rule over a column; several over
    the same column: `Coded` (its codes cost more than one `is_in`). A column already coded in this `coded_once` is
    matched through its codes (a rule over a few hundred names and one gather)."""
    coded = Coded.found(names)
    if coded is not None:
        per_name = coded.distinct.to_frame("name").select(rule(pl.col("name")).fill_null(False))[:, 0].to_numpy()
        return pl.Series(names.name, coded.per_row(per_name, False))
    distinct = names.drop_nulls().unique()
    hit = distinct.to_frame("name").filter(rule(pl.col("name")))["name"]
    return names.is_in(hit.implode()).fill_null(False)


def name_matches(names: pl.Series, pattern: str, unless: str | None = None) -> pl.Series:
    """Per row, whether the name matches `pattern` (and not `unless`), by `named_by`."""
    if unless is None:
        return named_by(names, lambda n: n.str.contains(pattern))
    return named_by(names, lambda n: n.str.contains(pattern) & ~n.str.contains(unless))


def distinct_codes(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """The distinct non-null values, sorted, and per row the index of its value among them (null stays null).

    The codes sort as the values do: sorting a table by a text column moved and compared every row's text (kernel
    names run to hundreds of bytes and repeat thousands of times), by these codes it sorts integers.
    """
    distinct = values.drop_nulls().unique().sort()
    if values.dtype == pl.Utf8:  # an enum of the sorted values: its codes are the ranks (half replace_strict's time)
        return distinct, values.cast(pl.Enum(distinct)).to_physical().cast(pl.UInt32)
    rank = pl.int_range(distinct.len(), dtype=pl.UInt32, eager=True)
    return distinct, values.replace_strict(distinct, rank, default=None, return_dtype=pl.UInt32)


@dataclass(frozen=True)
class Coded:
    """A text column as its distinct values (sorted) and, per row, the position of its value among them (a null row:
    their count).

    A pattern or a mapping then runs once per distinct value and reaches the rows by an integer gather: a trace
    repeats a hundred op names over every step, and a pattern run over the 587 k ops of a 476 MB trace took 8-30 ms
    each time, through the codes ~1 ms.
    """

    distinct: pl.Series
    codes: np.ndarray  # int64, one per row

    @classmethod
    def of(cls, values: pl.Series, keep: bool = False) -> Coded:
        """The values coded; within `coded_once`, the codes already made for a column of equal values, if any, and with
        `keep`, these held for the stages after (a column of the trace's own tables: one a stage derives for itself
        would stay in memory to the analysis's end)."""
        found = cls.found(values)
        if found is not None:
            return found
        distinct, at = distinct_codes(values)
        coded = cls(distinct, at.fill_null(distinct.len()).cast(pl.Int64).to_numpy())
        memo = _CODED.get()
        if keep and memo is not None:
            memo.append((values, coded))
            del memo[:-_CODED_KEPT]
        return coded

    @staticmethod
    def found(values: pl.Series) -> Coded | None:
        """Within `coded_once`, the codes already made for a column of the same name and equal values; else None."""
        for seen, coded in reversed(_CODED.get() or ()):
            same_kind = seen.name == values.name and seen.len() == values.len() and seen.dtype == values.dtype
            if same_kind and seen.equals(values):  # the cheap checks first: equals compares every row
                return coded
        return None

    def as_series(self) -> pl.Series:
        """The codes as a column, a null row null (as `distinct_codes` gives them)."""
        at = pl.Series(self.codes, dtype=pl.UInt32)
        return pl.select(pl.when(at < self.distinct.len()).then(at)).to_series()

    def per_row(self, per_value: np.ndarray, on_null) -> np.ndarray:
        """A value given per distinct value (in `distinct`'s order), per row; `on_null` on a null row."""
        return np.append(per_value, np.array([on_null], dtype=per_value.dtype))[self.codes]

    def contains(self, pattern: str) -> np.ndarray:
        """Per row, whether its text matches `pattern` (a null row does not)."""
        return self.per_row(self.distinct.str.contains(pattern).to_numpy(), False)


def sort_codes(values: pl.Series, keep: bool = False) -> pl.Series:
    """`distinct_codes`' codes alone: a column to sort by in place of `values` (`keep`: as `Coded.of`)."""
    if _CODED.get() is not None:
        return Coded.of(values, keep).as_series()
    return distinct_codes(values)[1]


# The text columns coded so far in this `coded_once` (values, codes), newest last; None outside one.
_CODED: ContextVar[list[tuple[pl.Series, Coded]] | None] = ContextVar("coded_text_columns", default=None)
_CODED_KEPT = 8  # more than an analysis keeps: the ops' names, the kernels' names and streams, the launches' names


@contextmanager
def coded_once() -> Iterator[None]:
    """Within: a text column kept (`Coded.of`) is coded once, however many stages match rules against it or sort by it.

    An analysis found the distinct values of the ops' and kernels' names and the kernels' streams twelve times. A
    column is found again by comparing values (1-2 ms for 587 k names, no hashing), so the codes returned always
    belong to the values asked about. The columns kept are held until the block ends.
    """
    token = _CODED.set([])
    try:
        yield
    finally:
        _CODED.reset(token)


def empty(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


@dataclass
class Warnings:
    """Counts of what could not be used, per reason, so nothing is dropped silently."""

    counts: Counter = field(default_factory=Counter)

    def add(self, reason: str, n: int = 1) -> None:
        if n:
            self.counts[reason] += n

    def lines(self) -> list[str]:
        return [f"{reason} ({n})" if n > 1 else reason for reason, n in self.counts.items()]


@dataclass
class Trace:
    ops: pl.DataFrame  # host/framework ops and user annotations (cpu_op, user_annotation)
    kernels: pl.DataFrame  # device activities: kernels, memcpy, memset
    launches: pl.DataFrame  # runtime/driver calls that carry a correlation id
    markers: pl.DataFrame  # device rows that are not device work
    steps: pl.DataFrame  # host step spans (ProfilerStep#N or fallbacks)
    meta: dict[str, Any]
    warnings: Warnings


# How ops are stored: by host thread, then start, outer before inner (longer first), then number.
OP_ORDER = (["pid", "tid", "ts", "dur", "op_id"], [False, False, False, True, False])


def in_thread_order(ops: pl.DataFrame) -> bool:
    """Each op sorts at or before the next by OP_ORDER (nulls first): one pass over neighbours, no sort."""
    if ops.height < 2:
        return True
    cols, desc = OP_ORDER
    after = None  # "this row is not after the next one", built from the last key to the first
    for c, d in reversed(list(zip(cols, desc))):
        a, b = pl.col(c), pl.col(c).shift(-1)
        before = (a.is_null() & b.is_not_null()) | (a.is_not_null() & b.is_not_null() & ((a > b) if d else (a < b)))
        same = a.eq_missing(b)
        after = before if after is None else before | (same & after)
    assert after is not None  # OP_ORDER names at least one key
    ok = ops.select(after.fill_null(True).head(ops.height - 1).all()).item()  # the last row has no next
    return bool(ok)


def thread_order(ops: pl.DataFrame) -> pl.DataFrame:
    """Ops by host thread, then start, outer before inner (longer first); a no-op when already so."""
    if in_thread_order(ops):
        return ops  # the Kineto parser stores this order: no copy of the table
    # Threads ranked first: faster than sorting by two text columns; checked, else a plain sort.
    thread = pl.struct("pid", "tid").rank("dense")
    # Most traces write each thread's ops in order, threads interleaved (by chunk, by step): then the threads moved
    # apart keeping each one's order is the order, found by a stable sort of one integer key (the 476 MB trace's
    # 587 k ops: 41 against 93 ms), checked on the keys alone.
    by_thread = ops.select(pl.arg_sort_by(thread, maintain_order=True)).to_series()
    if in_thread_order(ops.select(OP_ORDER[0])[by_thread]):
        return compact(ops[by_thread])  # the gather filled null columns
    out = ops[
        ops.select(pl.arg_sort_by([thread, "ts", "dur", "op_id"], descending=[False, False, True, False])).to_series()
    ]
    return compact(
        out if in_thread_order(out) else out.sort(OP_ORDER[0], descending=OP_ORDER[1])
    )  # the gather filled null columns
