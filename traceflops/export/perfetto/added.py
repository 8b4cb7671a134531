"""The args annotate adds to a device activity or an op, as JSON text per analysis row, spliced into the entry's bytes.

An entry that gains args and that nothing else changes (no value the secrets
rules could touch, see `stream`) is written as its own bytes with the new
members inserted before its args object closes: never decoded, never
re-encoded. The members' text is what orjson writes for the values
`stream` adds to a decoded event (`tracks.num`, `tracks.tflops`, computed
column-wise with the same float operations in the same order), so a spliced
entry reads back as the same JSON as the decoded route writes.
"""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl

from traceflops.core.redact import MAY_CHANGE, redact_bytes

_NULL = "null"


def _key(name: str) -> str:
    return orjson.dumps(name).decode() + ":"


def json_strings(s: pl.Series) -> pl.Series:
    """Each value as a JSON string (null as null); each distinct value encoded once."""
    s = s.cast(pl.Utf8)
    distinct = s.drop_nulls().unique().to_list()
    if not distinct:
        return pl.Series(s.name, [_NULL] * s.len(), dtype=pl.Utf8)
    text = {v: orjson.dumps(v).decode() for v in distinct}
    return s.replace_strict(text, default=None, return_dtype=pl.Utf8).fill_null(_NULL)


def json_floats(s: pl.Series) -> pl.Series:
    """A float column as orjson writes each value (`float(v)`; null, NaN and infinities as null).

    Polars writes a finite double as orjson does (the shortest text that reads back as it, the same notation:
    `tests/report/test_annotate_bytes.py` holds them to it over random bit patterns), so no value becomes a Python
    object."""
    f = s.cast(pl.Float64)
    return pl.select(pl.when(f.is_finite()).then(f.cast(pl.Utf8)).otherwise(pl.lit(_NULL))).to_series().rename(s.name)


def json_nums(s: pl.Series) -> pl.Series:
    """`tracks.num` of each value as orjson writes it: an integral float under 2**53 as an integer, NaN as null."""
    f = s.cast(pl.Float64)
    integral = (f.is_finite() & (f.floor() == f) & (f.abs() < 2.0**53)).fill_null(False)
    ints = f.cast(pl.Int64, strict=False).cast(pl.Utf8)
    return pl.select(pl.when(integral).then(ints).otherwise(json_floats(f))).to_series().rename(s.name)


def json_values(s: pl.Series) -> pl.Series:
    """A column's values as orjson writes what polars hands out for them (integers, floats or text)."""
    if s.dtype.is_integer():
        return s.cast(pl.Utf8).fill_null(_NULL)
    if s.dtype.is_float():
        return json_floats(s)
    if s.dtype == pl.Boolean:
        return pl.select(pl.when(s).then(pl.lit("true")).otherwise(pl.lit("false"))).to_series().fill_null(_NULL)
    return json_strings(s)


