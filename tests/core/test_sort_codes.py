"""`sort_codes`: integer codes that sort a table as its text column does (the tables' long names are sorted by them)."""

import random

import numpy as np
import polars as pl

from traceflops.core.trace import Coded, distinct_codes, sort_codes


def _texts(seed: int, n: int) -> list[str | None]:
    r = random.Random(seed)
    pool = ["", "a", "A", "ab", "b", "é", "ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_tn", "z" * 300, "1", "10", "9"]
    return [None if r.random() < 0.1 else r.choice(pool) for _ in range(n)]


def test_codes_sort_as_the_text_does_nulls_included():
    for seed in range(20):
        texts = _texts(seed, 200)
        frame = pl.DataFrame({"t": texts, "i": range(len(texts))}, schema={"t": pl.Utf8, "i": pl.Int64})
        for nulls_last in (True, False):
            by_text = frame.sort(["t", "i"], nulls_last=nulls_last)["i"].to_list()
            by_code = frame.with_columns(c=sort_codes(frame["t"])).sort(["c", "i"], nulls_last=nulls_last)["i"]
            assert by_code.to_list() == by_text, seed


def test_equal_texts_share_a_code_and_null_stays_null():
    codes = sort_codes(pl.Series(["b", None, "a", "b", "a"], dtype=pl.Utf8)).to_list()
    assert codes == [1, None, 0, 1, 0]
    assert sort_codes(pl.Series([], dtype=pl.Utf8)).to_list() == []
    assert sort_codes(pl.Series([None, None], dtype=pl.Utf8)).to_list() == [None, None]


def test_distinct_codes_index_the_sorted_distinct_values():
    distinct, codes = distinct_codes(pl.Series(["b", None, "a", "b"], dtype=pl.Utf8))
    assert distinct.to_list() == ["a", "b"]
    assert [None if c is None else distinct[c] for c in codes.to_list()] == ["b", None, "a", "b"]


def test_coded_answers_as_the_rows_do():
    """`Coded`: a pattern or a per-value mapping through the distinct values gives, row by row, what running it over
    every row gives (polars over the rows is the truth)."""
    for seed in range(10):
        rows = pl.Series(_texts(seed, 300), dtype=pl.Utf8)
        coded = Coded.of(rows)
        for pattern in ("^a", "sgemm_.*_tn$", "^$", "[0-9]"):
            truth = rows.str.contains(pattern).fill_null(False).to_numpy()
            assert np.array_equal(coded.contains(pattern), truth), (seed, pattern)
        lengths = coded.per_row(coded.distinct.str.len_bytes().cast(pl.Int64).to_numpy(), -1)
        assert lengths.tolist() == rows.str.len_bytes().cast(pl.Int64).fill_null(-1).to_list()
    empty = Coded.of(pl.Series([], dtype=pl.Utf8))
    assert empty.contains("a").tolist() == []
    nulls = Coded.of(pl.Series([None, None], dtype=pl.Utf8))
    assert nulls.contains("").tolist() == [False, False] and nulls.per_row(np.array([], bool), True).tolist() == [
        True,
        True,
    ]


def test_named_by_and_name_matches_agree_with_the_rule_read_row_by_row():
    """The rule runs once per distinct name; per row it must read as Python's `re` would, a null name matching none."""
    import re

    from traceflops.core.trace import name_matches, named_by

    for seed in range(10):
        texts = _texts(seed, 300)
        names = pl.Series("name", texts, dtype=pl.Utf8)
        hit = named_by(names, lambda n: n.str.contains("^a") | n.str.ends_with("nn")).to_list()
        assert hit == [t is not None and (t.startswith("a") or t.endswith("nn")) for t in texts], seed
        got = name_matches(names, "sgemm", unless="_tn$").to_list()
        assert got == [t is not None and bool(re.search("sgemm", t)) and not re.search("_tn$", t) for t in texts]
