"""The advice covers the loss budget: every large term has an entry headed by the term's own number.

On every project and shared trace, each loss-budget term of at least 5% of peak × step time has one entry
whose headline share is that term, exactly; an entry whose cause the trace cannot tell says what to record.
Synthetic traces, built so the right advice is known, check what the entries say.
"""

from __future__ import annotations

import re

import pytest

from tests.builders import (
    CPU,
    FIXTURES,
    Builder,
    gemm_trace_file,
    shapes,
    shared_fixtures,
)
from traceflops.core import hardware as hw
from traceflops.run.load import analyze
from traceflops.run.options import model_options
from traceflops.views.advice import BUDGET_MIN_SHARE

LOSSES = ("non_matmul", "idle", "matmul_below_peak", "communication_exposed", "recompute", "memcpy_exposed",
          "matmul_flops_unknown", "extra_executed")
PYTORCH = re.compile(r"torch|record_shapes|with_stack|ProfilerActivity|CUDA/HIP graph|DataLoader", re.IGNORECASE)

PROJECT = sorted(
    [*FIXTURES.glob("cpu/*.json.gz"), *FIXTURES.glob("hf/*.json.gz"), *FIXTURES.glob("dist/*/*.json.gz"),
     *FIXTURES.glob("jax/*.xplane.pb*")]
)


def _shared() -> list:
    root = shared_fixtures()
    found = sorted([*root.glob("kineto/*.json.gz"), *root.glob("kineto/*/*.json.gz"), *root.glob("xplane/*.xplane.pb")])
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"shared fixtures not found at {root} (set TRACEFLOPS_FIXTURES)"))]
    return found


def _id(p) -> str:
    return "none" if p is None else f"{p.parent.name}/{p.name}"


def entries(items):
    return [it for it in items if "findings" in it]


def kinds(items):
    return [it["kind"] for it in items]


def folded(it):
    return [f["kind"] for f in it.get("findings", [])]


def only(items, term):
    got = [it for it in entries(items) if it["term"] == term]
    assert len(got) == 1, [(it["kind"], it.get("term")) for it in items]
    return got[0]


def check_covers_budget(a, xla: bool) -> None:
    """Every budget term ≥ 5% has exactly one entry headed by its exact value, largest first, and says what to do."""
    budget = a.totals["loss_budget"] or {}  # null: no device time to share out (a capture without device activity)
    items = a.advice
    big = [t for t in LOSSES if budget.get(t) is not None and budget[t] >= BUDGET_MIN_SHARE]
    for t in big:
        it = only(items, t)
        assert it["share"] == budget[t] and it["recoverable"] == budget[t]  # the same number, not a recomputation
        assert it["unit"] and any(it["unit"] in e for e in it["evidence"])  # the unit is said once, in words
        assert it["evidence"] and it["remedies"]
        if not it["cause_known"]:  # an explicit "cannot tell": what to record next time, among the first remedies
            assert it["record"] and set(it["record"]) <= set(it["remedies"][:len(it["record"])])
        for r in it["record"]:
            assert (not PYTORCH.search(r)) if xla else re.search(r"record_shapes|with_stack|ProfilerActivity|--hardware", r), r
    # no entry for a small or unknown term
    assert {it["term"] for it in entries(items)} == set(big)
    shares = [it["recoverable"] for it in items]
    assert shares == sorted(shares, reverse=True)
    # a recompute item is headed by the budget's recompute term whenever the budget has one
    for it in items:
        if it["kind"] == "recompute" and budget.get("recompute") is not None:
            assert it["recoverable"] == budget["recompute"]


@pytest.mark.parametrize("path", PROJECT, ids=_id)
def test_project_fixtures_every_large_term_has_its_entry(path):
    check_covers_budget(analyze(str(path)), xla=".xplane." in path.name)


@pytest.mark.parametrize("path", _shared(), ids=_id)
def test_shared_fixtures_every_large_term_has_its_entry(path):
    check_covers_budget(analyze(str(path)), xla=".xplane." in path.name)


def test_the_readme_example_covers_its_three_losses():
    # `traceflops analyze fixtures/cpu/ns_ckpt_nonreentrant.json.gz --peak-tflops 1`
    a = analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), model_options(peak_tflops=1))
    b = a.totals["loss_budget"]
    big = sorted((t for t in LOSSES if b[t] >= BUDGET_MIN_SHARE), key=lambda t: -b[t])
    assert kinds(a.advice)[:len(big)] == big and set(big) >= {"non_matmul", "idle", "matmul_below_peak"}
    nm = only(a.advice, "non_matmul")
    # a CPU trace: the non-matmul ops are named (aten ops, not the autograd nodes around them), by phase
    assert nm["cause_known"] and nm["data"]["top"] and all(n.startswith("aten::") for n in nm["data"]["top"])
    assert any("recompute" in e for e in nm["evidence"])  # the checkpointed forward's ops are part of it
    idle = only(a.advice, "idle")
    assert not idle["cause_known"] and any("with_stack=True" in r for r in idle["record"])
    mm = only(a.advice, "matmul_below_peak")
    assert any("aten::" in e for e in mm["evidence"])  # the matmul ops that took the time
    # recompute is 0.1% at peak: no item says otherwise
    assert all(it["recoverable"] == b["recompute"] for it in a.advice if it["kind"] == "recompute")