def rates(flops: pl.Series, dur: pl.Series) -> pl.Series:
    """`tracks.tflops` over columns: TFLOP/s, null where the FLOPs are unknown or the duration is not positive.

    Divided in numpy, in `tflops`' order: polars may divide by a constant as a
    multiplication by its reciprocal, a last bit apart from what the decoded
    route writes (127 of 1,000 sampled rates).
    """
    f, d = flops.cast(pl.Float64), dur.cast(pl.Float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = pl.Series(f.to_numpy() / (d.to_numpy() * 1e-6) / 1e12, dtype=pl.Float64)
    return pl.select(
        pl.when(f.is_null() | d.is_null() | (d <= 0)).then(pl.lit(None, pl.Float64)).otherwise(quotient)
    ).to_series()


class Members:
    """Each row's members as one text column (a slice is read per array: a Python object per row for a whole trace
    would hold hundreds of MB), with the rows the shape rules changed kept apart, and how many values they replaced."""

    def __init__(self, text: pl.Series, changed: dict[int, bytes], shaped: dict[int, int]) -> None:
        self.text, self.changed, self.shaped = text.cast(pl.Binary), changed, shaped
        self.changed_at = np.array(sorted(changed), dtype=np.int64)  # the few rows to patch, found by binary search

    def run(self, lo: int, n: int) -> list[bytes]:
        """Rows lo … lo + n - 1, as the bytes written."""
        got = self.text.slice(lo, n).to_list()
        for j in self._changed_in(lo, n):
            got[j - lo] = self.changed[j]
        return got

    def column(self, lo: int, n: int) -> tuple[pl.Series, int]:
        """Rows lo … lo + n - 1 as the text written (one column), and how many values the shape rules replaced in
        them."""
        got, changed = self.text.slice(lo, n), self._changed_in(lo, n)
        if changed:
            got = got.scatter([j - lo for j in changed], [self.changed[j] for j in changed])
        return got.cast(pl.Utf8), sum(self.shaped[j] for j in changed)

    def shaped_at(self, rows: np.ndarray) -> int:
        """How many values the shape rules replaced in these rows' members."""
        hit = self.changed_at[np.isin(self.changed_at, rows)] if len(self.changed_at) else self.changed_at
        return sum(self.shaped[j] for j in hit.tolist())

    def _changed_in(self, lo: int, n: int) -> list[int]:
        a, b = np.searchsorted(self.changed_at, [lo, lo + n])
        return self.changed_at[a:b].tolist()


def _joined(parts: list[pl.Expr], frame: pl.DataFrame) -> Members:
    """Each row's members, with the shape rules applied as they are to every written byte (`redact_bytes`), and, by
    row, how many values those replaced where any were."""
    if frame.height == 0:
        return Members(pl.Series("m", [], dtype=pl.Utf8), {}, {})
    text = frame.select(pl.concat_str(parts, separator="").alias("m"))["m"]
    changed, shaped = {}, {}
    for j in text.str.contains(MAY_CHANGE).arg_true().to_list():
        out, n = redact_bytes(text[j].encode())
        if n:
            changed[j], shaped[j] = out, n
    return Members(text, changed, shaped)


def kernel_members(k: pl.DataFrame) -> Members:
    """Per row of `k` (the device activities' values, `stream._kernel_args`): the members `_add_kernel_args` adds, as
    the text inside an object (no braces), and the values the shape rules
    replaced in them, by row."""
    rate = rates(k["flops"], k["dur"])
    cols = pl.DataFrame(
        [
            json_strings(k["phase"]).alias("phase"),
            json_strings(k["cls"]).alias("cls"),
            json_nums(k["flops"]).alias("flops"),
            json_floats(rate).alias("rate"),
            json_values(k["step"]).alias("step"),
            json_strings(k["module"]).alias("module"),
            json_strings(k["bound"]).alias("bound"),
            json_floats(k["intensity"]).alias("intensity"),
            json_floats(k["recoverable_us"]).alias("recoverable_us"),
        ]
    )
    given = {c: k[c].is_not_null() for c in ("module", "bound", "intensity", "recoverable_us")}
    cols = cols.with_columns(**{f"has_{c}": v for c, v in given.items()})
    parts = [
        pl.lit(_key("traceflops.phase")),
        pl.col("phase"),
        pl.lit("," + _key("traceflops.class")),
        pl.col("cls"),
        pl.lit("," + _key("traceflops.flops")),
        pl.col("flops"),
        pl.lit("," + _key("traceflops.achieved_tflops")),
        pl.col("rate"),
        pl.lit("," + _key("traceflops.step")),
        pl.col("step"),
    ]
    for c in given:
        parts.append(
            pl.when(pl.col(f"has_{c}")).then(pl.lit("," + _key(f"traceflops.{c}")) + pl.col(c)).otherwise(pl.lit(""))
        )
    return _joined(parts, cols)


def op_members(o: pl.DataFrame) -> Members:
    """Per row of `o` (the ops' values: phase, matmul, ran, flops): the members `_add_op_args` adds, as the text
    inside an object, and the values the shape rules replaced in them, by
    row."""
    cols = pl.DataFrame(
        [
            json_strings(o["phase"]).alias("phase"),
            o["matmul"].cast(pl.Boolean).fill_null(False).alias("matmul"),
            o["ran"].cast(pl.Boolean).fill_null(False).alias("ran"),
            json_nums(o["flops"]).alias("flops"),
        ]
    )
    parts = [
        pl.lit(_key("traceflops.phase")),
        pl.col("phase"),
        pl.when(pl.col("matmul"))
        .then(
            pl.lit("," + _key("traceflops.flops"))
            + pl.col("flops")
            + pl.lit("," + _key("traceflops.ran"))
            + pl.when(pl.col("ran")).then(pl.lit("true")).otherwise(pl.lit("false"))
        )
        .otherwise(pl.lit("")),
    ]
    return _joined(parts, cols)


_WS = b" \t\r\n"
_BLANKS = _WS.decode()


def _before_last(text: pl.Expr, n: pl.Expr | int) -> pl.Expr:
    """`text` without its last `n` characters (empty where it has fewer)."""
    return text.str.head(-n if isinstance(n, int) else -n.cast(pl.Int64))


# How an entry takes its members (`holes`): not at all (written through as read: only its name is checked), into
# its empty args, into its args after a ',', as a new args object after the entry's '{' or after a ','; or the entry
# is decoded and given its args as a decoded event is.
AS_READ, INTO_EMPTY, INTO, NEW_FIRST, NEW, DECODED = range(6)
FORMS = {INTO_EMPTY: (b"", b""), INTO: (b",", b""), NEW_FIRST: (b'"args":{', b"}"), NEW: (b',"args":{', b"}")}
# What goes before and after the members, by form (nothing for AS_READ and DECODED).
BEFORE = [FORMS.get(f, (b"", b""))[0] for f in range(DECODED + 1)]
AFTER = [FORMS.get(f, (b"", b""))[1] for f in range(DECODED + 1)]


def holes(entries: list[bytes], args: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For entries of ASCII text without a backslash (every quote in them is real), in column operations: whether
    each can take members as bytes (it has no args key, or its args are an object that is its last member: else it
    is decoded), where they go (a byte offset into the entry: its args' closing brace, or the end of its body, where
    an args object is created last) and how (`FORMS`).

    `args` is the text of each entry's args value as a strict decode read it (the last `args` key's), None or empty
    where it has no args key (no JSON value is empty).
    """
    if not entries:
        return np.zeros(0, bool), np.zeros(0, np.int64), np.zeros(0, np.uint8)
    frame = pl.DataFrame(
        {"e": pl.Series(entries, dtype=pl.Binary).cast(pl.Utf8), "a": pl.Series(args, dtype=pl.Binary).cast(pl.Utf8)}
    )
    entry, a = pl.col("e"), pl.when(pl.col("a") != "").then(pl.col("a"))
    body = _before_last(entry, 1).str.strip_chars_end(_BLANKS)
    n = a.str.len_bytes().cast(pl.Int64)
    key = _before_last(body, n).str.strip_chars_end(_BLANKS)
    last = (
        a.str.starts_with("{")
        & body.str.ends_with(a)
        & key.str.ends_with(":")
        & _before_last(key, 1).str.strip_chars_end(_BLANKS).str.ends_with('"args"')
    )
    empty = _before_last(a, 1).str.tail(n - 2).str.strip_chars(_BLANKS) == ""  # args[1:-1] holds no member
    size = body.str.len_bytes().cast(pl.Int64)
    got = frame.select(
        fits=a.is_null() | last.fill_null(False),
        offset=pl.when(a.is_null()).then(size).otherwise(size - 1),  # the body's end, or its args' closing brace
        form=pl.when(a.is_null())
        .then(pl.when(body.str.ends_with("{")).then(NEW_FIRST).otherwise(NEW))
        .otherwise(pl.when(empty).then(INTO_EMPTY).otherwise(INTO))
        .cast(pl.UInt8),
    )
    return got["fits"].to_numpy(), got["offset"].to_numpy(), got["form"].to_numpy()
