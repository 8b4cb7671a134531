"""Advice on synthetic traces with known answers, and on the shared real traces."""

from __future__ import annotations

import pytest

from tests.builders import BF16, CPU, Builder, gemm_trace_file
from traceflops.core import hardware as hw
from traceflops.run.load import analyze
from traceflops.views.advice import advise


def kinds(items):
    return [it["kind"] for it in items]


def everything(items):
    """The items and the rule items folded into the loss-budget entries."""
    return [x for it in items for x in (it, *it.get("findings", []))]


def item(items, kind):
    got = [it for it in everything(items) if it["kind"] == kind]
    assert len(got) == 1, kinds(everything(items))
    return got[0]


def entry_of(items, kind):
    """The top-level item that holds `kind` (itself, or the budget entry it is folded into)."""
    got = [it for it in items if kind in kinds(everything([it]))]
    assert len(got) == 1, kinds(items)
    return got[0]


def assert_ranked(items):
    rec = [it["recoverable"] for it in items]
    assert rec == sorted(rec, reverse=True)
    for it in items:
        assert set(it) >= {"title", "recoverable", "evidence", "remedies"}
        assert it["evidence"] and it["remedies"]
        assert 0.01 <= it["recoverable"] <= 1.0


def two_kernels(tmp_path, second_launch, second_start, host=None):
    """One step: kernel A on [100, 200), kernel B on [second_start, second_start + 300).

    `host(b)` adds host events. No shapes: nothing is counted or priced.
    """
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::add", 10, 20)
    b.kernel("void at::native::elementwise_kernel<add>", 12, 100, 100)
    if host:
        host(b)
    b.op("aten::mul", second_launch - 2, 20)
    b.kernel("void at::native::elementwise_kernel<mul>", second_launch, second_start, 300)
    return analyze(b.write(tmp_path / "t.json.gz"))


def test_host_bound_gap_recovers_its_share(tmp_path):
    # B is launched at 700, after the device went idle at 200: a 500 µs host-bound gap in a 900 µs window
    a = two_kernels(tmp_path, 700, 700)
    assert a.idle_gaps["reason"].to_list() == ["host_bound"]
    items = advise(a)
    it = item(items, "host_bound")
    assert it["recoverable"] == pytest.approx(500 / 900, abs=1e-9)
    assert it["recoverable_us"] == pytest.approx(500, abs=1e-6)
    # the idle term (the same 500 µs) heads the list, the host-bound item folded into it
    assert kinds(items)[0] == "idle" and entry_of(items, "host_bound") is items[0]
    assert items[0]["recoverable"] == a.totals["loss_budget"]["idle"]
    assert any("CUDA/HIP graph" in r for r in it["remedies"] + items[0]["remedies"])
    assert_ranked(items)


def test_no_gap_no_host_bound_item(tmp_path):
    a = two_kernels(tmp_path, 30, 200)  # B queued and back to back with A
    assert a.idle_gaps.height == 0
    assert not {"host_bound", "idle"} & set(kinds(everything(advise(a))))


def test_a_gap_below_one_percent_is_not_advice(tmp_path):
    a = two_kernels(tmp_path, 201, 202)  # 2 µs of 402
    assert a.idle_gaps["dur"].sum() == pytest.approx(2)
    # the idle term (0.5%) gets no entry; the two kernels (400 of 402 µs) are the non-matmul entry
    assert kinds(everything(advise(a))) == ["non_matmul"]
    assert kinds(advise(a, min_share=0.001)) == ["non_matmul", "host_bound"]


def test_data_loader_gap(tmp_path):
    def loader(b):
        b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 150, 500)

    a = two_kernels(tmp_path, 660, 700, loader)
    assert a.idle_gaps["reason"].to_list() == ["input_pipeline"]
    items = advise(a)
    assert kinds(items) == ["idle", "non_matmul"]  # 500 µs waiting, 400 µs of two elementwise kernels
    assert [f["kind"] for f in items[0]["findings"]] == ["input_pipeline"]
    it = items[0]["findings"][0]
    assert it["recoverable"] == pytest.approx(500 / 900, abs=1e-9)
    assert it["data"]["single_process"]
    assert any("num_workers" in r for r in it["remedies"])
    assert any("SingleProcess" in e for e in it["evidence"])


def test_synchronisation_gap_names_its_caller(tmp_path):
    def item_call(b):
        b.op("aten::item", 190, 420)
        b.op("aten::_local_scalar_dense", 191, 418)
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": b.pid,
                         "tid": b.main_tid, "ts": 195, "dur": 400, "args": {}})

    a = two_kernels(tmp_path, 660, 700, item_call)
    assert a.idle_gaps["reason"].to_list() == ["sync"]
    it = item(advise(a), "sync")
    assert it["recoverable"] == pytest.approx(500 / 900, abs=1e-9)
    assert it["data"]["callers"] == ["aten::_local_scalar_dense"]
    assert ".item()" in it["remedies"][0]


