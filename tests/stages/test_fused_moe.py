"""A fused MoE op is counted from the expert weights and top-k its own ops show (its arguments hold neither)."""

from __future__ import annotations

import polars as pl

from tests.builders import BF16, Builder, shapes
from traceflops.flops import aten
from traceflops.run.load import analyze

T, H, E, TOPK = 96, 40, 8, 2  # tokens, hidden, experts, top-k: small, non-square
I = 24  # each expert's intermediate size (gated: the up projection writes 2·I)
U8 = "unsigned char"


def _moe_trace(tmp_path, up=(E, H, 2 * I), down=(E, I, H), topk_args=("", str(TOPK), "True", "1", "True")):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("vllm::moe_forward", 10, 400, **shapes([[T, H], [T, E], [], []], [BF16, BF16, "", ""]))
    b.op("TopK", 20, 30, **shapes([[T, E], [], [], [], []], [BF16, "Scalar", "Scalar", "Scalar", "Scalar"]),
         **{"Concrete Inputs": list(topk_args)})
    b.kernel("_topk_forward", 25, 500, 5)
    b.op("aten::view", 60, 5, **shapes([list(up), []], [BF16, "ScalarList"]))
    b.kernel("_matmul_ogs_NNT_bf16xbf16xbf16_128x128x64x1_swiglu", 70, 510, 50)
    b.op("aten::view", 130, 5, **shapes([list(down), []], [BF16, "ScalarList"]))
    b.kernel("_matmul_ogs_NNT_bf16xbf16xbf16_128x128x64x1", 140, 570, 30)
    return analyze(b.write(tmp_path / "moe.json.gz"))


def test_fused_moe_counted_from_the_weights_its_ops_show(tmp_path):
    a = _moe_trace(tmp_path)
    moe = a.ops.filter(pl.col("name") == "vllm::moe_forward")
    assert moe["flops"].to_list() == [2 * T * TOPK * (H * 2 * I + I * H)]  # up [H -> 2I], down [I -> H]
    mm = a.kernels.filter(pl.col("cls") == "matmul")
    assert mm["name"].str.starts_with("_matmul_ogs").all() and mm.height == 2  # the top-k kernel is routing, not matmul
    assert mm["flops"].to_list() == [2 * T * TOPK * (H * 2 * I + I * H) * d / 80 for d in (50, 30)]  # by duration
    assert a.totals["flops_coverage"] == 1.0


def test_weights_of_another_shape_or_no_topk_are_not_guessed(tmp_path):
    # a down projection that does not take the up projection's output: unknown, with the reason
    a = _moe_trace(tmp_path, down=(E, 3 * I, H))
    (reason,) = a.ops.filter(pl.col("name") == "vllm::moe_forward")["flops_reason"].to_list()
    assert "does not take the up projection" in reason
    assert a.totals["flops_lower_bound"]
    # no top-k recorded
    b = _moe_trace(tmp_path, topk_args=("", "", "", "", ""))
    assert b.ops.filter(pl.col("name") == "vllm::moe_forward")["flops"].to_list() == [None]


def test_packed_fp4_experts_double_their_contiguous_side():
    """MXFP4 experts store two 4-bit values per byte along K (the contiguous side, stride 1)."""
    ws = [[[E, H // 2, 2 * I], U8, [H // 2 * 2 * I, 1, H // 2]], [[E, I // 2, H], U8, [I // 2 * H, 1, I // 2]]]
    r = aten.op_flops("vllm::moe_forward", [[T, H], [T, E], [], []], [BF16, BF16, "", ""], None,
                      context={"moe": {"topk": TOPK, "weights": ws}})
    assert r.flops == 2 * T * TOPK * (H * 2 * I + I * H)
    # the same bytes read as unpacked would not fit the hidden size: unknown, not a guess
    ws_u = [[[E, H // 2, 2 * I], BF16, None], ws[1]]
    r = aten.op_flops("vllm::moe_forward", [[T, H], [T, E], [], []], [BF16, BF16, "", ""], None,
                      context={"moe": {"topk": TOPK, "weights": ws_u}})
    assert r.flops is None and "hidden size" in r.reason
