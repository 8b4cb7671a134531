"""A loss budget with unknown terms says which, why, and what they hold together, in the report's headline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import gemm_trace_file
from traceflops.core.sections import Hardware
from traceflops.metrics.budget import BudgetInputs, loss_budget, unknown_terms
from traceflops.report.html import render_html
from traceflops.report.terminal import render
from traceflops.run.load import analyze

CPU = Path(__file__).resolve().parents[2] / "fixtures" / "cpu" / "sq_eager_manual.json.gz"

HW = Hardware(name="X", precision="bf16", sparse=False, peak_flops=1e15, devices=1, source="test")


def test_no_peak_by_hand():
    # 1000 µs: 300 matmul (known FLOPs), 200 other compute, 500 idle; no peak
    b = loss_budget(BudgetInputs(window_us=1000.0, peak_flops=None, model_flops=None, executed_flops=1e9,
                                 time_us={"matmul_known": 300.0, "other_compute": 200.0, "idle": 500.0}))
    u = unknown_terms(b, None)
    assert u["terms"] == ["mfu", "extra_executed", "recompute", "attention_mask_credit", "matmul_below_peak"]
    assert u["share"] == pytest.approx(0.3)  # the matmul time: what the FLOP terms and matmul_below_peak share out
    assert "hardware is unknown" in u["why"]


def test_no_model_flops_by_hand():
    # a peak of 1e12 FLOP/s, 1000 µs: 1e9 FLOP at peak; 4e8 executed, model unknown
    b = loss_budget(BudgetInputs(window_us=1000.0, peak_flops=1e12, model_flops=None, executed_flops=4e8,
                                 time_us={"matmul_known": 600.0, "idle": 400.0}))
    u = unknown_terms(b, HW)
    assert u["terms"] == ["mfu", "extra_executed"]
    assert u["share"] == pytest.approx(0.4)  # executed − recompute at peak
    assert "model FLOPs" in u["why"]


def test_known_budget_has_no_unknown_terms():
    b = loss_budget(BudgetInputs(window_us=1000.0, peak_flops=1e12, model_flops=4e8, executed_flops=4e8,
                                 time_us={"matmul_known": 600.0, "idle": 400.0}))
    assert unknown_terms(b, HW) is None


@pytest.mark.skipif(not CPU.exists(), reason="project CPU fixture missing")
def test_cpu_trace_headline_says_which_terms_are_unknown(capsys):
    a = analyze(str(CPU))
    lb = a.totals["loss_budget"]
    shown = sum(v for v in lb.values() if v is not None)
    assert shown < 0.99  # the case: the visible terms do not reach 100%
    u = a.totals["loss_budget_unknown"]
    assert u["share"] == pytest.approx(1.0 - shown)
    # without a peak, the unknown terms are exactly the matmul time (all of its FLOPs known here) over the window
    t = a.totals["time_us"]
    assert a.totals["flops_coverage"] == 1.0
    assert u["share"] == pytest.approx(t["matmul"] / sum(t.values()), rel=1e-9)
    render(a)
    out = capsys.readouterr().out
    head = out[: out.index("Matmul FLOPs by phase")]
    assert "loss budget: mfu, extra_executed, recompute, attention_mask_credit, matmul_below_peak unknown" in head
    assert "sums to 100%" not in out
    html = render_html(a)
    assert "matmul_below_peak unknown: no peak" in html and "summing to 100%" not in html


def test_known_peak_report_has_no_unknown_line(tmp_path, capsys):
    a = analyze(gemm_trace_file(tmp_path / "g.json", 4096, 4096, 4096, 300.0))
    assert a.totals["loss_budget_unknown"] is None
    render(a)
    assert "unknown:" not in capsys.readouterr().out.split("Matmul FLOPs by phase")[0]
