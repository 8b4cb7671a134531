"""How a launch's work is split among its kernels in the roofline (`roofline._share`): by duration, equally where the
durations sum to zero, and only among kernels of one class."""

import random

import polars as pl
import pytest

from traceflops.stages.roofline import _share


def _frame(rows):
    return pl.DataFrame(rows, schema={"cls": pl.Utf8, "dur": pl.Float64, "op_row": pl.Int64}, orient="row")


def test_shares_by_duration_equal_when_zero_and_none_for_other_classes():
    k = _frame(
        [
            ("matmul", 1.0, 5),
            ("matmul", 3.0, 5),
            ("other_compute", 9.0, 5),  # another class: neither shares nor counts
            ("matmul", 0.0, 6),
            ("matmul", 0.0, 7),
            ("matmul", 0.0, 7),
        ]
    )
    got = _share(k, "op_row", "matmul").to_list()
    assert got == [0.25, 0.75, None, 1.0, 0.5, 0.5]


def _window(k: pl.DataFrame, key: str, cls: str) -> pl.Series:
    """The same rule as polars window expressions (a kernel without a key in one group with the others without)."""
    mine = pl.when(pl.col("cls") == cls).then(pl.col("dur"))
    den, cnt = mine.sum().over(key), mine.count().over(key)
    share = pl.when(pl.col("cls") != cls).then(None).when(den > 0).then(pl.col("dur") / den).otherwise(1.0 / cnt)
    return k.select(pl.when(pl.col("cls") == cls).then(share)).to_series()


@pytest.mark.parametrize("seed", range(12))
def test_shares_match_a_window_over_each_key(seed):
    r = random.Random(seed)
    rows = [
        (
            r.choice(["matmul", "other_compute", None]),
            r.choice([None, 0.0, 0.0, r.uniform(0, 50)]),
            r.choice([None, -1, *range(8)]),
        )
        for _ in range(300)
    ]
    k = _frame(rows)
    for cls in ("matmul", "other_compute"):
        got, want = _share(k, "op_row", cls).to_list(), _window(k, "op_row", cls).to_list()
        assert [g is None for g in got] == [w is None for w in want]
        assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], rel=1e-12)
