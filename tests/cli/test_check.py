"""The CI gate: `check` and `diff --fail-if`, their exit codes (0 pass, 1 failed, 5 cannot judge, 2 bad rule) and JSON.

Constructed traces with known per-step MFU (one 8192³ bf16 GEMM per step on an H100, steps of chosen length),
and the project's CPU fixtures (no peak in the table: MFU unknown).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.builders import CPU, Builder, shapes
from traceflops.cli.main import main

M = 8192
FLOPS = 2 * M**3
PEAK = 989.4e12  # H100 SXM dense bf16 (core/hardware.py)


def noisy_trace(path, windows_us: list[float], gemm_us: float = 1500.0) -> str:
    """One GEMM per step; step i lasts windows_us[i] (the last, unbounded, is left out of the totals by the report)."""
    b = Builder()
    t = 0.0
    for i, w in enumerate(windows_us):
        b.annotation(f"ProfilerStep#{i}", t, w - 1)
        b.op("aten::mm", t + 5, 20, **shapes([[M, M], [M, M]]))
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 6, t + 10, gemm_us)
        t += w
    return b.write(path)


def mfu_of(window_us: float) -> float:
    return FLOPS / (PEAK * window_us * 1e-6)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def check_json(*args):
    r = run("check", *args, "--no-cache", "--format", "json")
    return r.exit_code, json.loads(r.stdout) if r.stdout.strip().startswith("{") else r.output


# steps of 2000 µs, one slow step (a checkpoint save) and the unbounded last
WINDOWS = [2000.0, 2000.0, 8000.0, 2000.0, 2000.0, 2000.0]
MEDIAN_MFU = mfu_of(2000.0)  # 0.556


@pytest.fixture
def steady(tmp_path):
    return noisy_trace(tmp_path / "steady.json.gz", WINDOWS)


def test_a_passing_gate_exits_0_and_says_each_rules_measure_threshold_and_why(steady):
    code, d = check_json(steady, "--min-mfu", 0.5, "--max-loss", "idle=0.5")
    assert code == 0, d
    assert d["schema"] == "traceflops.check/1" and d["result"] == "pass" and d["exit_code"] == 0
    mfu = next(r for r in d["rules"] if r["metric"] == "mfu")
    assert mfu["status"] == "pass" and mfu["threshold"] == 0.5 and mfu["op"] == ">="
    assert mfu["measured"] == pytest.approx(MEDIAN_MFU, rel=1e-3)
    assert mfu["steps"] == [0, 1, 2, 3, 4]  # the unbounded last left out, as the report does
    assert "median MFU" in mfu["why"]


def test_the_median_keeps_one_slow_step_from_failing_the_gate(steady):
    mean = sum(mfu_of(w) for w in WINDOWS[:-1]) / 5  # 0.467: the slow step drags a mean below 0.5
    assert mean < 0.5
    assert check_json(steady, "--min-mfu", 0.5)[0] == 0


def test_a_rule_that_does_not_hold_exits_1(steady):
    code, d = check_json(steady, "--min-mfu", 0.6)
    assert code == 1 and d["result"] == "fail"
    assert d["rules"][0]["status"] == "fail" and "below" in d["rules"][0]["why"]


def test_a_run_within_the_tolerance_passes_and_fails_without_it(steady):
    threshold = MEDIAN_MFU + 0.003  # within the default 0.005
    assert check_json(steady, "--min-mfu", threshold)[0] == 0
    assert check_json(steady, "--min-mfu", threshold, "--tolerance", 0)[0] == 1
    assert check_json(steady, "--min-mfu", MEDIAN_MFU + 0.02, "--tolerance", "3%")[0] == 0


def test_steps_left_out_by_exclude_step_and_too_few_steps_cannot_be_judged(steady):
    code, d = check_json(steady, "--min-mfu", 0.5, "--exclude-step", 0, "--exclude-step", 1, "--min-steps", 4)
    assert code == 5 and d["result"] == "unknown"
    r = d["rules"][0]
    assert r["status"] == "unknown" and r["cause"] == "steps" and "--min-steps" in r["why"]
    assert d["traces"][0]["steps_counted"] == [2, 3, 4]
    # --allow-unknown is for values a trace cannot know, not for too few steps
    assert check_json(steady, "--min-mfu", 0.5, "--exclude-step", 0, "--min-steps", 5, "--allow-unknown")[0] == 5
    # leaving the slow step out lifts the median nowhere it was not already: still a pass on 4 steps
    assert check_json(steady, "--min-mfu", 0.5, "--exclude-step", 2, "--min-steps", 4)[0] == 0


def test_an_unknown_mfu_never_passes_silently():
    """The project's CPU fixture: no peak for a CPU, so MFU is unknown: exit 5, unless --allow-unknown."""
    trace = CPU / "ns_ckpt_nonreentrant.json.gz"
    code, d = check_json(trace, "--min-mfu", 0.01, "--max-loss", "idle=0.9")
    assert code == 5, d
    r = next(r for r in d["rules"] if r["metric"] == "mfu")
    assert r["status"] == "unknown" and r["cause"] == "value" and r["measured"] is None and "--peak-tflops" in r["why"]
    code, d = check_json(trace, "--min-mfu", 0.01, "--max-loss", "idle=0.9", "--allow-unknown")
    assert code == 0 and d["result"] == "pass"
    code, d = check_json(trace, "--min-mfu", 0.01, "--peak-tflops", 0.2)  # with a peak it is judged
    assert code == 0 and d["rules"][0]["measured"] > 0.01


