"""`coded_once`: within an analysis each text column is coded once, and what is found again is always the codes of the
values asked about (a column of the same name and length but other values gets its own)."""

import random
import re

import numpy as np
import polars as pl

from traceflops.core import trace as tr
from traceflops.core.trace import Coded, coded_once, name_matches, named_by, sort_codes

POOL = ["aten::mm", "aten::add_", "ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_tn", "", "cudaLaunchKernel", "é"]


def _names(seed: int, n: int = 400) -> list[str | None]:
    r = random.Random(seed)
    return [None if r.random() < 0.1 else r.choice(POOL) for _ in range(n)]


def _decoded(coded: Coded) -> list[str | None]:
    """Each row's value read back through its code (the last code: null)."""
    distinct = coded.distinct.to_list() + [None]
    return [distinct[c] for c in coded.codes.tolist()]


def test_an_equal_column_is_found_again_and_another_is_coded_apart():
    a = _names(1)
    with coded_once():
        first = Coded.of(pl.Series("name", a), keep=True)
        again = Coded.of(pl.Series("name", list(a)))  # equal values, another series
        other_values = _names(2)
        other = Coded.of(pl.Series("name", other_values), keep=True)  # same name and length, other values
        assert again is first
        assert other is not first
        assert _decoded(first) == a
        assert _decoded(other) == other_values
        assert first.distinct.to_list() == sorted({x for x in a if x is not None})
    assert Coded.found(pl.Series("name", a)) is None  # nothing is kept once the block ends


def test_a_column_not_kept_is_not_held():
    """A column a stage derives for itself (not kept) is coded, and let go: another stage codes it again."""
    a = pl.Series("name", _names(3))
    with coded_once():
        coded = Coded.of(a)
        assert _decoded(coded) == a.to_list()
        assert Coded.found(a) is None
        assert sort_codes(a).to_list() == sort_codes(a, keep=True).to_list()
        assert Coded.found(a) is not None


def test_rules_and_sort_codes_read_as_the_rows_do_inside_and_outside():
    """Per row, as Python's `re` reads it (a null matches nothing), whether the column was coded before or not."""
    for seed in range(6):
        texts = _names(seed)
        names = pl.Series("name", texts, dtype=pl.Utf8)
        truth = [t is not None and bool(re.search("sgemm", t)) and not re.search("_tn$", t) for t in texts]
        assert name_matches(names, "sgemm", unless="_tn$").to_list() == truth
        with coded_once():
            assert name_matches(names, "sgemm", unless="_tn$").to_list() == truth  # not coded yet: matched as is
            Coded.of(names, keep=True)
            assert name_matches(names, "sgemm", unless="_tn$").to_list() == truth  # through the codes
            hit = named_by(names, lambda n: n.str.starts_with("aten::") | n.str.ends_with("nn")).to_list()
            assert hit == [t is not None and (t.startswith("aten::") or t.endswith("nn")) for t in texts]
            frame = pl.DataFrame({"t": names, "i": range(len(texts))})
            for nulls_last in (True, False):
                by_text = frame.sort(["t", "i"], nulls_last=nulls_last)["i"].to_list()
                by_code = frame.with_columns(c=sort_codes(names)).sort(["c", "i"], nulls_last=nulls_last)["i"]
                assert by_code.to_list() == by_text, (seed, nulls_last)


def test_the_columns_held_are_bounded():
    """A block codes many columns (a long analysis): only the newest few are held, the first is let go."""
    columns = [pl.Series("name", [f"n{i}", f"m{i}", None]) for i in range(3 * tr._CODED_KEPT)]
    with coded_once():
        coded = [Coded.of(c, keep=True) for c in columns]
        assert Coded.found(columns[0]) is None
        assert Coded.found(columns[-1]) is coded[-1]
        assert _decoded(Coded.of(columns[0], keep=True)) == columns[0].to_list()  # coded again, rightly


def test_codes_of_an_empty_or_all_null_column():
    with coded_once():
        assert Coded.of(pl.Series("name", [], dtype=pl.Utf8)).codes.tolist() == []
        nulls = Coded.of(pl.Series("name", [None, None], dtype=pl.Utf8))
        assert nulls.contains("").tolist() == [False, False]
        assert sort_codes(pl.Series("name", [None, None], dtype=pl.Utf8), keep=True).to_list() == [None, None]
        assert sort_codes(pl.Series("name", [None, None], dtype=pl.Utf8)).to_list() == [None, None]  # found again
        assert np.array_equal(nulls.codes, [0, 0])
