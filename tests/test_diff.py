"""Before/after: zero deltas for a trace against itself, recompute rising when checkpointing is turned on."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console
from synth import Builder

from traceflops.analysis import ModelOptions, analyze
from traceflops.diff import diff, render_diff_html, render_json, render_terminal

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "cpu"
PEAK = ModelOptions(peak_tflops=1)
BF16 = "c10::BFloat16"


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
    from traceflops.cli_reports import diff_cmd

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
