"""Before/after: zero deltas for a trace against itself, recompute rising when checkpointing is turned on."""

from __future__ import annotations

import io
import json

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.builders import BF16, CPU, Builder
from traceflops.core.results import ModelOptions
from traceflops.report.diff import render_diff_html, render_json, render_terminal
from traceflops.run.load import analyze
from traceflops.views.diff import diff

PEAK = ModelOptions(peak_tflops=1)


def gemm_trace(tmp_path, name, gemm_us, add_us):
    """Two steps: a GEMM and an elementwise add, with given kernel durations."""
    b = Builder()
    for i in range(2):
        t = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 900)
        b.annotation("block", t + 5, 300)
        b.op("aten::mm", t + 10, 30, **{"Input Dims": [[256, 128], [128, 64]], "Input type": [BF16, BF16]})
        b.kernel("sm90_gemm", t + 12, t + 100, gemm_us)
        b.op("aten::add", t + 50, 20, **{"Input Dims": [[256, 64], [256, 64], []], "Input type": [BF16, BF16, "Scalar"]})
        b.kernel("add_kernel", t + 52, t + 100 + gemm_us, add_us)
    return b.write(tmp_path / name)


def test_same_trace_twice_has_zero_deltas():
    p = str(CPU / "ns_ckpt_nonreentrant.json.gz")
    d = diff(analyze(p, PEAK), analyze(p, PEAK))
    for v in d["headline"].values():
        assert v["delta"] in (0, 0.0, None)
    assert all(v["delta"] == 0 for v in d["flops_per_step"].values())
    assert all(r["delta"] == 0 for r in d["loss_budget"])
    assert all(v["delta"] == 0 for v in d["time_us_per_step"].values())
    assert d["warnings"] == []


def test_same_gpu_trace_twice_has_zero_kernel_and_module_deltas(tmp_path):
    p = gemm_trace(tmp_path, "a.json.gz", 40, 10)
    d = diff(analyze(p), analyze(p))
    assert d["kernels"] and all(r["delta_per_step"] == 0 for r in d["kernels"])
    assert d["modules"] and all(r["delta_per_step"] == 0 for r in d["modules"])
    assert all(r["delta"] == 0 for r in d["loss_budget"])


def test_checkpointing_raises_recompute():
    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"), PEAK)
    b = analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), PEAK)
    d = diff(a, b)
    rec = d["flops_per_step"]["recompute"]
    assert rec["after"] > rec["before"] and rec["delta"] > 0
    term = {r["term"]: r for r in d["loss_budget"]}
    assert term["recompute"]["delta"] > 0
    assert term["recompute"]["before"] == a.totals["loss_budget"]["recompute"]
    assert term["recompute"]["after"] == b.totals["loss_budget"]["recompute"]
    deltas = [abs(r["delta"]) for r in d["loss_budget"] if r["delta"] is not None]
    assert deltas == sorted(deltas, reverse=True)
    assert d["headline"]["mfu"]["delta"] == pytest.approx(b.totals["mfu"] - a.totals["mfu"])


def test_kernels_that_moved_most_come_first(tmp_path):
    a = analyze(gemm_trace(tmp_path, "before.json.gz", 40, 10))
    b = analyze(gemm_trace(tmp_path, "after.json.gz", 25, 12))
    d = diff(a, b)
    k = d["kernels"]
    assert [r["name"] for r in k] == ["sm90_gemm", "add_kernel"]
    assert k[0]["delta_per_step"] == pytest.approx(-15.0) and k[1]["delta_per_step"] == pytest.approx(2.0)
    assert d["modules"][0]["module"] == "block" and d["modules"][0]["delta_per_step"] == pytest.approx(-13.0)


def test_renderers(tmp_path):
    a = analyze(gemm_trace(tmp_path, "before.json.gz", 40, 10))
    b = analyze(gemm_trace(tmp_path, "after.json.gz", 25, 12))
    d = diff(a, b)
    assert json.loads(render_json(d))["schema"] == "traceflops.diff/1"
    html = render_diff_html(d)
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "sm90_gemm" in html
    buf = io.StringIO()
    render_terminal(d, Console(file=buf, width=160))
    out = buf.getvalue()
    assert "sm90_gemm" in out and "Loss budget" in out


