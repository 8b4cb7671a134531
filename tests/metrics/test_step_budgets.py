"""Every step's loss budget from whole columns equals the per-row budget, bit for bit (signed zeros and NaN too)."""

from __future__ import annotations

import math
import random

import polars as pl
import pytest

from traceflops.core.errors import ConservationError
from traceflops.metrics import budget as bd

TIME = [f"time_{k}" for k in bd.TIME_KEYS]


def _steps(n: int, seed: int = 7) -> pl.DataFrame:
    """Steps whose time columns partition the window (so budgets sum to 1), with unknowns, zeros and odd windows."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        window = rnd.choice([rnd.uniform(1, 1e6), 10.0, 0.0, -5.0, float("nan")]) if i % 5 == 0 else rnd.uniform(1, 1e6)
        w = window if isinstance(window, float) and window > 0 else 1.0
        cuts = sorted(rnd.uniform(0, w) for _ in range(len(TIME) - 1))
        parts = [b - a for a, b in zip([0.0, *cuts], [*cuts, w])]
        if i % 7 == 0:
            parts[1], parts[0] = parts[1] + parts[0], None  # a class the step did not have
        at_peak = 989.4e12 * w * 1e-6  # FLOPs of the order a step of this window does: the budget's sum is well conditioned
        rows.append({"step": i, "window": window,
                     "model_flops": rnd.choice([None, 0.0, -0.0, rnd.uniform(0, 0.5) * at_peak]),
                     "flops_executed": rnd.choice([0, None, int(0.6 * at_peak)]),
                     "flops_recompute": rnd.choice([0, None, int(0.1 * at_peak)]),
                     "attention_full_flops": rnd.choice([0.0, 0.05 * at_peak, None]),
                     "attention_effective_flops": rnd.choice([0.0, 0.02 * at_peak, -0.0]),
                     **dict(zip(TIME, parts))})
    return pl.DataFrame(rows, schema={"step": pl.Int64, "window": pl.Float64, "model_flops": pl.Float64, "flops_executed": pl.Int64,
                                      "flops_recompute": pl.Int64, "attention_full_flops": pl.Float64,
                                      "attention_effective_flops": pl.Float64, **dict.fromkeys(TIME, pl.Float64)})


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if list(a) != list(b):
        return False
    for x, y in zip(a.values(), b.values()):
        if (x is None) != (y is None):
            return False
        if x is not None and not (math.isnan(x) and math.isnan(y)) and (x != y or math.copysign(1, x) != math.copysign(1, y)):
            return False
    return True


@pytest.mark.parametrize("peak", [989.4e12, None])
def test_step_budgets_equal_the_per_row_budget(peak):
    steps = _steps(400)
    want = [bd.loss_budget(bd.step_inputs(r, peak)) for r in steps.iter_rows(named=True)]
    got = bd.step_budgets(steps, peak)
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    assert any(g is None for g in got) and any(g is not None for g in got)


def test_steps_budget_of_a_frame_is_the_rows_sum_bit_for_bit():
    steps = _steps(300).filter(pl.col("window") > 0)
    for peak in (989.4e12, None):
        assert _same(bd.steps_budget(steps, peak), bd.steps_budget(steps.iter_rows(named=True), peak))
        known = steps.with_columns(pl.col("model_flops").fill_null(1e12))
        assert _same(bd.steps_budget(known, peak), bd.steps_budget(known.iter_rows(named=True), peak))


def test_a_budget_that_misses_one_is_the_same_error():
    steps = _steps(20).filter(pl.col("window") > 0).with_columns(model_flops=pl.lit(1e9))
    bad = steps.with_columns(pl.when(pl.col("step") == steps["step"][3]).then(pl.col("time_idle") + 1.0)
                             .otherwise(pl.col("time_idle")).alias("time_idle"))
    with pytest.raises(ConservationError) as per_row:
        [bd.loss_budget(bd.step_inputs(r, 1e15)) for r in bad.iter_rows(named=True)]
    with pytest.raises(ConservationError) as whole:
        bd.step_budgets(bad, 1e15)
    assert str(whole.value) == str(per_row.value)
