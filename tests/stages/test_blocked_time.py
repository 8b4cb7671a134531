"""A top-level op's compute less the time its thread blocked in collectives inside it: checked against an independent
union of the blocked spans, on random nestings."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.builders import union_us
from traceflops.stages.cpu_activities import without_blocked


@pytest.mark.parametrize("seed", range(20))
def test_kept_time_is_the_op_less_the_union_of_its_blocked_spans(seed):
    rng = np.random.default_rng(seed)
    tops = 4
    ts, dur, top_of = [], [], []
    for t in range(tops):  # top-level ops 0..3, each 100 µs, 200 µs apart
        ts.append(200.0 * t)
        dur.append(100.0)
        top_of.append(t)
    for _ in range(rng.integers(0, 12)):  # blocked spans inside a random top op, overlapping each other at random
        t = int(rng.integers(0, tops))
        s = 200.0 * t + float(rng.uniform(-5, 100))
        ts.append(max(s, 200.0 * t))
        dur.append(float(rng.uniform(0, 60)))
        top_of.append(t)
    n = len(ts)
    ops = pl.DataFrame({"ts": ts, "dur": dur})
    blocking = np.r_[np.zeros(tops, bool), np.ones(n - tops, bool)]
    acts = pl.DataFrame({"_row": list(range(tops)), "ts": ts[:tops], "dur": dur[:tops]})
    out = without_blocked(acts, ops, np.array(top_of), blocking)
    for t in range(tops):
        lo, hi = ts[t], ts[t] + dur[t]
        spans = [(ts[i], ts[i] + dur[i]) for i in range(tops, n) if top_of[i] == t]
        kept = out.filter((pl.col("ts") >= lo) & (pl.col("ts") < hi))
        assert float(kept["dur"].sum()) == pytest.approx(dur[t] - union_us(spans, lo, hi), abs=1e-9)
        assert (kept["dur"] > 0).all()