# ---------------------------------------------------------------- synthetic traces, known by construction


ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<add>", "void at::native::vectorized_elementwise_kernel<mul>")


def test_many_tiny_elementwise_kernels_are_the_non_matmul_entry(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    b.op("aten::mm", 10, 20, **shapes([[1024, 1024], [1024, 1024]]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 12, 100, 50)
    n, dur, gap = 60, 4.0, 1.0
    t = 150.0
    for i in range(n):
        b.op("aten::add" if i % 2 == 0 else "aten::mul", 40 + i * 2, 1)
        b.kernel(ELEMENTWISE[i % 2], 41 + i * 2, t, dur)
        t += dur + gap
    a = analyze(b.write(tmp_path / "tiny.json.gz"))
    window = t - gap - 100
    nm = only(a.advice, "non_matmul")
    assert nm["recoverable"] == a.totals["loss_budget"]["non_matmul"]
    assert nm["recoverable"] == pytest.approx(n * dur / window, rel=1e-9)
    assert nm is a.advice[0]  # the largest loss
    # one run of 60 short kernels back to back: one fusion candidate holding all of them
    assert nm["data"]["fusion_runs"] == 1 and nm["data"]["fusion_run_activities"] == n
    assert set(nm["data"]["fusion_names"]) == set(ELEMENTWISE)
    assert set(nm["data"]["top"]) == set(ELEMENTWISE)
    assert any("compile" in r for r in nm["remedies"])


def test_convolution_layout_transposes_point_to_channels_last(tmp_path):
    """cuDNN transposing NCHW activations to NHWC around each convolution: the transposes are most of the non-matmul
    time (30 of 40 µs here), and the entry says so and names the memory format that removes them."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    for i in range(3):
        b.op("aten::cudnn_convolution", 10 + 100 * i, 60)
        b.kernel("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>",
                 11 + 100 * i, 1000 + 200 * i, 10)
        b.kernel("sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw", 12 + 100 * i, 1010 + 200 * i, 50)
    b.op("aten::add", 400, 5)
    b.kernel(ELEMENTWISE[0], 401, 1700, 10)
    a = analyze(b.write(tmp_path / "conv.json.gz"))
    nm = only(a.advice, "non_matmul")
    assert nm["data"]["layout_transpose_us"] == pytest.approx(30.0)
    assert any("3 layout transposes" in e and "30.0 µs" in e for e in nm["evidence"])
    assert "channels_last" in nm["remedies"][0]


def test_a_host_bound_step_is_the_idle_entry_with_reason_host_bound(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::add", 10, 20)
    b.kernel("void at::native::elementwise_kernel<add>", 12, 100, 100)
    b.op("aten::mul", 698, 20)
    b.kernel("void at::native::elementwise_kernel<mul>", 700, 700, 300)  # launched 500 µs after the device went idle
    a = analyze(b.write(tmp_path / "host.json.gz"))
    idle = only(a.advice, "idle")
    assert idle["recoverable"] == a.totals["loss_budget"]["idle"] == pytest.approx(500 / 900, rel=1e-9)
    assert idle["data"]["by_reason_us"]["host_bound"] == pytest.approx(500)
    assert sum(idle["data"]["by_reason_us"].values()) == pytest.approx(500)
    assert folded(idle) == ["host_bound"] and idle["cause_known"]
    assert any("graph" in r or "compile" in r for r in idle["remedies"][:2])


def test_an_unexplained_gap_says_what_to_record(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::add", 10, 20)
    b.kernel("void at::native::elementwise_kernel<add>", 12, 100, 100)
    # the kernel that ends the gap has no launch in the trace: nothing tells why the device waited
    b.events.append({"ph": "X", "cat": "kernel", "name": "void at::native::elementwise_kernel<mul>", "pid": b.device,
                     "tid": 7, "ts": 700, "dur": 300, "args": {"device": b.device, "stream": 7, "correlation": 99999}})
    b.op("aten::add", 40, 20)
    b.kernel("void at::native::elementwise_kernel<add>", 42, 1000, 100)  # queued: the step runs to its end
    a = analyze(b.write(tmp_path / "unknown.json.gz"))
    idle = only(a.advice, "idle")
    assert idle["recoverable"] == a.totals["loss_budget"]["idle"] == pytest.approx(500 / 1000, rel=1e-9)
    assert idle["data"]["by_reason_us"]["unknown"] == pytest.approx(500)
    assert not idle["cause_known"] and any("with_stack=True" in r for r in idle["record"])
    assert idle["remedies"][0] in idle["record"]


def test_a_synchronising_step_is_the_idle_entry_with_reason_sync(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::add", 10, 20)
    b.kernel("void at::native::elementwise_kernel<add>", 12, 100, 100)
    b.op("aten::item", 190, 420)
    b.op("aten::_local_scalar_dense", 191, 418)
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": b.pid,
                     "tid": b.main_tid, "ts": 195, "dur": 400, "args": {}})
    b.op("aten::mul", 658, 20)
    b.kernel("void at::native::elementwise_kernel<mul>", 660, 700, 300)
    a = analyze(b.write(tmp_path / "sync.json.gz"))
    idle = only(a.advice, "idle")
    assert idle["data"]["by_reason_us"]["sync"] == pytest.approx(500)
    assert folded(idle) == ["sync"]
    assert any(".item()" in r for r in idle["remedies"])


def gemm_trace(path, m, n, k, dur, **kw):
    return analyze(gemm_trace_file(path, m, n, k, dur, **kw))


def test_a_slow_gemm_with_a_wave_tail_is_the_matmul_below_peak_entry(tmp_path):
    h = hw.lookup("h100-sxm")
    tiles_m, tiles_n = 7, 19  # 133 output tiles of 128×128 on 132 SMs: a second wave with one tile
    assert tiles_m * tiles_n == h.compute_units + 1
    m, n, k, dur = 128 * tiles_m, 128 * tiles_n, 1024, 100.0
    a = gemm_trace(tmp_path / "wave.json.gz", m, n, k, dur)
    mm = only(a.advice, "matmul_below_peak")
    peak = a.hardware["peak_flops"]
    assert mm["recoverable"] == a.totals["loss_budget"]["matmul_below_peak"]
    assert mm["recoverable"] == pytest.approx(1 - 2 * m * n * k / (peak * dur * 1e-6), rel=1e-9)  # the window is the GEMM
    assert mm["data"]["wave_hint_shapes"] == 1
    assert any(f"{m}×{n}×{k}" in e for e in mm["evidence"])
    assert mm["cause_known"]


def test_an_fp32_gemm_is_folded_into_matmul_below_peak(tmp_path):
    a = gemm_trace(tmp_path / "fp32.json.gz", 2048, 2048, 2048, 1000, dtype="float", kernel="ampere_sgemm_128x64_nn")
    mm = only(a.advice, "matmul_below_peak")
    assert mm["recoverable"] == a.totals["loss_budget"]["matmul_below_peak"]
    assert "fp32_matmul" in folded(mm)
    assert any("set_float32_matmul_precision" in r for r in mm["remedies"])


def test_gemm_time_without_shapes_cannot_be_judged(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    b.op("aten::mm", 10, 30)  # no recorded shapes
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 12, 100, 400)
    b.op("aten::add", 50, 10)
    b.kernel("void at::native::elementwise_kernel<add>", 52, 500, 100)
    a = analyze(b.write(tmp_path / "noshapes.json.gz"))
    it = only(a.advice, "matmul_flops_unknown")
    assert it["recoverable"] == a.totals["loss_budget"]["matmul_flops_unknown"] == pytest.approx(400 / 500, rel=1e-9)
    assert not it["cause_known"] and any("record_shapes=True" in r for r in it["record"])
    assert it["remedies"][0] in it["record"]


def test_exposed_copies_are_the_memcpy_entry(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    b.op("aten::to", 10, 30)
    b.kernel("Memcpy HtoD (Pageable -> Device)", 12, 100, 300, launch="cudaMemcpyAsync", cat="gpu_memcpy", bytes=64 << 20)
    b.op("aten::add", 50, 10)
    b.kernel("void at::native::elementwise_kernel<add>", 52, 400, 100)
    a = analyze(b.write(tmp_path / "copy.json.gz"))
    it = only(a.advice, "memcpy_exposed")
    assert it["recoverable"] == a.totals["loss_budget"]["memcpy_exposed"] == pytest.approx(300 / 400, rel=1e-9)
    assert any("Memcpy HtoD" in e for e in it["evidence"])
    assert any("pin_memory" in r for r in it["remedies"])


def test_xla_entries_speak_jax():
    a = analyze(str(FIXTURES / "jax" / "remat_full.xplane.pb"))
    assert entries(a.advice)
    for it in a.advice:
        assert not [r for r in it["remedies"] + it.get("record", []) if PYTORCH.search(r)]
    nm = only(a.advice, "non_matmul")
    assert any("jit" in r for r in nm["remedies"])


def test_every_loss_term_of_the_budget_has_an_advice_entry():
    from traceflops.metrics.budget import TERMS
    from traceflops.views.advice import ENTRIES

    assert set(ENTRIES) == set(TERMS) - {"mfu", "attention_mask_credit"}  # the only two that are no loss
