"""Advice lines name tied groups in one order: the same trace gives the same report text on every run (a group_by's
order is not fixed, so a sort by time alone let equal times come out either way)."""

import random

import polars as pl

from traceflops.views.advice.items import by_phase


def test_phases_of_equal_time_are_named_in_one_order():
    rows = [("recompute", 10.0), ("forward", 4.0), ("forward", 6.0), ("backward", 5.0), ("optimizer", 5.0)]
    lines = set()
    rng = random.Random(3)
    for _ in range(30):
        rng.shuffle(rows)
        frame = pl.DataFrame({"phase": [p for p, _ in rows], "dur": [d for _, d in rows]})
        lines.add(by_phase(frame, None))
    # equal times by name: forward before recompute, backward before optimizer
    assert lines == {"by phase (as time): forward 33.3%, recompute 33.3%, backward 16.7%, optimizer 16.7%"}
