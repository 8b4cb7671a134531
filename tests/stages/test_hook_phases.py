"""Autograd nodes of any name are backward; matmuls run by gradient hooks (AccumulateGrad) are 'other', never model math."""

from __future__ import annotations

import polars as pl

from tests.builders import EVAL, Builder, shapes
from traceflops.run.load import analyze

M, K, N, R = 48, 80, 24, 3  # non-square; R: a PowerSGD-like rank


def hook_trace(tmp_path) -> str:
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::linear", 100, 60)
    b.op("aten::addmm", 110, 40, **shapes([[N], [M, K], [K, N]]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 120, 210, 30)
    b.op(EVAL + "AddmmBackward0", 300, 100, tid=2)
    b.op("aten::mm", 310, 20, tid=2, **shapes([[M, N], [N, K]]))
    b.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", 315, 400, 20, tid=2)
    # the gradient is ready: AccumulateGrad runs DDP's hook (a low-rank bmm) and its all-reduce
    b.op(EVAL + "torch::autograd::AccumulateGrad", 420, 200, tid=2)
    b.op("aten::bmm", 430, 20, tid=2, **shapes([[1, K, N], [1, N, R]]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_hook", 435, 460, 10, tid=2)
    b.op("nccl:all_reduce", 470, 30, tid=2)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 475, 480, 70, stream=20, tid=2)
    return b.write(tmp_path / "hook.json.gz")


def test_everything_under_an_autograd_node_is_backward_but_hook_matmuls_are_other(tmp_path):
    a = analyze(hook_trace(tmp_path))
    phase = dict(a.kernels.select("name", "phase").iter_rows())
    assert phase["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"] == "backward"
    assert phase["sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_hook"] == "other"
    assert phase["nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN"] == "backward"
    f = a.totals["flops"]
    assert f["forward"] == 2 * M * K * N and f["backward"] == 2 * M * N * K
    assert f["other"] == 2 * K * N * R and f["executed"] == 2 * M * K * N * 2 + 2 * K * N * R
    # trace-derived model FLOPs are forward + backward: the hook is executed (HFU), not model math
    assert int(a.steps["model_flops"][0]) == 4 * M * K * N
    assert any("gradient hook" in w for w in a.warnings), a.warnings


def test_a_bare_hook_node_without_matmuls_adds_no_other_flops(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 500)
    b.op(EVAL + "torch::autograd::AccumulateGrad", 100, 50, tid=2)
    b.op("aten::add_", 110, 10, tid=2)
    b.kernel("void at::native::vectorized_elementwise_kernel<add>", 112, 200, 5, tid=2)
    a = analyze(b.write(tmp_path / "t.json.gz"))
    assert a.kernels["phase"].to_list() == ["backward"]
    assert not any("gradient hook" in w for w in a.warnings)
    assert a.ops.filter(pl.col("name") == "aten::add_")["phase"].to_list() == ["backward"]
