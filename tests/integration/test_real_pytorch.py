"""Real PyTorch traces of other people's code (shared fixtures): DDP all-reduces, device-only capture, a model config.

Expected values are computed here by hand from the traces' own facts (their
README) and the config, never from the analyzer.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import polars as pl
import pytest

from traceflops.run.load import analyze
from traceflops.run.options import model_options

DDP = ["mi300_resnet_act_checkpoint_rank0.json.gz", "a100_ddp_resnet_rank0.json.gz"]


@pytest.mark.parametrize("name", DDP)
def test_every_ddp_allreduce_is_backward(shared, name):
    a = analyze(str(shared / "kineto" / name))
    c = a.collectives.filter((pl.col("kind") == "allreduce") & (pl.col("step") >= 0))
    assert c.height > 0
    phases = a.kernels.filter(pl.col("cls") == "communication").join(c.select("ts", "name"), on=["ts", "name"])["phase"]
    assert set(phases) == {"backward"}, phases.value_counts()
    comm = [x for x in a.advice if x["kind"] == "communication"]
    text = " ".join(e for x in comm for e in x["evidence"])
    assert "allreduce (backward)" in text and "allreduce (forward)" not in text
    mods = a.by_module.filter(pl.col("module").str.contains("all_reduce"))
    assert mods.height and (mods["time_forward"] == 0).all() and (mods["time_backward"] > 0).all()


def device_only(src, dst) -> str:
    """The trace with only what a CUDA-activity-only capture records: device activities and metadata."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    keep = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") in keep or e.get("ph") == "M"]
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(dst)


def test_a_device_only_trace_analyses_and_says_what_is_unknown(shared, tmp_path):
    path = device_only(shared / "kineto" / "a100_ddp_resnet_rank0.json.gz", tmp_path / "dev.json.gz")
    r = subprocess.run([sys.executable, "-m", "traceflops.cli", "analyze", path, "--format", "json", "--no-cache"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    t = d["totals"]
    assert t["hfu"] is None and t["mfu"] is None and t["mfu_no_attention"] is None
    assert t["time_us"]["matmul"] > 0 and t["time_us"]["communication_exposed"] > 0  # GEMM and NCCL kernels by name
    lb = t["loss_budget"]
    # no FLOP is known: the FLOP terms are unknown (as for a trace without shapes), never 0; the time terms still
    # partition the window, the GEMMs' time under matmul_flops_unknown
    assert lb["mfu"] is None and lb["extra_executed"] is None
    assert lb["matmul_below_peak"] == 0 and lb["matmul_flops_unknown"] > 0
    time_terms = ("matmul_below_peak", "matmul_flops_unknown", "non_matmul", "memcpy_exposed", "communication_exposed", "idle")
    assert abs(sum(lb[k] for k in time_terms) - 1) < 1e-9
    assert d["outside_steps"] is None  # the whole trace is the one step
    assert any("device activity only" in w for w in d["warnings"])


QWEN = "h100_qwen_inference.json.gz"


def test_qwen_with_its_config_takes_t_from_the_trace_and_names_the_missing_lm_head(shared):
    cfg = json.loads((shared / "reference" / "h100_qwen_inference.config.json").read_text())
    a = analyze(str(shared / "kineto" / QWEN), model_options(model_config=cfg))
    d, L, H, K, V, f = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                         "vocab_size", "intermediate_size"))
    Q = d // H
    N = L * (d * H * Q + 2 * d * K * Q + H * Q * d) + L * 3 * d * f + V * d  # attention, gated MLP, tied LM head once
    T, tokens = 559, 16 * 559  # the trace's input_ids are [16, 559]
    per_token = 2 * N + 4 * L * H * Q * T  # PaLM, inference (forward only)
    m = a.model
    assert (m["seq_len"], m["seq_len_source"], m["tokens_per_step"]) == (T, "trace", tokens)
    assert m["flops_per_token"] == per_token
    assert m["flops_per_step"] == per_token * tokens
    secs = a.totals["wall_us"] * 1e-6
    assert a.totals["mfu"] == pytest.approx(per_token * tokens / (secs * a.hardware["peak_flops"]), rel=1e-12)
    parts = {p["part"]: p for p in m["by_part"]}
    assert parts["lm_head"]["trace_flops_per_step"] == 0 and parts["lm_head"]["model_flops_per_step"] == 2 * V * d * tokens
    assert parts["mlp"]["trace_flops_per_step"] == 2 * L * 3 * d * f * tokens  # every MLP GEMM ran on every token
    assert any("lm_head" in w and "did not run" in w for w in a.warnings), a.warnings
    assert not any("32768" in n for n in m["notes"])


def test_a_config_context_is_used_only_with_a_warning(shared):
    cfg = json.loads((shared / "reference" / "h100_qwen_inference.config.json").read_text())
    a = analyze(str(shared / "kineto" / "rtx2080ti_linear_train.json.gz"), model_options(model_config=cfg, tokens_per_step=1024))
    assert (a.model["seq_len"], a.model["seq_len_source"]) == (cfg["max_position_embeddings"], "config")
    assert any("config's maximum context" in w and "--seq-len" in w for w in a.warnings), a.warnings


def test_a_given_seq_len_that_disagrees_with_the_trace_is_said(shared):
    cfg = json.loads((shared / "reference" / "h100_qwen_inference.config.json").read_text())
    a = analyze(str(shared / "kineto" / QWEN), model_options(model_config=cfg, seq_len=2048))
    assert (a.model["seq_len"], a.model["seq_len_source"]) == (2048, "flag")
    assert any("2048 as given" in w and "559" in w for w in a.warnings), a.warnings
