"""`spread`: columns given for some op rows, over all rows or read at given op rows (the truth: a dict per row)."""

import random

import polars as pl

from traceflops.stages.link import spread


def test_read_at_rows_equals_laid_over_all_rows_then_gathered():
    for seed in range(20):
        r = random.Random(seed)
        n = r.randint(0, 30)
        given = sorted(r.sample(range(n), r.randint(0, n)))
        values = pl.DataFrame(
            {"row": given, "v": [r.random() for _ in given], "s": [r.choice(["a", None, "bb"]) for _ in given]},
            schema={"row": pl.Int64, "v": pl.Float64, "s": pl.Utf8},
        )
        truth = {row: (v, s) for row, v, s in values.iter_rows()}
        at = [r.choice([None, -1, *range(n)]) if n else r.choice([None, -1]) for _ in range(r.randint(0, 25))]
        got = spread(values, n, pl.Series(at, dtype=pl.Int64))
        expected = [truth.get(a, (None, None)) if a is not None and a >= 0 else (None, None) for a in at]
        assert list(got.iter_rows()) == expected, seed
        over_all = spread(values, n)
        assert list(over_all.iter_rows()) == [truth.get(i, (None, None)) for i in range(n)], seed
