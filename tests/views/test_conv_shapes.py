"""Convolutions as implicit GEMMs in the shapes table and the advice; an fp32 run against the tensor-core peak.

Truth: convolution arithmetic by hand (output size (H + 2p - k) / s + 1), ResNet-50's layers (He et al. 2015,
table 1: a 7×7/2 stem of 64 channels on 224², then bottleneck stages whose 3×3 convolutions run at 56², 28², 14², 7²
with 64, 128, 256, 512 channels; 53 convolutions in all, 4 of them the projection shortcuts), and the V100 SXM2
datasheet's peaks (15.7 TFLOP/s fp32, 125 TFLOP/s tensor-core fp16).
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import gemm_trace_file, shared_fixtures
from traceflops.report.terminal import render
from traceflops.run.load import analyze
from traceflops.views.gemm_shapes import conv_dims

RESNET = shared_fixtures() / "kineto" / "v100_resnet50_legacy2021.json.gz"
need_resnet = pytest.mark.skipif(not RESNET.exists(), reason=f"shared fixture not found: {RESNET}")


def _conv_flops(n, h_out, w_out, c_out, c_in, kh, kw):
    return 2 * n * h_out * w_out * c_out * c_in * kh * kw


def test_conv_dims_forward_from_flops():
    # ResNet-50's stem: 32 × 3 × 224², 64 filters of 7×7, stride 2, padding 3 → (224 + 6 - 7) // 2 + 1 = 112
    flops = _conv_flops(32, 112, 112, 64, 3, 7, 7)
    got = conv_dims("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7], [], [], []], flops)
    assert got == (32 * 112 * 112, 64, 3 * 7 * 7, "fwd", 32 * 112 * 112, 64)
    # FLOPs that are no whole number of output positions of this batch: not a convolution of these shapes
    assert conv_dims("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7]], flops + 2 * 64 * 147) is None
    assert conv_dims("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7]], None) is None


def test_conv_dims_backward_passes():
    # a 3×3 convolution of 256 → 256 channels at 14² (stride 1), batch 32
    m, n, k = 32 * 14 * 14, 256, 256 * 9
    f = _conv_flops(32, 14, 14, 256, 256, 3, 3)
    go, x, w = [32, 256, 14, 14], [32, 256, 14, 14], [256, 256, 3, 3]
    # input gradient: its output is the input's positions × input channels
    assert conv_dims("aten::cudnn_convolution_backward_input", [[], go, w], f) == (m, n, k, "dgrad", m, 256)
    # weight gradient: no weight shape recorded; K from the FLOPs; its output is Cout × Cin·kh·kw
    assert conv_dims("aten::cudnn_convolution_backward_weight", [[], go, x], f) == (m, n, k, "wgrad", n, k)
    # convolution_backward with both gradients does the forward's work twice
    assert conv_dims("aten::convolution_backward", [go, x, w, []], 2 * f)[:4] == (m, n, k, "dgrad+wgrad")
    assert conv_dims("aten::convolution_backward", [go, x, w, []], 3 * f) is None
    # a grad_output whose channels are not the weight's output channels does not fit
    assert conv_dims("aten::cudnn_convolution_backward_input", [[], [32, 128, 14, 14], w], f) is None


@pytest.fixture(scope="module")
def resnet():
    if not RESNET.exists():
        pytest.skip(f"shared fixture not found: {RESNET}")
    return analyze(str(RESNET))


@need_resnet
def test_resnet_convolutions_fill_the_shapes_table(resnet):
    g = resnet.by_gemm_shape
    conv = g.filter(pl.col("conv").is_not_null())
    # the convolutions are nearly all of the matmul time (the fc layer's GEMMs are the rest)
    assert float(conv["share"].sum()) > 0.99
    steps = 6
    by_pass = {p: int(c) for p, c in conv.group_by("conv").agg(pl.col("count").sum()).iter_rows()}
    # 53 convolutions per step forward and as weight gradients; the stem needs no input gradient: 52
    assert by_pass == {"fwd": 53 * steps, "wgrad": 53 * steps, "dgrad": 52 * steps}
    stem = conv.filter((pl.col("conv") == "fwd") & (pl.col("M") == 32 * 112 * 112))
    assert stem.select("N", "K", "count").row(0) == (64, 147, steps)
    # layer3's 3×3 convolution (256 channels at 14²), forward
    l3 = conv.filter((pl.col("conv") == "fwd") & (pl.col("M") == 32 * 14 * 14) & (pl.col("N") == 256) & (pl.col("K") == 256 * 9))
    assert l3["count"].sum() == 6 * steps  # six bottleneck blocks in stage 4 (conv4_x)
    # the backward convolutions carry their dtype (their first input is a size list)
    assert set(conv["dtype"].to_list()) == {"fp32"}


@need_resnet
def test_resnet_advice_speaks_of_convolutions(resnet):
    entry = next(it for it in resnet.advice if it["term"] == "matmul_below_peak")
    text = " ".join(entry["evidence"])
    assert "convolution" in entry["title"].lower()
    assert "convolutions take" in text and "implicit GEMM" in text
    remedies = " ".join(entry["remedies"])
    assert "channels_last" in remedies and "cudnn.benchmark" in remedies and "multiples of 8" in remedies
    everything = " ".join(" ".join(it["remedies"]) for it in resnet.advice)
    assert "FFN" not in everything and "RMSNorm" not in everything
    assert entry["data"]["conv_share"] > 0.99


@need_resnet
def test_resnet_fp32_against_the_tensor_core_peak(resnet, capsys):
    by = resnet.totals["mfu_by_precision"]
    assert list(by) == ["fp32", "fp16"]  # Volta: no TF32, no bf16 tensor cores
    assert by["fp32"] == pytest.approx(resnet.totals["mfu"])
    assert by["fp16"] == pytest.approx(resnet.totals["mfu"] * 15.7 / 125)
    entry = next(it for it in resnet.advice if it["term"] == "matmul_below_peak")
    assert "autocast" in entry["remedies"][0]
    assert any("fp16 tensor-core peak" in e for e in entry["evidence"])
    render(resnet)
    out = capsys.readouterr().out
    assert f"fp16 {by['fp16'] * 100:.1f}%" in out and "first lever" in out


def test_fp32_gemm_on_h100_against_tf32_and_bf16(tmp_path):
    # an fp32 GEMM on CUDA cores (a non-TF32 kernel name): MFU against fp32 67 TF, TF32 495 TF and bf16 989 TF (dense)
    path = gemm_trace_file(tmp_path / "f32.json", 4096, 4096, 4096, 3000.0, dtype="float",
                           kernel="sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8", step_us=5000)
    a = analyze(path)
    assert a.hardware["precision"] == "fp32"
    by = a.totals["mfu_by_precision"]
    assert list(by) == ["fp32", "tf32", "bf16"]
    mfu = a.totals["mfu"]
    assert by["tf32"] == pytest.approx(mfu * 66.9 / 494.7)
    assert by["bf16"] == pytest.approx(mfu * 66.9 / 989.4)


def test_bf16_run_has_no_other_peaks(tmp_path):
    a = analyze(gemm_trace_file(tmp_path / "bf16.json", 4096, 4096, 4096, 300.0))
    assert a.hardware["precision"] == "bf16"
    assert a.totals["mfu_by_precision"] is None
