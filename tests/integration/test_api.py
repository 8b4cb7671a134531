"""Notebook API: the same numbers as the command line, and its helpers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import CPU, DATA, RANKS, rank_traces
from traceflops import api
from traceflops.cli.main import main
from traceflops.report.jsonreport import render

GPT2 = DATA / "configs" / "gpt2.json"
FLAGS = {"params": 136320, "layers": 2, "heads": 4, "head_dim": 20, "seq_len": 24}


def cli_json(*args):
    r = CliRunner().invoke(main, ["analyze", *[str(a) for a in args], "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def same_numbers(mine: dict, cli: dict):
    for k in ("hardware", "model", "totals", "steps", "warnings", "outside_steps"):
        assert mine[k] == cli[k], k


def test_analyze_with_flags_equals_the_cli():
    trace = CPU / "ns_eager_manual.json.gz"
    a = api.analyze(trace, peak_tflops=0.5, tokens_per_step=96, **FLAGS)
    cli = cli_json(trace, "--peak-tflops", 0.5, "--tokens-per-step", 96, *[x for k, v in FLAGS.items() for x in (f"--{k.replace('_', '-')}", v)])
    same_numbers(json.loads(render(a)), cli)
    assert a.model["source"] == "flags" and a.totals["mfu"] == cli["totals"]["mfu"]


def test_analyze_with_a_config_path_or_dict_equals_the_cli():
    trace = CPU / "ns_ckpt_nonreentrant.json.gz"
    a = api.analyze(trace, model_config=GPT2, seq_len=24, tokens_per_step=1024, peak_tflops=1, exclude_steps=(1,))
    b = api.analyze(trace, model_config=json.loads(GPT2.read_text()), seq_len=24, tokens_per_step=1024, peak_tflops=1, exclude_steps=(1,))
    cli = cli_json(trace, "--model-config", GPT2, "--seq-len", 24, "--tokens-per-step", 1024, "--peak-tflops", 1, "--exclude-step", 1)
    same_numbers(json.loads(render(a)), cli)
    same_numbers(json.loads(render(b)), cli)


def test_analyze_without_options_equals_the_cli():
    trace = CPU / "sq_sac.json.gz"
    same_numbers(json.loads(render(api.analyze(str(trace), mode="training", precision="fp32"))),
                 cli_json(trace, "--mode", "training", "--precision", "fp32"))


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="all of params"):
        api.analyze(CPU / "sq_sac.json.gz", params=1e6)
    with pytest.raises(ValueError, match="mode"):
        api.analyze(CPU / "sq_sac.json.gz", mode="train")


def test_to_html_and_tables():
    a = api.analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1)
    assert api.to_html(a).startswith("<!DOCTYPE html>")
    frames = api.to_polars(a)
    assert frames["steps"].height == a.steps.height
    assert api.to_dict(a)["schema"] == "traceflops.report/1"


def test_save_html(tmp_path):
    a = api.analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1)
    p = api.save_html(a, tmp_path / "r.html")
    assert Path(p).read_text().startswith("<!DOCTYPE html>")


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch):
    a = api.analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas -> ImportError
    with pytest.raises(ImportError, match="pip install pandas"):
        api.to_pandas(a)


def test_to_pandas():
    pytest.importorskip("pandas")
    a = api.analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1)
    frames = api.to_pandas(a)
    assert len(frames["ops"]) == a.ops.height
    assert list(frames["steps"].columns) == a.steps.columns
    assert frames["steps"]["loss_budget"].iloc[0] == a.steps["loss_budget"][0]


def test_analyze_job(tmp_path):
    job = api.analyze_job(rank_traces(tmp_path))
    assert job.totals["world_size"] == RANKS.WORLD and job.ranks.height == RANKS.WORLD
    assert "job of" in api.to_html(job)