def square_gemm(path, dtype, kernel, dur, n=2048):
    """One step, one n×n·n×n mm of `dtype` operands and its kernel of `dur` µs, analysed."""
    return analyze(gemm_trace_file(path, n, n, n, dur, dtype, kernel, step_us=3000))


def test_fp32_gemm_on_h100(tmp_path):
    a = square_gemm(tmp_path / "fp32.json.gz", "float", "ampere_sgemm_128x64_nn", 1000)
    assert a.hardware["name"] == "NVIDIA H100 SXM5 80GB" and a.hardware["precision"] == "fp32"
    items = advise(a)
    it = item(items, "fp32_matmul")
    h = hw.lookup("h100-sxm")
    # the 1000 µs fp32 GEMM is the whole window; at the TF32 peak it would take fp32/tf32 of it
    assert it["recoverable"] == pytest.approx(1 - h.peak("fp32") / h.peak("tf32"), rel=1e-9)
    assert it["data"]["target"] == "TF32"
    assert any("set_float32_matmul_precision" in r for r in it["remedies"])
    assert any("autocast" in r for r in it["remedies"])
    # the same GEMM in bf16 raises nothing of the kind
    bf16 = square_gemm(tmp_path / "bf16.json.gz", BF16, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 100)
    assert "fp32_matmul" not in kinds(everything(advise(bf16)))


def test_tf32_kernels_are_not_fp32_advice(tmp_path):
    tf32 = square_gemm(tmp_path / "tf32.json.gz", "float", "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", 500)
    assert "fp32_matmul" not in kinds(everything(advise(tf32)))


def attention(b, fused=False):
    """One attention: scores [2, 4, 128, 128]; kernels: QK^T 50, scale 100, softmax 200, PV 50 µs."""
    q, kt, v = [2, 4, 128, 64], [2, 4, 64, 128], [2, 4, 128, 64]
    b.annotation("ProfilerStep#1", 0, 2000)
    if fused:
        b.op("aten::scaled_dot_product_attention", 100, 100, **{"Input Dims": [q, v, v], "Input type": [BF16] * 3})
        b.op("aten::_scaled_dot_product_flash_attention", 105, 90, **{"Input Dims": [q, v, v], "Input type": [BF16] * 3})
        b.kernel("void pytorch_flash::flash_fwd_kernel", 110, 300, 120)
        return
    b.op("aten::matmul", 100, 30, **{"Input Dims": [q, kt], "Input type": [BF16, BF16]})
    b.op("aten::bmm", 105, 20, **{"Input Dims": [[8, 128, 64], [8, 64, 128]], "Input type": [BF16, BF16]})
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 110, 300, 50)
    b.op("aten::div", 140, 10)
    b.kernel("void at::native::elementwise_kernel<div>", 142, 350, 100)
    b.op("aten::softmax", 160, 20, **{"Input Dims": [[2, 4, 128, 128], [], []], "Input type": [BF16, "Scalar", "Scalar"]})
    b.op("aten::_softmax", 162, 15, **{"Input Dims": [[2, 4, 128, 128], [], []], "Input type": [BF16, "Scalar", "Scalar"]})
    b.kernel("void at::native::softmax_warp_forward", 165, 450, 200)
    b.op("aten::matmul", 190, 30, **{"Input Dims": [[2, 4, 128, 128], v], "Input type": [BF16, BF16]})
    b.op("aten::bmm", 195, 20, **{"Input Dims": [[8, 128, 128], [8, 128, 64]], "Input type": [BF16, BF16]})
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 200, 650, 50)


def test_manual_attention_gets_the_sdpa_advice(tmp_path):
    b = Builder()
    attention(b)
    a = analyze(b.write(tmp_path / "manual.json.gz"))
    items = advise(a)
    it = item(items, "attention")
    # scale and softmax (300 µs) of a 400 µs window; the two matmuls (100 µs) stay
    assert it["recoverable"] == pytest.approx(300 / 400, abs=1e-9)
    assert it["data"]["blocks"] == 1 and it["data"]["matmul_us"] == pytest.approx(100)
    assert it["data"]["score_shapes"] == [[2, 4, 128, 128]]
    assert any("scaled_dot_product_attention" in r for r in it["remedies"])
    assert_ranked(items)


