"""A matmul op whose formula gave no dtype takes its first input's, as the profiler recorded its input types; every
other op keeps its own (none, or the formula's)."""

import json
import random

import polars as pl

from traceflops.stages.count import apply_hints

# The profiler's names of the types used below, and the dtype each means (PyTorch's c10 scalar types).
MEANS = {"c10::BFloat16": "bf16", "float": "fp32", "c10::Half": "fp16"}
TYPES = [None, '["c10::BFloat16", "c10::BFloat16"]', '["float", "c10::Half"]', '["c10::Half"]', "[]", '["", "float"]']


def _expected(matmul: bool, dtype: str | None, types: str | None) -> str | None:
    if not matmul or dtype is not None or types is None:
        return dtype
    first = json.loads(types)[:1]
    return MEANS.get(first[0]) if first else None


def test_each_row_reads_as_its_own_first_input_type():
    r = random.Random(7)
    rows = [(r.random() < 0.3, r.choice([None, None, "fp8"]), r.choice(TYPES)) for _ in range(3000)]
    ops = pl.DataFrame(
        {
            "matmul": [m for m, _, _ in rows],
            "dtype": [d for _, d, _ in rows],
            "types": [t for _, _, t in rows],
            "flops_hint": [None] * len(rows),
            "bytes_hint": [None] * len(rows),
        },
        schema={"matmul": pl.Boolean, "dtype": pl.Utf8, "types": pl.Utf8, "flops_hint": pl.Float64,
                "bytes_hint": pl.Float64},
    )
    got = apply_hints(ops)
    assert got["dtype"].to_list() == [_expected(*row) for row in rows]
    assert got.drop("dtype").equals(ops.drop("dtype"))


def test_no_matmul_needing_one_leaves_the_column_as_it_was():
    ops = pl.DataFrame(
        {"matmul": [True, False], "dtype": ["fp16", None], "types": ['["float"]', '["float"]'],
         "flops_hint": [None, None], "bytes_hint": [None, None]},
        schema={"matmul": pl.Boolean, "dtype": pl.Utf8, "types": pl.Utf8, "flops_hint": pl.Float64,
                "bytes_hint": pl.Float64},
    )
    assert apply_hints(ops)["dtype"].to_list() == ["fp16", None]
