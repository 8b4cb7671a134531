"""GEMM shapes roll-up: dims, time, TFLOP/s and the wave-quantization hint, by hand."""

from __future__ import annotations

import math

import polars as pl
import pytest

from tests.builders import Builder, scenario_trace
from traceflops.core import hardware as hw
from traceflops.run.load import analyze
from traceflops.views.gemm_shapes import by_gemm_shape, gemm_dims, wave_quantization

SMS = 132  # H100 SXM5


def test_gemm_dims():
    assert gemm_dims("aten::mm", [[64, 32], [32, 16]]) == (64, 16, 32, 1)
    assert gemm_dims("aten::addmm", [[16], [64, 32], [32, 16], [], []]) == (64, 16, 32, 1)
    assert gemm_dims("aten::bmm", [[8, 64, 32], [8, 32, 16]]) == (64, 16, 32, 8)
    assert gemm_dims("aten::baddbmm", [[8, 64, 16], [8, 64, 32], [8, 32, 16], [], []]) == (64, 16, 32, 8)
    assert gemm_dims("aten::linear", [[4, 10, 32], [16, 32], [16]]) == (40, 16, 32, 1)
    # matmul: a 2-D right operand folds the left one's leading dims; otherwise broadcast batch
    assert gemm_dims("aten::matmul", [[4, 10, 32], [32, 16]]) == (40, 16, 32, 1)
    assert gemm_dims("aten::matmul", [[2, 4, 10, 32], [1, 4, 32, 16]]) == (10, 16, 32, 8)
    assert gemm_dims("aten::matmul", [[10, 32], [32]]) == (10, 1, 32, 1)
    # mismatched or unreadable dims give nothing
    assert gemm_dims("aten::mm", [[64, 32], [31, 16]]) is None
    assert gemm_dims("aten::bmm", [[8, 64, 32], [4, 32, 16]]) is None
    assert gemm_dims("aten::mm", [[64, 32]]) is None
    assert gemm_dims("aten::mm", [[], []]) is None


@pytest.mark.parametrize(
    "k, tiles, waves, efficiency, fill",
    [
        # M = N = 1024·k: tiles = 64·k²
        (1, 64, 64 / 132, 64 / 132, 64 / 132),  # one partial wave: 48% of the SMs busy
        (2, 256, 256 / 132, 256 / 264, 124 / 132),  # 2 waves, the last 94% full
        (3, 576, 576 / 132, 576 / 660, 48 / 132),  # 5 waves, the last 36% full
    ],
)
def test_wave_quantization_by_hand(k, tiles, waves, efficiency, fill):
    w = wave_quantization(1024 * k, 1024 * k, 1, SMS)
    assert w["tiles"] == tiles
    assert w["waves"] == pytest.approx(waves)
    assert w["wave_efficiency"] == pytest.approx(efficiency)
    assert w["last_wave_fill"] == pytest.approx(fill)


def test_wave_quantization_edges():
    assert wave_quantization(1000, 1, 3, SMS)["tiles"] == 8 * 1 * 3  # ceil(1000/128) = 8
    w = wave_quantization(128 * 12, 128 * 11, 1, SMS)  # exactly one full wave
    assert (w["tiles"], w["wave_efficiency"], w["last_wave_fill"]) == (132, 1.0, 1.0)
    assert wave_quantization(1024, 1024, 1, None)["waves"] is None


def test_by_gemm_shape(tmp_path):
    a = analyze(scenario_trace(tmp_path, "gemms"))  # four GEMM shapes: see the scenario's docstring
    g = by_gemm_shape(a.ops, a.kernels, a.hardware)
    rows = {(r["M"], r["N"], r["K"], r["batch"]): r for r in g.iter_rows(named=True)}
    assert list(rows) == [(3072, 3072, 1024, 1), (2048, 2048, 512, 1), (1024, 1024, 512, 1), (256, 256, 64, 4)]
    small = rows[(1024, 1024, 512, 1)]
    assert (small["count"], small["kernels"], small["dtype"], small["ops"]) == (2, 2, "bf16", ["aten::mm"])
    assert small["time_us"] == pytest.approx(100) and small["share"] == pytest.approx(100 / 1050)
    flops = 2 * 2 * 1024 * 1024 * 512
    assert small["flops"] == flops and small["tflops"] == pytest.approx(flops / 100e-6 / 1e12)
    assert (small["tiles"], small["wave_hint"]) == (64, True)
    assert small["last_wave_fill"] == pytest.approx(64 / 132)
    assert "48%" in small["hint"]
    mid = rows[(2048, 2048, 512, 1)]
    assert mid["ops"] == ["aten::addmm"] and mid["tiles"] == 256 and not mid["wave_hint"] and mid["hint"] is None
    big = rows[(3072, 3072, 1024, 1)]
    assert big["tiles"] == 576 and big["wave_efficiency"] == pytest.approx(576 / 660)
    assert big["wave_hint"] and "36% full" in big["hint"]
    assert big["tflops"] == pytest.approx(2 * 3072 * 3072 * 1024 / 745e-6 / 1e12)
    tiny = rows[(256, 256, 64, 4)]
    assert tiny["tiles"] == 16 and tiny["last_wave_fill"] == pytest.approx(16 / 132)
    assert tiny["share"] < 0.01 and not tiny["wave_hint"]  # its time does not matter
    assert g["share"].sum() == pytest.approx(1.0)


def test_hardware_forms(tmp_path):
    a = analyze(scenario_trace(tmp_path, "gemms"))
    by_row = by_gemm_shape(a.ops, a.kernels, hw.lookup("h100-sxm"))
    by_name = by_gemm_shape(a.ops, a.kernels, "H100")
    assert by_row.equals(by_gemm_shape(a.ops, a.kernels, a.hardware)) and by_name.equals(by_row)
    # an MI300X has 304 CUs: 576 tiles fill 1.89 waves, the last 89% full
    mi = by_gemm_shape(a.ops, a.kernels, "MI300X").filter(pl.col("M") == 3072).row(0, named=True)
    assert mi["last_wave_fill"] == pytest.approx((576 - 304) / 304) and not mi["wave_hint"]
    none = by_gemm_shape(a.ops, a.kernels, None)
    assert none["waves"].null_count() == none.height and not none["wave_hint"].any()
    assert none["tiles"].to_list() == by_row["tiles"].to_list()


def test_no_gemms(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::add", 10, 20)
    b.kernel("k", 12, 100, 10)
    a = analyze(b.write(tmp_path / "none.json.gz"))
    g = by_gemm_shape(a.ops, a.kernels, a.hardware)
    assert g.height == 0 and "wave_hint" in g.columns


def test_qwen_gemm_shapes(shared):
    a = analyze(str(shared / "kineto" / "h100_qwen_inference.json.gz"))
    g = by_gemm_shape(a.ops, a.kernels, a.hardware)
    mm = a.kernels.filter(pl.col("cls") == "matmul")
    mm_ops = a.ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("name").is_in(["aten::mm", "aten::addmm", "aten::bmm"]))
    assert g["count"].sum() == mm_ops.height
    assert g["time_us"].sum() <= mm["dur"].sum()
    top = g.row(0, named=True)
    assert (top["M"], top["N"], top["K"]) == (8944, 2816, 1024)
    assert top["tiles"] == math.ceil(8944 / 128) * 22 and not top["wave_hint"]  # 1540 tiles, last wave 67% full
    flagged = g.filter("wave_hint")
    assert flagged.height and (flagged["last_wave_fill"] < 0.5).all() and (flagged["share"] >= 0.01).all()