def test_the_terminal_verdict_is_one_line_per_rule_and_a_summary(steady):
    r = run("check", steady, "--no-cache", "--min-mfu", 0.6, "--max-loss", "communication_exposed=0.1")
    assert r.exit_code == 1
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("FAIL") and lines[1].startswith("PASS")
    assert lines[-1].startswith("gate failed") and "exit 1" in lines[-1]


@pytest.mark.parametrize("args", [
    ["--max-loss", "nonsense=0.1"],
    ["--max-loss", "idle"],
    ["--min-mfu", "1.5"],
    ["--min-mfu", "abc"],
    [],  # no rule at all
    ["--min-mfu", "0.3", "--min-steps", "0"],
])
def test_a_bad_rule_is_bad_input_exit_2(steady, args):
    r = run("check", steady, "--no-cache", *args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: "), r.output  # one line saying what is wrong and what to write
    assert len(r.output.strip().splitlines()) == 1


# ------------------------------------------------------------------ diff --fail-if


def diff_json(before, after, *args):
    r = run("diff", before, after, "--no-cache", "--format", "json", *args)
    return r.exit_code, json.loads(r.stdout) if r.stdout.strip().startswith("{") else r.output


def test_diff_fail_if_step_time_rise_and_mfu_drop(tmp_path):
    before = noisy_trace(tmp_path / "before.json.gz", WINDOWS)
    slower = noisy_trace(tmp_path / "after.json.gz", [w * 1.10 for w in WINDOWS])  # 10% slower every step
    code, d = diff_json(before, slower, "--fail-if", "step-time-rise>5%")
    assert code == 1, d
    g = d["gate"]
    assert g["result"] == "fail" and g["rules"][0]["status"] == "fail"
    assert g["rules"][0]["change"] == pytest.approx(200.0, rel=1e-3)  # µs, the medians' difference
    assert diff_json(before, slower, "--fail-if", "step-time-rise>15%")[0] == 0
    assert diff_json(before, slower, "--fail-if", "step-time-rise>150us")[0] == 1
    assert diff_json(before, slower, "--fail-if", "step-time-rise>1ms")[0] == 0
    # MFU fell from 0.556 to 0.505: 9% relative, 5 pp absolute
    assert diff_json(before, slower, "--fail-if", "mfu-drop>2%")[0] == 1
    assert diff_json(before, slower, "--fail-if", "mfu-drop>10%")[0] == 0
    assert diff_json(before, slower, "--fail-if", "mfu-drop>6pp")[0] == 0
    assert diff_json(before, slower, "--fail-if", "mfu-drop>0.04")[0] == 1


def test_diff_fail_if_within_the_tolerance_passes(tmp_path):
    before = noisy_trace(tmp_path / "before.json.gz", WINDOWS)
    noisy = noisy_trace(tmp_path / "after.json.gz", [w * 1.005 for w in WINDOWS])  # MFU 0.3 pp lower: noise
    assert diff_json(before, noisy, "--fail-if", "mfu-drop>0")[0] == 0
    assert diff_json(before, noisy, "--fail-if", "mfu-drop>0", "--tolerance", 0)[0] == 1


def test_diff_fail_if_loss_rise_and_unknowns_on_the_cpu_fixtures():
    a, b = CPU / "ns_ckpt_nonreentrant.json.gz", CPU / "ns_ckpt_reentrant.json.gz"
    code, d = diff_json(a, b, "--fail-if", "loss-rise:idle>0.03", "--peak-tflops", 0.2)
    assert code == 0, d
    assert d["gate"]["rules"][0]["change"] < 0  # idle fell
    code, d = diff_json(a, b, "--fail-if", "mfu-drop>2%")  # no peak: unknown
    assert code == 5 and d["gate"]["rules"][0]["cause"] == "value"
    assert diff_json(a, b, "--fail-if", "mfu-drop>2%", "--allow-unknown")[0] == 0


def test_diff_without_fail_if_keeps_exit_0_and_no_gate(tmp_path):
    before = noisy_trace(tmp_path / "before.json.gz", WINDOWS)
    code, d = diff_json(before, before)
    assert code == 0 and "gate" not in d


def test_diff_gate_on_the_terminal_and_with_an_output_file(tmp_path):
    before = noisy_trace(tmp_path / "before.json.gz", WINDOWS)
    after = noisy_trace(tmp_path / "after.json.gz", [w * 1.10 for w in WINDOWS])
    r = run("diff", before, after, "--no-cache", "--fail-if", "step-time-rise>5%")
    assert r.exit_code == 1 and "FAIL" in r.stdout and "gate failed" in r.stdout
    r = run("diff", before, after, "--no-cache", "--format", "html", "-o", tmp_path / "d.html", "--fail-if", "step-time-rise>5%")
    assert r.exit_code == 1 and "gate failed" in r.stderr


@pytest.mark.parametrize("rule", ["mfu-dorp>2%", "step-time-rise>5", "loss-rise:nonsense>0.1", "mfu-drop>2ms", "mfu-drop<2%", "mfu-drop>-1%"])
def test_diff_a_bad_fail_if_rule_is_exit_2(tmp_path, rule):
    before = noisy_trace(tmp_path / "before.json.gz", WINDOWS)
    r = run("diff", before, before, "--no-cache", "--fail-if", rule)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: --fail-if '{rule}'"), r.output


def test_the_command_line_defaults_are_the_gates():
    from traceflops.cli import check as cli_check
    from traceflops.views import gate

    assert (cli_check.DEFAULT_TOLERANCE, cli_check.DEFAULT_MIN_STEPS) == (gate.DEFAULT_TOLERANCE, gate.DEFAULT_MIN_STEPS)
