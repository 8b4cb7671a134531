"""Roofline per kernel, against numbers worked out by hand from the H100 row of the table."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import BF16, ROOFLINE, scenario_trace
from traceflops.core import hardware as hw
from traceflops.run.load import analyze
from traceflops.stages.roofline import (
    COLUMNS,
    memory_bound_overlay,
    op_estimate,
    roofline,
    top_recoverable,
)

H100 = hw.HARDWARE["h100-sxm"]
PEAK = H100.peaks["bf16"]  # 989.4e12 FLOP/s, dense
VEC = H100.vector_peaks["vector_fp32"]  # 66.9e12 FLOP/s
HBM = H100.hbm_bytes_per_s  # 3.35e12 B/s

M, K, N, S = ROOFLINE.M, ROOFLINE.K, ROOFLINE.N, ROOFLINE.S


@pytest.fixture
def frame(tmp_path):
    a = analyze(scenario_trace(tmp_path, "roofline"))
    assert a.hardware["precision"] == "bf16"
    r = roofline(a.kernels, a.ops, H100, a.hardware["precision"])
    assert r.height == a.kernels.height and r["kernel_id"].to_list() == a.kernels["kernel_id"].to_list()
    return r


def row(frame, name, i=0):
    return frame.filter(pl.col("name") == name).row(i, named=True)


def test_gemm_compute_bound(frame):
    g = row(frame, "sm90_xmma_gemm_bf16bf16_bf16f32")
    flops = 2 * M * N * K  # 137,438,953,472
    nbytes = (M * K + K * N + M * N) * 2  # 117,440,512
    assert g["roof_flops"] == flops and g["flops_basis"] == "shapes"
    assert g["roof_bytes"] == nbytes and g["bytes_basis"] == "shapes"
    assert g["intensity"] == pytest.approx(flops / nbytes)  # ~1170 FLOP/byte
    assert g["ridge"] == pytest.approx(989.4e12 / 3.35e12)  # ~295
    assert g["bound"] == "compute"
    # 250 us: 549.8 TFLOP/s achieved, 0.556 of the dense bf16 peak
    assert g["achieved_flops_frac"] == pytest.approx(flops / 250e-6 / 989.4e12)
    assert g["achieved_flops_frac"] == pytest.approx(0.5557, abs=1e-4)
    assert g["achieved_bw_frac"] == pytest.approx(nbytes / 250e-6 / 3.35e12)
    # at peak it would take 138.9 us
    assert g["recoverable_us"] == pytest.approx(250 - flops / PEAK * 1e6)
    assert g["recoverable_us"] == pytest.approx(111.09, abs=0.01)


def test_elementwise_add_memory_bound(frame):
    e = row(frame, "elementwise_add")
    nbytes = 3 * S * S * 2  # two bf16 inputs read, one written
    assert e["roof_bytes"] == nbytes and e["bytes_basis"] == "estimate"
    assert e["roof_flops"] == S * S and e["flops_basis"] == "estimate"
    assert e["intensity"] == pytest.approx(1 / 6)
    assert e["peak_flops"] == VEC and e["ridge"] == pytest.approx(66.9 / 3.35)
    assert e["bound"] == "memory"
    # 100.66 MB at 3.35 TB/s = 30.05 us; the kernel took 100
    assert e["recoverable_us"] == pytest.approx(100 - nbytes / HBM * 1e6)
    assert e["recoverable_us"] == pytest.approx(69.95, abs=0.01)
    assert e["achieved_bw_frac"] == pytest.approx(nbytes / 100e-6 / 3.35e12)


def test_split_by_duration_and_nulls(frame):
    parts = frame.filter(pl.col("name") == "mul_part").sort("dur", descending=True)
    total = 3 * 1024 * 1024 * 4  # in place: self and other read, self written
    assert parts["roof_bytes"].to_list() == [0.75 * total, 0.25 * total]
    assert parts["roof_flops"].to_list() == [0.75 * 1024 * 1024, 0.25 * 1024 * 1024]
    assert parts["bytes_basis"].to_list() == ["shapes", "shapes"]
    for name in ("orphan_kernel", "cat_kernel"):
        r = row(frame, name)
        for c in ("roof_flops", "flops_basis", "roof_bytes", "bytes_basis", "intensity", "bound", "floor_us", "recoverable_us"):
            assert r[c] is None, (name, c)


def test_overlay_and_top(frame):
    mask = memory_bound_overlay(frame)
    assert mask.dtype == pl.Boolean and len(mask) == frame.height
    assert sorted(frame.filter(mask)["name"].to_list()) == ["elementwise_add", "elementwise_add", "mul_part", "mul_part"]
    top = top_recoverable(frame, n=3)
    assert top.height == 3
    nbytes = 3 * S * S * 2
    # adds: 180 - 2 x 30.05 = 119.9 us; GEMM: 111.1 us; mul_: 40 - 3.76 = 36.2 us
    assert top["name"].to_list() == ["elementwise_add", "sm90_xmma_gemm_bf16bf16_bf16f32", "mul_part"]
    add = top.filter(pl.col("name") == "elementwise_add").row(0, named=True)
    assert add["count"] == 2 and add["dur_us"] == 180
    assert add["recoverable_us"] == pytest.approx(180 - 2 * nbytes / HBM * 1e6)
    assert add["bound"] == "memory" and add["median_intensity"] == pytest.approx(1 / 6)
    assert top["recoverable_us"].to_list() == sorted(top["recoverable_us"].to_list(), reverse=True)


def test_without_hardware_only_counts(tmp_path):
    a = analyze(scenario_trace(tmp_path, "roofline"))
    r = roofline(a.kernels, a.ops, None, "bf16")
    e = r.filter(pl.col("name") == "elementwise_add").row(0, named=True)
    assert e["roof_bytes"] == 3 * S * S * 2 and e["intensity"] == pytest.approx(1 / 6)
    for c in ("peak_flops", "ridge", "bound", "achieved_bw_frac", "recoverable_us"):
        assert e[c] is None
    assert set(COLUMNS) <= set(r.columns)


@pytest.mark.parametrize(
    "name,dims,types,want",
    [
        # out of place, broadcast [4,1] x [1,8] -> [4,8] fp32
        ("aten::mul", [[4, 1], [1, 8]], ["float", "float"], (4 * 4 + 8 * 4 + 32 * 4, 32, "estimate")),
        # out= tensor recorded after the inputs: written, not read
        ("aten::mul", [[512, 9], [], [512, 9]], [BF16, "double", BF16], (512 * 9 * 2 + 8 + 512 * 9 * 2, 512 * 9, "shapes")),
        # a comparison writes bool
        ("aten::eq", [[16, 16], []], ["long int", "Scalar"], (16 * 16 * 8 + 16 * 16, 256, "estimate")),
        # in place with a scalar
        ("aten::clamp_min_", [[10, 64], []], [BF16, "Scalar"], (2 * 640 * 2, 640, "shapes")),
        # a reduction reads its input; its output is neglected
        ("aten::sum", [[10, 1000], [], [], []], [BF16, "ScalarList", "Scalar", ""], (10 * 1000 * 2, 10000, "estimate")),
        # a norm writes one tensor like its largest input
        ("aten::native_layer_norm", [[8, 512], [], [512], [512], []], [BF16, "ScalarList", BF16, BF16, "Scalar"],
         (8 * 512 * 2 * 2 + 512 * 2 * 2, 5 * 8 * 512, "estimate")),
        ("aten::copy_", [[1, 559], [1, 559], []], ["float", "long int", "Scalar"], (559 * 4 + 559 * 8, 0, "shapes")),
        ("aten::fill_", [[100], []], [BF16, "Scalar"], (200, 0, "shapes")),
    ],
)
def test_op_estimate_rules(name, dims, types, want):
    nbytes, flops, bbasis, fbasis = op_estimate(name, dims, types)
    assert (nbytes, flops, bbasis) == want
    assert fbasis == "estimate"


@pytest.mark.parametrize(
    "name,dims,types",
    [
        ("aten::cat", [[[1, 2], [1, 2]], []], ["TensorList", "Scalar"]),  # no dtype for tensor lists
        ("vllm::rotary_embedding", [[4, 4]], [BF16]),  # no rule outside aten
        ("aten::index", [[4, 4], []], [BF16, "GenericList"]),  # output not knowable from inputs
        ("aten::add", None, None),  # no shapes recorded
        ("aten::add", [[4, 4], [4, 4]], ["weird", BF16]),  # an unknown dtype
    ],
)
def test_op_estimate_unknown(name, dims, types):
    assert op_estimate(name, dims, types) == (None, None, None, None)


REAL = ("h100_qwen_inference.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz")


@pytest.mark.parametrize("trace", REAL)
def test_real_traces_invariants(shared, trace):
    a = analyze(str(shared / "kineto" / trace))
    h = hw.lookup(a.hardware["name"])
    r = roofline(a.kernels, a.ops, h, a.hardware["precision"])
    assert r.height == a.kernels.height
    rec = r.filter(pl.col("recoverable_us").is_not_null())
    assert rec.height > 0.3 * a.kernels.filter(pl.col("cls").is_in(["matmul", "other_compute"])).height
    assert (rec["recoverable_us"] >= 0).all() and (rec["recoverable_us"] <= rec["dur"] + 1e-9).all()
    # matmuls with known FLOPs never beat the tensor peak
    mm = r.filter((pl.col("cls") == "matmul") & pl.col("achieved_flops_frac").is_not_null())
    assert mm.height > 0 and mm["achieved_flops_frac"].max() <= 1.05
    # only compute kernels get a roofline; memory-bound ones are below their ridge
    other = r.filter(~pl.col("cls").is_in(["matmul", "other_compute"]))
    assert other["roof_bytes"].null_count() == other.height and other["bound"].null_count() == other.height
    mem = r.filter(memory_bound_overlay(r))
    assert (mem["intensity"] < mem["ridge"]).all()
    assert (r["flops_basis"].drop_nulls().is_in(["shapes", "estimate", "compiler"])).all()
    top = top_recoverable(r, 10)
    assert top.height == 10 and top["recoverable_us"].is_sorted(descending=True)
    assert top["recoverable_us"].sum() <= r["recoverable_us"].sum() + 1e-6