def test_fused_attention_gets_no_sdpa_advice(tmp_path):
    b = Builder()
    attention(b, fused=True)
    assert "attention" not in kinds(everything(advise(analyze(b.write(tmp_path / "fused.json.gz")))))


def test_softmax_outside_attention_is_not_attention(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::softmax", 160, 20, **{"Input Dims": [[64, 1000], [], []], "Input type": [BF16, "Scalar", "Scalar"]})
    b.kernel("void at::native::softmax_warp_forward", 165, 450, 200)
    assert "attention" not in kinds(everything(advise(analyze(b.write(tmp_path / "cls.json.gz")))))


@pytest.mark.parametrize("model", ["ns", "sq"])
def test_cpu_traces_manual_attention_versus_sdpa(model):
    manual = item(advise(analyze(str(CPU / f"{model}_eager_manual.json.gz"))), "attention")
    assert manual["data"]["blocks"] == 24 and manual["data"]["fused_sdpa_ops"] == 0
    assert manual["data"]["softmax_backward_us"] > 0
    assert any("aten::masked_fill" in e for e in manual["evidence"])
    assert "attention" not in kinds(everything(advise(analyze(str(CPU / f"{model}_eager_sdpa.json.gz")))))


def test_exposed_communication(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::mm", 10, 20, **{"Input Dims": [[256, 256], [256, 256]], "Input type": [BF16, BF16]})
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 12, 100, 100)
    b.op("record_param_comms", 40, 10)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 42, 150, 250, stream=20)
    a = analyze(b.write(tmp_path / "comm.json.gz"))
    it = item(advise(a), "communication")
    # 300 µs window [100, 400): the all-reduce overlaps the GEMM for 50 µs and runs alone for 200
    assert it["recoverable"] == pytest.approx(200 / 300, abs=1e-9)
    assert it["data"]["overlapped_us"] == pytest.approx(50)


def test_excluded_steps_are_left_out(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::add", 10, 20)
    b.kernel("k1", 12, 100, 100)
    b.op("aten::add", 690, 20)
    b.kernel("k2", 700, 700, 300)  # 500 µs host-bound gap in step 1
    b.annotation("ProfilerStep#2", 1000, 1000)
    b.op("aten::add", 1010, 20)
    b.kernel("k3", 1012, 1020, 100)
    a = analyze(b.write(tmp_path / "two.json.gz"))
    assert "host_bound" in kinds(everything(advise(a)))
    assert not {"host_bound", "idle"} & set(kinds(everything(advise(a, exclude_steps=(1,)))))


# ---------------------------------------------------------------- shared real traces


def test_mi300_checkpointed_resnet_advice(shared):
    a = analyze(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"))
    items = advise(a)
    assert_ranked(items)
    assert kinds(items)[0] == "communication"
    comm = items[0]
    assert comm["recoverable"] == pytest.approx(a.totals["loss_budget"]["communication_exposed"], rel=1e-9)
    assert any("bucket_cap_mb" in r for r in comm["remedies"])
    # recompute's headline is the budget's FLOP term (0.1%: below 1%, no item); its 7.3% of kernel time is
    # below-peak matmul and non-matmul time, shown by phase in those entries
    rec = next(it for it in advise(a, min_share=0.0) if it["kind"] == "recompute")
    assert rec["recoverable"] == a.totals["loss_budget"]["recompute"]
    assert rec["data"]["time_share"] == pytest.approx(a.totals["overlay_us"]["recompute"] / a.totals["wall_us"], rel=1e-9)
    assert rec["data"]["flops"] > 0
    assert "recompute" not in kinds(everything(items))
    assert any("recompute" in e for k in ("non_matmul", "matmul_below_peak") for e in item(items, k)["evidence"])
    assert "host_bound" not in kinds(everything(items))  # 0.5% of launch bubbles: below the threshold


def test_qwen_inference_advice(shared):
    a = analyze(str(shared / "kineto" / "h100_qwen_inference.json.gz"))
    items = advise(a)
    assert_ranked(items)
    assert kinds(items) == ["non_matmul", "matmul_below_peak", "idle"]
    assert entry_of(items, "memory_bound")["kind"] == "non_matmul" and entry_of(items, "host_bound")["kind"] == "idle"
    hb = item(items, "host_bound")
    by = a.totals["idle_us_by_reason"]
    assert hb["recoverable_us"] == pytest.approx(by["host_bound"] + by["launch_gap"], rel=1e-9)
    # flash attention ran: no SDPA advice; bf16 GEMMs: no fp32 advice; inference: no recompute
    assert not {"attention", "fp32_matmul", "recompute", "communication"} & set(kinds(everything(items)))
