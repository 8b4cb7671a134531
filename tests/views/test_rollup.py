"""Roll-ups per kernel name and per module, on a synthetic checkpointed trace with known answers."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import EVAL, MODULES, scenario_trace
from traceflops.core.vocab import PHASES
from traceflops.run.load import analyze
from traceflops.views.rollup import by_kernel, by_module, module_of

M, K, K2, N = MODULES.M, MODULES.K, MODULES.K2, MODULES.N
F_ATTN = 2 * M * K * N  # 65,536
F_MLP = 2 * M * K2 * N  # 262,144


@pytest.fixture
def analysis(tmp_path):
    """Two checkpointed modules, attn and mlp: the µs and FLOPs of each kernel are in the scenario's docstring."""
    return analyze(scenario_trace(tmp_path, "modules"))


def test_phases_are_as_built(analysis):
    got = {(r["name"], r["phase"]) for r in analysis.kernels.select("name", "phase").iter_rows(named=True)}
    assert ("gemm_a", "forward") in got and ("gemm_a", "recompute") in got
    assert ("gemm_a_bwd", "backward") in got and ("add_kernel", "optimizer") in got


def test_by_module(analysis):
    m = by_module(analysis.ops, analysis.kernels)
    rows = {r["module"]: r for r in m.iter_rows(named=True)}
    attn, mlp = rows["attn"], rows["mlp"]
    assert attn["sources"] == ["annotation", "forward_seq"] and mlp["sources"] == ["annotation", "forward_seq"]
    assert (attn["time_forward"], attn["time_recompute"], attn["time_backward"]) == (30, 30, 40)
    assert (mlp["time_forward"], mlp["time_recompute"], mlp["time_backward"]) == (55, 50, 20)
    assert attn["time_us"] == 100 and mlp["time_us"] == 125
    assert (attn["flops_forward"], attn["flops_recompute"], attn["flops_backward"]) == (F_ATTN, F_ATTN, F_ATTN)
    assert (mlp["flops_forward"], mlp["flops_recompute"], mlp["flops_backward"]) == (F_MLP, F_MLP, F_MLP)
    assert attn["flops"] == 3 * F_ATTN
    assert attn["recompute_share"] == pytest.approx(0.3)
    assert mlp["recompute_share"] == pytest.approx(50 / 125)
    assert mlp["matmul_us"] == 120  # the relu is not matmul time
    # no module: the top-level op below the optimizer marker; no launching op: null
    assert rows["aten::add_"]["sources"] == ["top_op"] and rows["aten::add_"]["time_optimizer"] == 7
    assert rows[None]["time_us"] == 3 and rows[None]["sources"] == []
    total = analysis.kernels["dur"].sum()
    assert m["time_us"].sum() == total and m["share"].sum() == pytest.approx(1.0)
    assert list(m["module"][:2]) == ["mlp", "attn"]  # by time
    assert {f"time_{p}" for p in PHASES} | {f"flops_{p}" for p in PHASES} <= set(m.columns)


def test_module_fallbacks():
    """Rule order on a hand-made ops frame: annotation, then forward sequence number, then top op."""
    ops = pl.DataFrame(
        {
            "row": [0, 1, 2, 3, 4, 5, 6, 7],
            "name": ["ProfilerStep#3", "nn.Module: Linear_0", "aten::linear", "aten::addmm",
                     EVAL + "AddmmBackward0", "AddmmBackward0", "aten::mm", "aten::copy_"],
            "cat": ["user_annotation", "cpu_op", "cpu_op", "cpu_op", "cpu_op", "cpu_op", "cpu_op", "cpu_op"],
            "parent": [-1, 0, 1, 2, -1, 4, 5, 0],
            "seq": [None, None, 7, 7, 7, 7, None, None],
            "phase": ["other", "forward", "forward", "forward", "backward", "backward", "backward", "forward"],
        },
        schema_overrides={"seq": pl.Int64},
    )
    got = module_of(ops)
    assert got["module"].to_list() == [None, "nn.Module: Linear_0", "nn.Module: Linear_0", "nn.Module: Linear_0",
                                       "nn.Module: Linear_0", "nn.Module: Linear_0", "nn.Module: Linear_0", "aten::copy_"]
    assert got["module_source"].to_list() == [None, "annotation", "annotation", "annotation",
                                              "forward_seq", "forward_seq", "forward_seq", "top_op"]


def test_by_kernel(analysis):
    k = by_kernel(analysis.kernels)
    rows = {r["name"]: r for r in k.iter_rows(named=True)}
    a = rows["gemm_a"]
    assert (a["cls"], a["count"], a["total_us"], a["mean_us"], a["median_us"]) == ("matmul", 2, 60, 30, 30)
    assert a["flops"] == 2 * F_ATTN and a["flops_known_us"] == 60
    assert a["tflops"] == pytest.approx(2 * F_ATTN / 60e-6 / 1e12)
    assert a["phases"] == ["forward", "recompute"]
    total = analysis.kernels["dur"].sum()  # 255
    assert a["share"] == pytest.approx(60 / total)
    relu = rows["relu_kernel"]
    assert relu["flops"] is None and relu["tflops"] is None and relu["cls"] == "other_compute"
    assert k["total_us"].to_list() == sorted(k["total_us"].to_list(), reverse=True)
    assert k["count"].sum() == analysis.kernels.height


REAL = ("h100_qwen_inference.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz")


@pytest.mark.parametrize("trace", REAL)
def test_real_traces_conserve_time_and_flops(shared, trace):
    a = analyze(str(shared / "kineto" / trace))
    k = a.kernels
    bk = by_kernel(k)
    bm = by_module(a.ops, k)
    total = k["dur"].sum()
    for f in (bk, bm):
        assert f["share"].sum() == pytest.approx(1.0)
    assert bk["total_us"].sum() == pytest.approx(total)
    assert bm["time_us"].sum() == pytest.approx(total)
    assert bm["flops"].sum() == pytest.approx(k["flops"].sum())
    phase_time = sum(bm[f"time_{p}"].sum() for p in PHASES)
    assert phase_time == pytest.approx(total)
    assert ((bm["recompute_share"] >= 0) & (bm["recompute_share"] <= 1)).all()
    # every kernel with a launching op has a module
    launched = k.filter(pl.col("op_row").is_not_null())
    assert bm.filter(pl.col("module").is_not_null())["kernels"].sum() == launched.height
    if "act_checkpoint" in trace:
        assert bm["time_recompute"].sum() > 0