def test_cli_diff(tmp_path):
    from traceflops.cli.reports import diff_cmd

    group = click.Group(commands={"diff": diff_cmd})
    a = str(CPU / "ns_eager_sdpa.json.gz")
    b = str(CPU / "ns_ckpt_nonreentrant.json.gz")
    r = CliRunner().invoke(group, ["diff", a, b, "--format", "json", "--peak-tflops", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["flops_per_step"]["recompute"]["delta"] > 0
    out = tmp_path / "d.html"
    r = CliRunner().invoke(group, ["diff", a, b, "--format", "html", "-o", str(out), "--peak-tflops", "1"])
    assert r.exit_code == 0 and out.read_text().startswith("<!DOCTYPE html>")
    r = CliRunner().invoke(group, ["diff", a, str(tmp_path / "nope.json.gz")])
    assert r.exit_code == 2 and "no such file" in r.output


# The small GPT of fixtures/cpu (README's JSON example): its embedding gives tokens per step.
GPT = {"params": 136320, "layers": 2, "heads": 4, "head_dim": 20, "seq_len": 24}


def gpt(name):
    from traceflops.api import analyze as api_analyze

    return api_analyze(str(CPU / name), peak_tflops=1, **GPT)


def test_largest_change_of_plain_vs_checkpointed_is_recompute_per_token():
    a, b = gpt("ns_eager_sdpa.json.gz"), gpt("ns_ckpt_nonreentrant.json.gz")
    ta, tb = a.model["tokens_per_step"], b.model["tokens_per_step"]
    assert ta and tb and ta != tb  # different micro-batch counts: per-step FLOPs differ in every phase
    d = diff(a, b)
    assert all(d["flops_per_step"][p]["delta"] != 0 for p in ("forward", "backward", "recompute"))
    per_token = d["flops_per_token"]
    for p, v in per_token.items():
        assert v["before"] == pytest.approx(d["flops_per_step"][p]["before"] / ta)
        assert v["after"] == pytest.approx(d["flops_per_step"][p]["after"] / tb)
    # same model, same tokens: forward and backward FLOPs per token do not move; recompute does
    assert per_token["forward"]["delta"] == pytest.approx(0, abs=1e-6 * per_token["forward"]["before"])
    assert per_token["backward"]["delta"] == pytest.approx(0, abs=1e-6 * per_token["backward"]["before"])
    lc = d["largest_change"]
    assert (lc["phase"], lc["basis"]) == ("recompute", "flops_per_token")
    assert lc["delta"] == per_token["recompute"]["delta"] > 0
    assert json.loads(render_json(d))["largest_change"]["phase"] == "recompute"
    assert "Largest change: recompute FLOPs per token" in render_diff_html(d)
    buf = io.StringIO()
    render_terminal(d, Console(file=buf, width=160))
    assert "Largest change: recompute FLOPs per token" in buf.getvalue()


def test_largest_change_falls_back_to_per_step_without_tokens():
    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"), PEAK)
    d = diff(a, a)
    assert d["flops_per_token"] is None and d["largest_change"] is None  # nothing moved
    b = analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), PEAK)
    d = diff(a, b)
    assert d["flops_per_token"] is None and d["largest_change"]["basis"] == "flops_per_step"
    deltas = {p: abs(d["flops_per_step"][p]["delta"]) for p in ("forward", "backward", "recompute", "optimizer", "other")}
    assert d["largest_change"]["phase"] == max(deltas, key=deltas.get)
    d = diff(a, gpt("ns_ckpt_nonreentrant.json.gz"))
    assert d["largest_change"]["basis"] == "flops_per_step" and any("per token" in w for w in d["warnings"])


def test_cli_diff_names_recompute(tmp_path):
    from traceflops.cli.reports import diff_cmd

    group = click.Group(commands={"diff": diff_cmd})
    model = ["--params", "136320", "--layers", "2", "--heads", "4", "--head-dim", "20", "--seq-len", "24", "--peak-tflops", "1"]
    r = CliRunner().invoke(group, ["diff", str(CPU / "ns_eager_sdpa.json.gz"), str(CPU / "ns_ckpt_nonreentrant.json.gz"), "--format", "json", *model])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["largest_change"]["phase"] == "recompute"
