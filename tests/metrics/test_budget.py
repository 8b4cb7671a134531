"""Loss budget: fractions of peak × window, worked out by hand, summing to exactly 1."""

from __future__ import annotations

import pytest

from traceflops.metrics.budget import (
    TERMS,
    BudgetInputs,
    check_budget,
    inputs_from_row,
    loss_budget,
    sum_inputs,
)

# 1 ms on a 1 PFLOP/s device: peak × window = 1e12 FLOPs.
WINDOW_US = 1000.0
PEAK = 1e15
TIME = {"matmul_known": 500.0, "matmul_unknown": 50.0, "other_compute": 200.0, "memcpy": 30.0,
        "communication_exposed": 70.0, "idle": 150.0}  # sums to 1000


def inputs(**over) -> BudgetInputs:
    base = dict(window_us=WINDOW_US, peak_flops=PEAK, model_flops=3e11, executed_flops=4.5e11,
                recompute_flops=1e11, attention_full_flops=1e11, attention_effective_flops=0.6e11, time_us=TIME)
    base.update(over)
    return BudgetInputs(**base)


def test_hand_computed_budget():
    # mfu 3e11/1e12; extra (4.5 − 1 − 3)e11/1e12; recompute 1e11/1e12;
    # mask credit −(1 − 0.6)e11/1e12; these add to 0.41 = effective executed at peak;
    # matmul_below_peak = 500/1000 − 0.41; then the time fractions.
    b = loss_budget(inputs())
    want = {"mfu": 0.30, "extra_executed": 0.05, "recompute": 0.10, "attention_mask_credit": -0.04,
            "matmul_below_peak": 0.09, "matmul_flops_unknown": 0.05, "non_matmul": 0.20,
            "memcpy_exposed": 0.03, "communication_exposed": 0.07, "idle": 0.15}
    assert list(b) == list(TERMS)
    for k, v in want.items():
        assert b[k] == pytest.approx(v, abs=1e-12), k
    assert abs(sum(b.values()) - 1.0) <= 1e-12


def test_extra_executed_is_negative_when_the_model_needs_more_than_ran():
    # a config says 5e11 per step, the trace executed 4e11 (no recompute): −0.1
    b = loss_budget(inputs(model_flops=5e11, executed_flops=4e11, recompute_flops=0.0,
                           attention_full_flops=0.0, attention_effective_flops=0.0))
    assert b["mfu"] == pytest.approx(0.5)
    assert b["extra_executed"] == pytest.approx(-0.1)
    assert b["matmul_below_peak"] == pytest.approx(0.5 - 0.4)
    assert abs(sum(b.values()) - 1.0) <= 1e-12


def test_causal_mask_credit():
    # causal attention credited 2e11 (full), the flash kernels did 1e11: credit −0.1,
    # and the matmul time is judged on 4.5e11 − 1e11 = 3.5e11 of work: below peak 0.5 − 0.35.
    b = loss_budget(inputs(attention_full_flops=2e11, attention_effective_flops=1e11))
    assert b["attention_mask_credit"] == pytest.approx(-0.1)
    assert b["matmul_below_peak"] == pytest.approx(0.15)
    assert b["mfu"] + b["extra_executed"] + b["recompute"] + b["attention_mask_credit"] == pytest.approx(0.35)
    assert abs(sum(b.values()) - 1.0) <= 1e-12


def test_unknown_peak_or_model_leaves_those_terms_none():
    b = loss_budget(inputs(peak_flops=None))
    assert [k for k, v in b.items() if v is None] == ["mfu", "extra_executed", "recompute", "attention_mask_credit", "matmul_below_peak"]
    assert b["idle"] == pytest.approx(0.15)
    b = loss_budget(inputs(model_flops=None))
    assert [k for k, v in b.items() if v is None] == ["mfu", "extra_executed"]
    assert b["recompute"] == pytest.approx(0.1) and b["matmul_below_peak"] == pytest.approx(0.09)


def test_empty_window_has_no_budget():
    assert loss_budget(inputs(window_us=0.0)) is None


def test_a_partition_that_misses_the_window_is_refused():
    with pytest.raises(ValueError, match="sums to"):
        loss_budget(inputs(time_us={**TIME, "idle": 149.0}))
    with pytest.raises(ValueError):
        check_budget({k: 0.1 for k in TERMS} | {"idle": 0.2})
    check_budget({k: 0.1 for k in TERMS})  # sums to 1: fine


def test_totals_are_the_budget_of_summed_inputs():
    # step A: the hand example (1000 µs); step B: 3000 µs, all idle, no FLOPs.
    a = inputs()
    b = BudgetInputs(window_us=3000.0, peak_flops=PEAK, model_flops=0.0, executed_flops=0.0, time_us={"idle": 3000.0})
    t = loss_budget(sum_inputs([a, b]))
    # over 4 ms: mfu 3e11/4e12, idle (150 + 3000)/4000
    assert t["mfu"] == pytest.approx(0.075)
    assert t["idle"] == pytest.approx(3150 / 4000)
    assert t["matmul_below_peak"] == pytest.approx(500 / 4000 - 4.1e11 / 4e12)
    assert abs(sum(t.values()) - 1.0) <= 1e-12
    assert sum_inputs([]) is None
    assert (a + BudgetInputs(1.0, PEAK, None, 0.0, time_us={"idle": 1.0})).model_flops is None
    with pytest.raises(ValueError, match="peaks"):
        a + BudgetInputs(1.0, 2 * PEAK, 0.0, 0.0, time_us={"idle": 1.0})


def test_inputs_from_step_and_partition_rows():
    step = {"step": 3, "window": 1000.0, "model_flops": 3e11, "flops_executed": 4.5e11, "flops_recompute": 1e11,
            "attention_full_flops": 1e11, "attention_effective_flops": 0.6e11}
    part = {"device": 0, "step": 3, "window": 1000.0, "matmul": 550.0, **TIME, "communication_overlapped": 12.0}
    assert loss_budget(inputs_from_row(step, part, PEAK)) == loss_budget(inputs())


def test_budget_of_a_real_trace_sums_to_one(shared):
    """MI300 checkpointed ResNet: per step and in total, the budget closes to 1e-9."""
    import polars as pl

    from traceflops.run.load import analyze
    from traceflops.stages.timeline import partition

    a = analyze(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"))
    p = partition(a.kernels, a.steps).sort("step")
    peak = a.hardware["peak_flops"]
    rows = [inputs_from_row(s, t, peak) for s, t in zip(a.steps.sort("step").iter_rows(named=True), p.iter_rows(named=True))]
    for b in [loss_budget(r) for r in rows] + [loss_budget(sum_inputs(rows))]:
        assert None not in b.values()
        assert abs(sum(b.values()) - 1.0) <= 1e-9
        assert b["matmul_below_peak"] >= 0
        assert b["recompute"] > 0  # 19 recomputed convolutions per step
    assert p["step"].to_list() == a.steps.sort("step")["step"].to_list()
    assert isinstance(p, pl.DataFrame)
