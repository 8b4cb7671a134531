"""A table read back from a bundle (the parsed-trace cache, a rank's summary) has each column in one piece, as the
parser builds them: parquet hands a large column back in pieces, and every query over it paid for them."""

import io

import numpy as np
import polars as pl

from traceflops.storage.bundle import bundle_bytes, read_bundle


def test_a_large_table_is_read_back_whole_and_in_one_piece():
    n = 300_000  # parquet reads this many rows back in several pieces
    table = pl.DataFrame({"ts": np.arange(n, dtype=np.float64) * 0.5, "name": [f"k{i % 13}" for i in range(n)]})
    got, meta = read_bundle(io.BytesIO(bundle_bytes({"ops": table}, {"v": 1})), name="bundle")
    assert meta == {"v": 1}
    assert got["ops"].equals(table)
    assert {c: got["ops"][c].n_chunks() for c in table.columns} == {"ts": 1, "name": 1}
