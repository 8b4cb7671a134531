"""The GPU capture script (fixtures/capture_gpu.py), run end to end on the CPU.

The script is meant for one prepared run on a GPU machine; this runs the same
flow with tiny dims on the CPU (``--device cpu --tiny --skip-compile``, plus
``--jax`` when jax is importable) and checks what it writes against numbers
computed here by hand from the recorded dimensions. No traceflops import.
"""
import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from tests.builders import FIXTURES

SCRIPT = str(FIXTURES / "capture_gpu.py")
TORCH_RUN = ("eager_sdpa", "ckpt_full", "ckpt_attn")
STEPS = 3  # the script's default --steps
PEAK_CPU = 1e12  # the script's default peak for --device cpu

torch = pytest.importorskip("torch", reason="the capture script needs torch (pip install torch==2.13.0)")


def _has_jax():
    return importlib.util.find_spec("jax") is not None


def _run(out, *extra, timeout=150):
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--skip-compile",
           "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    with open(os.path.join(out, "measurements.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("capture")
    extra = ("--jax",) if _has_jax() else ()
    return out, _run(out, *extra)


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("capture_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mean(xs):
    return sum(xs) / len(xs)


def hand_params(e):
    d, f, V, L = e["d_model"], e["ffn"], e["vocab"], e["layers"]
    # qkv (d x 3d), proj, fc1, fc2 per block, plus the untied LM head
    return L * (3 * d * d + d * d + d * f + f * d) + d * V


def block_forward_flops(e):
    """Forward matmul FLOPs of one block over one step, attention in full (no causal discount)."""
    d, f, H, Q, T, B = e["d_model"], e["ffn"], e["heads"], e["head_dim"], e["seq_len"], e["batch"]
    tok = B * T
    lin = 2 * tok * (d * 3 * d) + 2 * tok * d * d + 2 * tok * d * f + 2 * tok * f * d
    sdpa = 2 * B * H * T * Q * T + 2 * B * H * T * T * Q  # QK^T, then PV
    return lin, sdpa


REQUIRED = ("params_matmul", "layers", "heads", "head_dim", "seq_len", "batch",
            "tokens_per_step", "step_times_ms", "step_times_ms_unprofiled",
            "profiler_overhead", "tokens_per_s", "mfu", "expected_recompute_flops_per_step",
            "device", "torch", "peak_flops", "trace")


def test_every_variant_is_recorded(capture):
    out, m = capture
    assert m["schema"] == "traceflops.capture/1"
    assert m["done"] is True
    v = m["variants"]
    for name in TORCH_RUN:
        e = v[name]
        assert e["status"] == "ok", e.get("traceback") or e
        for k in REQUIRED:
            assert e.get(k) is not None, (name, k)
        assert len(e["step_times_ms"]) == STEPS
        assert len(e["step_times_ms_unprofiled"]) == STEPS
        assert all(t > 0 for t in e["step_times_ms"] + e["step_times_ms_unprofiled"])
        assert e["tokens_per_step"] == e["batch"] * e["seq_len"]
        assert e["head_dim"] * e["heads"] == e["d_model"]
        assert e["torch"] == torch.__version__
        assert e["profiler_overhead"] == pytest.approx(
            mean(e["step_times_ms"]) / mean(e["step_times_ms_unprofiled"]) - 1, rel=1e-9)
        assert all(math.isfinite(x) for x in e["losses"])
    assert v["compiled"]["status"] == "skipped"
    assert v["compiled"]["reason"] == "--skip-compile"
    assert ("jax_remat" in v) == _has_jax()


def test_traces_are_gzip_kineto_with_profiler_steps(capture):
    out, m = capture
    for name in TORCH_RUN:
        e = m["variants"][name]
        path = os.path.join(out, f"{name}.json.gz")
        assert e["trace"]["path"] == f"{name}.json.gz"
        assert os.path.getsize(path) == e["trace"]["bytes"]
        with gzip.open(path, "rt") as f:
            tr = json.load(f)
        assert tr["traceEvents"]
        steps = sorted((ev for ev in tr["traceEvents"] if ev.get("ph") == "X"
                        and str(ev.get("name", "")).startswith("ProfilerStep#")),
                       key=lambda ev: ev["ts"])
        # schedule(wait=1, warmup=1, active=3): steps 2..4 are in the trace
        assert [s["name"] for s in steps] == [f"ProfilerStep#{i}" for i in range(2, 2 + STEPS)]
        assert e["profiler_steps"] == [s["name"] for s in steps]
        assert any(ev.get("args", {}).get("Input Dims") for ev in tr["traceEvents"]
                   if ev.get("cat") == "cpu_op"), "record_shapes=True"
        # on the CPU the step times are perf_counter intervals around the same
        # steps the ProfilerStep spans cover
        for s, t in zip(steps, e["step_times_ms"], strict=True):
            assert s["dur"] / 1000 == pytest.approx(t, rel=0.05, abs=0.5)


def test_mfu_is_the_formula(capture):
    out, m = capture
    assert m["peak_flops"] == PEAK_CPU
    for name in TORCH_RUN:
        e = m["variants"][name]
        N = hand_params(e)
        assert e["params_matmul"] == N
        L, H, Q, T = e["layers"], e["heads"], e["head_dim"], e["seq_len"]
        fpt = 6 * N + 12 * L * H * Q * T
        assert e["model_flops_per_token"] == fpt
        tps = e["tokens_per_step"] / (mean(e["step_times_ms"]) / 1000)
        assert e["tokens_per_s"] == pytest.approx(tps, rel=1e-12)
        assert e["mfu"] == pytest.approx(tps * fpt / PEAK_CPU, rel=1e-12)
        tps_u = e["tokens_per_step"] / (mean(e["step_times_ms_unprofiled"]) / 1000)
        assert e["mfu_unprofiled"] == pytest.approx(tps_u * fpt / PEAK_CPU, rel=1e-12)


def test_expected_recompute_by_hand(capture):
    out, m = capture
    v = m["variants"]
    full = v["ckpt_full"]
    lin, sdpa = block_forward_flops(full)
    L, B, H, T, Q = full["layers"], full["batch"], full["heads"], full["seq_len"], full["head_dim"]
    tok = B * T
    # ckpt_full: the whole forward of every block is run again
    assert full["expected_recompute_flops_per_step"] == L * (lin + sdpa)
    r = full["expected_recompute"]
    assert r["early_stop_skipped_flops_per_step"] == L * 2 * tok * full["ffn"] * full["d_model"]
    score = L * 2 * B * H * T * T * Q
    assert r["sdpa_score_recompute_flops_per_step"] == score
    assert r["executed_recompute_flops_per_step"] == (
        L * (lin + sdpa) - r["early_stop_skipped_flops_per_step"] + score)
    # ckpt_attn: ln1 -> qkv -> sdpa -> proj only
    d = full["d_model"]
    attn = v["ckpt_attn"]
    assert attn["expected_recompute_flops_per_step"] == L * (2 * tok * 4 * d * d + sdpa)
    assert v["eager_sdpa"]["expected_recompute_flops_per_step"] == 0


def test_recompute_equals_flop_counter_on_the_blocks(capture, script):
    """The same number from torch's FlopCounterMode over the script's own blocks."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    out, m = capture
    e = m["variants"]["ckpt_full"]
    cfg = dict(d=e["d_model"], layers=e["layers"], heads=e["heads"], seq_len=e["seq_len"],
               batch=e["batch"], vocab=e["vocab"], ffn_mult=e["ffn"] // e["d_model"])
    model = script.torch_model(cfg, None)
    n = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    assert n == e["params_matmul"]
    x = torch.randn(e["batch"], e["seq_len"], e["d_model"])
    # math SDPA decomposes into two bmm (QK^T, PV): 4*B*H*T*T*Q, the flash convention
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        for blk in model.blocks:
            x = blk(x)
    assert fc.get_total_flops() == e["expected_recompute_flops_per_step"]


def test_jax_variant(capture):
    if not _has_jax():
        pytest.skip("jax is not installed: the optional --jax variant was not run")
    out, m = capture
    e = m["variants"]["jax_remat"]
    assert e["status"] == "ok", e.get("traceback") or e
    path = os.path.join(out, "jax_remat.xplane.pb")
    assert os.path.getsize(path) == e["trace"]["bytes"] > 0
    assert len(e["step_times_ms"]) == STEPS
    assert e["params_matmul"] == hand_params(e)
    lin, sdpa = block_forward_flops(e)
    assert e["expected_recompute_flops_per_step"] == e["layers"] * (lin + sdpa)
    fpt = 6 * hand_params(e) + 12 * e["layers"] * e["heads"] * e["head_dim"] * e["seq_len"]
    tps = e["tokens_per_step"] / (mean(e["step_times_ms"]) / 1000)
    assert e["mfu"] == pytest.approx(tps * fpt / PEAK_CPU, rel=1e-12)


def test_budget_guard_skips_and_records(tmp_path):
    m = _run(tmp_path, "--budget-s", "0", timeout=60)
    v = m["variants"]
    assert set(v) == {"eager_sdpa", "ckpt_full", "ckpt_attn", "compiled"}
    for name, e in v.items():
        assert e["status"] == "skipped", (name, e)
        assert e["reason"].startswith("budget") or e["reason"] == "--skip-compile"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".json.gz")]


def test_a_failing_variant_is_recorded_and_the_run_goes_on(tmp_path, script, monkeypatch):
    def fake(name, cfg, args, ctx, entry):
        if name == "ckpt_full":
            raise RuntimeError("CUDA out of memory (simulated)")
        raise script.Skip("simulated")

    monkeypatch.setattr(script, "run_torch_variant", fake)
    rc = script.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    assert rc == 1
    with open(tmp_path / "measurements.json") as f:
        v = json.load(f)["variants"]
    assert v["ckpt_full"]["status"] == "error"
    assert "simulated" in v["ckpt_full"]["error"]
    assert "RuntimeError" in v["ckpt_full"]["traceback"]
    assert [v[n]["status"] for n in ("eager_sdpa", "ckpt_attn", "compiled")] == ["skipped"] * 3
