"""Columns null throughout (shapes, collectives in a trace without them) cost no memory, also once the ops are reordered.

A null column gathered into a new order is written out value by value: 16
resident bytes per row for text, 8 for a number. The parser reorders every
trace's ops into thread order, so this is most traces' case.
"""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl
import pytest

from traceflops.core.trace import compact, null_column

ROWS = 1_000_000
# Resident memory after reordering a table of ROWS ops with 8 null columns (6 text, 2 integer): the five real
# columns' new copies are ~56 MiB (two text, three numbers); written-out null columns would add 6·16 + 2·8 = 112 MiB.
PROBE = f"""
import gc, os, time
import numpy as np, polars as pl
from traceflops.core.trace import null_column, thread_order
def rss():
    gc.collect(); time.sleep(0.2)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
n = {ROWS}
rng = np.random.default_rng(0)
ops = pl.DataFrame({{"op_id": np.arange(n), "pid": pl.Series(["1"] * n), "tid": pl.Series(["2"] * n),
                    "ts": rng.random(n), "dur": np.ones(n)}}).with_columns(
    [null_column(n, pl.Utf8).alias(f"text{{i}}") for i in range(6)] + [null_column(n, pl.Int64).alias(f"int{{i}}") for i in range(2)])
before = rss()
out = thread_order(ops)
assert out["ts"].is_sorted()
print(rss() - before)
"""


def test_null_columns_stay_free_when_the_ops_are_put_in_thread_order():
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}  # freed pages leave at once
    grew = float(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout)
    assert grew < 80, f"reordering grew resident memory by {grew:.0f} MiB: the null columns were written out"


@pytest.mark.parametrize("dtype", [pl.Utf8, pl.Int64, pl.Float64, pl.Boolean])
def test_compact_keeps_every_value_and_type(dtype):
    n = 5
    df = pl.DataFrame({"kept": pl.Series([1, None, 3, None, 5], dtype=pl.Int64), "null": null_column(n, dtype).gather([4, 3, 2, 1, 0])})
    out = compact(df)
    assert out.schema == df.schema and out.equals(df)
    assert out["kept"].to_list() == [1, None, 3, None, 5] and out["null"].null_count() == n
