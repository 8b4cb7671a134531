"""Graph replays take their FLOPs and phase from the ops that recorded the graph (hand-built traces, hand counts)."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from tests.builders import BF16, Builder, shapes
from traceflops.run.load import analyze
from traceflops.run.options import model_options

M, K, N = 48, 80, 24  # non-square
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_captured"
RELU = "void at::native::vectorized_elementwise_kernel<4, relu>"
FLOPS = 2 * M * K * N  # one aten::mm [M, K] x [K, N]


def _runtime(b: Builder, name: str, ts: float, corr: int, **args) -> None:
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": b.pid, "tid": b.main_tid, "ts": ts, "dur": 2.0,
                     "args": {"correlation": corr, **args}})


def _capture(b: Builder, t0: float, m: int = M, corr0: int = 1) -> None:
    """A capture: an aten::mm and a relu launched between Begin and EndCapture; their kernels do not run then."""
    _runtime(b, "cudaStreamBeginCapture", t0, corr0)
    b.op("aten::mm", t0 + 10, 50, **shapes([[m, K], [K, N]]))
    _runtime(b, "cudaLaunchKernel", t0 + 20, corr0 + 1, kernel=GEMM, grid=[4, 1, 1], block=[128, 1, 1])
    b.op("aten::relu", t0 + 70, 20, **shapes([[m, N]]))
    _runtime(b, "cudaLaunchKernel", t0 + 75, corr0 + 2, kernel=RELU, grid=[8, 1, 1], block=[256, 1, 1])
    _runtime(b, "cudaStreamEndCapture", t0 + 100, corr0 + 3)


def _replay(b: Builder, t0: float, corr: int) -> None:
    """A graph launch under a non-matmul annotation, and the two kernels it ran."""
    b.annotation("replay_block", t0, 100)
    _runtime(b, "cudaGraphLaunch", t0 + 10, corr)
    for name, start, dur in ((GEMM, t0 + 200, 40), (RELU, t0 + 245, 5)):
        b.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                         "args": {"device": 0, "stream": 7, "correlation": corr}})


def _replays_only(b: Builder) -> Builder:
    b.annotation("ProfilerStep#1", 400, 2000)
    _replay(b, 500, 100)
    _replay(b, 1000, 101)
    return b


def _matmuls(a) -> pl.DataFrame:
    return a.kernels.filter(pl.col("cls") == "matmul")


def test_replays_take_the_flops_of_a_capture_in_the_same_trace(tmp_path):
    b = Builder()
    _capture(b, 0)
    path = _replays_only(b).write(tmp_path / "t.json.gz")
    a = analyze(path)
    mm = _matmuls(a)
    assert mm["name"].to_list() == [GEMM, GEMM]
    assert mm["flops"].to_list() == [FLOPS, FLOPS]
    assert a.totals["flops"]["forward"] == 2 * FLOPS
    assert a.totals["flops_coverage"] == 1.0 and not a.totals["flops_lower_bound"]
    assert set(a.kernels.filter(pl.col("name") == RELU)["cls"]) == {"other_compute"}
    assert any("attributed to the captured ops" in w for w in a.warnings)


def test_replays_without_a_capture_are_matmul_time_with_unknown_flops_and_say_how_to_record_it(tmp_path):
    path = _replays_only(Builder()).write(tmp_path / "t.json.gz")
    a = analyze(path)
    mm = _matmuls(a)
    assert mm["name"].to_list() == [GEMM, GEMM] and mm["flops"].null_count() == 2  # told by name, never other compute
    assert a.totals["flops_coverage"] == 0.0 and a.totals["flops_lower_bound"]
    assert a.totals["hfu"] is None  # nothing known: unknown, never 0
    (top,) = a.totals["unknown_matmul_kernels"]
    assert top["name"] == GEMM and top["count"] == 2 and top["time_us"] == 80.0 and "graph" in top["why"]
    assert any("--graph-capture" in w for w in a.warnings)
    assert a.totals["loss_budget"]["matmul_flops_unknown"] > 0


def test_a_capture_trace_given_or_found_beside_the_trace(tmp_path):
    cap = Builder()
    _capture(cap, 0)
    (tmp_path / "run").mkdir()
    run = _replays_only(Builder()).write(tmp_path / "run" / "t.json.gz")
    given = cap.write(tmp_path / "capture.json.gz")
    a = analyze(run, model_options(graph_captures=[given]))
    assert _matmuls(a)["flops"].to_list() == [FLOPS, FLOPS]
    # vLLM / SGLang layout: capture_traces/ beside the trace, with an execution_details.json that is not a trace
    (tmp_path / "run" / "capture_traces").mkdir()
    shutil.copy(given, tmp_path / "run" / "capture_traces" / "graph_capture_rank_0.pt.trace.json.gz")
    (tmp_path / "run" / "capture_traces" / "execution_details.json").write_text('[{"batch_size": 48}]')
    assert _matmuls(analyze(run))["flops"].to_list() == [FLOPS, FLOPS]


def test_captures_of_the_same_kernels_with_other_shapes_are_not_guessed(tmp_path):
    b = Builder()
    _capture(b, 0, m=M, corr0=1)
    _capture(b, 200, m=2 * M, corr0=11)  # another batch size, same kernels
    a = analyze(_replays_only(b).write(tmp_path / "t.json.gz"))
    assert _matmuls(a)["flops"].null_count() == 2
    assert any("shapes differ" in w for w in a.warnings)


def test_replays_round_robin_over_captures_of_one_kernel_set(tmp_path):
    """Two captures with equal shapes (two layers): each replay takes one; the FLOPs are the same either way."""
    b = Builder()
    _capture(b, 0, corr0=1)
    _capture(b, 200, corr0=11)
    a = analyze(_replays_only(b).write(tmp_path / "t.json.gz"))
    assert _matmuls(a)["flops"].to_list() == [FLOPS, FLOPS]
    assert a.ops.filter(pl.col("name") == "aten::mm")["ran"].sum() == 2  # one replayed op per replay, none for the captures


@pytest.mark.parametrize("graph_under_matmul_op", [True])
def test_a_replay_under_a_matmul_op_stays_that_ops(tmp_path, graph_under_matmul_op):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 100, 50, **shapes([[M, K], [K, N]], [BF16, BF16]))
    _runtime(b, "cudaGraphLaunch", 110, 100)
    b.events.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 300, "dur": 40,
                     "args": {"device": 0, "stream": 7, "correlation": 100}})
    a = analyze(b.write(tmp_path / "t.json.gz"))
    assert _matmuls(a)["flops"].to_list() == [FLOPS]
    assert not any("--graph-capture" in w for w in a.warnings)


def test_a_capture_whose_launches_name_no_kernel_is_matched_in_launch_order(tmp_path):
    """CUDA runtime launches may carry no kernel name: a one-stream replay runs the captured launches in order."""
    b = Builder()
    _capture(b, 0)
    for e in b.events:
        e["args"].pop("kernel", None)
    a = analyze(_replays_only(b).write(tmp_path / "t.json.gz"))
    mm = _matmuls(a)
    assert mm["flops"].to_list() == [FLOPS, FLOPS]
    relu = a.ops.filter(pl.col("name") == "aten::relu")
    assert relu.height == 3  # the captured one and one per replay, each tied to its replayed kernel
    assert set(a.kernels.filter(pl.col("name") == RELU)["op_row"].to_list()) <= set(relu["row"].to_list())
