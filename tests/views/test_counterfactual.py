"""What fixing one loss would buy: hand-built traces whose step time after each fix is known by hand.

Each trace is one step on one H100 stream layout chosen so the critical path is plain; the expected step time and
MFU after are computed here from the numbers the trace was built with, and no counterfactual may promise more than
its bound (the critical path for communication, the device-busy time for idle, the kernels' own time for recompute).
"""

from __future__ import annotations

import pytest

import traceflops
from tests.builders import EVAL, Builder, shapes
from traceflops.run.load import analyze
from traceflops.run.options import model_options

PEAK_TFLOPS = 100.0
PEAK = PEAK_TFLOPS * 1e12  # FLOP/s
N = 1024
F = 2 * N * N * N  # one N×N×N matmul's FLOPs


def _what(a, term):
    got = [w for w in a.what_if if w.term == term]
    assert len(got) == 1, [w.term for w in a.what_if]
    return got[0]


def _mfu(flops: float, step_us: float) -> float:
    return flops / (PEAK * step_us * 1e-6)


def _never_more_than_bounds(a) -> None:
    """Every counterfactual: no longer than now, no shorter than removing the whole loss allows; MFU after follows the
    step time; communication saves at most its critical-path time; idle leaves the busy time; advice within its term."""
    s = a.steps.filter(~a.steps["step"].is_in(a.totals.step_count.excluded))
    n = s.height
    t = float(s["window"].sum()) / n
    col = {
        c: float(s[f"time_{c}"].fill_null(0).sum()) / n
        for c in ("communication_exposed", "idle", "recompute", "other_compute", "memcpy", "matmul_known")
    }
    whole = {
        "communication_exposed": col["communication_exposed"],
        "idle": col["idle"],
        "recompute": col["recompute"],
        "non_matmul": col["other_compute"],
        "memcpy_exposed": col["memcpy"],
        "matmul_below_peak": col["matmul_known"],
    }
    for w in a.what_if:
        assert w.bound and w.step_time_us == pytest.approx(t)
        if w.step_time_after_us is None:
            assert w.mfu_after is None
            continue
        assert w.step_time_after_us <= w.step_time_us + 1e-9
        assert w.step_time_after_us >= t - whole.get(w.term, t) - 1e-9
        if w.term == "communication_exposed" and s["path_communication"].null_count() == 0:
            assert t - w.step_time_after_us <= float(s["path_communication"].sum()) / n + 1e-9
        if w.term == "idle":
            assert w.step_time_after_us >= t - col["idle"] - 1e-9
        if w.mfu is not None:
            assert w.mfu_after == pytest.approx(w.mfu * w.step_time_us / w.step_time_after_us)
    after = {w.term: w.step_time_after_us for w in a.what_if}
    for it in a.advice:
        assert it.bound
        if it.term in after and after[it.term] is not None:
            assert it.step_time_after_us >= after[it.term] - 1e-9  # never more than its term


def _comm(tmp_path):
    """G 100-400 (matmul, N³); C2 350-540 on its own stream (50 µs under G, 140 exposed, off the path: nothing waits on
    it); the host busy to 590, then C1 600-700 (exposed) which a device sync waits on; K 710-900 after the sync."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 5, 20, **shapes([[N, N], [N, N]]))
    b.kernel("sm90_xmma_gemm_bf16", 10, 100, 300)
    b.op("record_param_comms", 30, 5)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 31, 350, 190, stream=20)
    b.op("aten::copy_", 40, 550)
    b.op("record_param_comms", 592, 5)
    b.kernel("ncclDevKernel_AllGather_bf16_RING_LL", 595, 600, 100, stream=21)
    b.op("cudaDeviceSynchronize", 598, 103, cat="cuda_runtime")
    b.op("aten::add", 703, 10)
    b.kernel("elementwise_kernel_add", 705, 710, 190)
    return analyze(b.write(tmp_path / "comm.json.gz"), model_options(peak_tflops=PEAK_TFLOPS))


def test_exposed_communication_is_capped_by_the_critical_path(tmp_path):
    a = _comm(tmp_path)
    t = 900.0 - 100.0
    exposed = (540.0 - 400.0) + (700.0 - 600.0)  # C2 past G's end, and all of C1
    on_path = 700.0 - 600.0  # only C1: the sync waited on it
    w = _what(a, "communication_exposed")
    assert w.step_time_us == t
    assert w.step_time_after_us == pytest.approx(t - min(exposed, on_path))  # 700, not t - exposed = 560
    assert w.mfu == pytest.approx(_mfu(F, t))
    assert w.mfu_after == pytest.approx(_mfu(F, t - on_path))
    assert w.title == "if the exposed communication were hidden"
    assert "100.0 µs of the exposed 240.0 µs per step is on the critical path" in w.bound
    assert w.step_time_after_us >= 300.0 + 190.0  # never shorter than the compute
    entry = [it for it in a.advice if it.term == "communication_exposed"][0]
    assert entry.step_time_after_us == w.step_time_after_us and entry.mfu_after == w.mfu_after
    assert entry.mfu_after < w.mfu / (1 - exposed / t)  # the unbounded promise, which it no longer makes
    _never_more_than_bounds(a)


def test_idle_leaves_the_device_busy_time(tmp_path):
    """G 100-300 (matmul, N³); the host busy until it launches E at 490: E 500-700; idle 300-500."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 5, 20, **shapes([[N, N], [N, N]]))
    b.kernel("sm90_xmma_gemm_bf16", 10, 100, 200)
    b.op("aten::copy_", 30, 450)
    b.op("aten::add", 485, 10)
    b.kernel("elementwise_kernel_add", 490, 500, 200)
    a = analyze(b.write(tmp_path / "idle.json.gz"), model_options(peak_tflops=PEAK_TFLOPS))
    t, idle = 700.0 - 100.0, 500.0 - 300.0
    w = _what(a, "idle")
    assert w.step_time_us == t and w.step_time_after_us == pytest.approx(t - idle)
    assert w.mfu_after == pytest.approx(_mfu(F, t - idle))
    assert "device-busy time, 400.0 µs per step" in w.bound
    entry = [it for it in a.advice if it.term == "idle" and it.get("findings") is not None][0]
    assert entry.mfu_after == pytest.approx(_mfu(F, t - idle))  # as before: idle / t of the step, gone
    _never_more_than_bounds(a)


def test_recompute_saves_the_recompute_kernels_own_time(tmp_path):
    """Reentrant checkpointing, every kernel queued ahead on one stream: forward 100-130, recompute 130-160, backward
    160-200; each an M×M×M matmul. Removing the recompute saves its 30 µs, not its FLOPs at peak."""
    m = 256
    f = 2 * m * m * m
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 5, 20, **shapes([[m, m], [m, m]]), **{"Sequence number": 10})
    b.kernel("sm90_xmma_gemm_fwd", 10, 100, 30)
    b.op(EVAL + "CheckpointFunctionBackward", 30, 60, tid=2, **{"Sequence number": 11})
    b.op("CheckpointFunctionBackward", 31, 58, tid=2)
    b.op("aten::mm", 35, 15, tid=2, **shapes([[m, m], [m, m]]), **{"Sequence number": 20})
    b.kernel("sm90_xmma_gemm_recompute", 40, 130, 30, tid=2)
    b.op(EVAL + "MmBackward0", 55, 30, tid=2, **{"Sequence number": 20})
    b.op("MmBackward0", 56, 28, tid=2)
    b.op("aten::mm", 60, 15, tid=2, **shapes([[m, m], [m, m]]))
    b.kernel("sm90_xmma_gemm_bwd", 65, 160, 40, tid=2)
    a = analyze(b.write(tmp_path / "recompute.json.gz"), model_options(peak_tflops=10))
    t, recompute = 200.0 - 100.0, 30.0
    assert float(a.steps["time_recompute"].sum()) == recompute  # the trace is what it was built to be
    w = _what(a, "recompute")
    assert w.step_time_us == t and w.step_time_after_us == pytest.approx(t - recompute)
    assert w.mfu == a.totals.mfu and w.mfu is not None
    assert w.mfu_after == pytest.approx(w.mfu * t / (t - recompute))
    at_peak = f / 10e12 * 1e6  # the budget's recompute term, as time: 3.4 µs
    assert a.totals.loss_budget["recompute"] == pytest.approx(at_peak / t)
    assert w.step_time_after_us < t - at_peak  # the kernels' time, not their FLOPs at peak
    item = [it for it in a.advice if it.term == "recompute"][0]
    assert item.step_time_after_us == pytest.approx(t - recompute) and item.mfu_after == pytest.approx(w.mfu_after)
    _never_more_than_bounds(a)


def _below_peak(tmp_path):
    """G 100-200 (N³ matmul, launched ahead), then E 200-250: the matmul at peak would take F / peak."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 30, **shapes([[N, N], [N, N]]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 12, 100, 100)
    b.op("aten::add", 45, 10)
    b.kernel("elementwise_kernel_add", 50, 200, 50)
    return b.write(tmp_path / "gemm.json.gz")


def test_matmuls_at_peak(tmp_path):
    a = analyze(_below_peak(tmp_path), model_options(peak_tflops=PEAK_TFLOPS))
    t = 250.0 - 100.0
    at_peak = F / PEAK * 1e6  # 21.47483648 µs
    w = _what(a, "matmul_below_peak")
    assert w.step_time_us == t
    assert w.step_time_after_us == pytest.approx(t - (100.0 - at_peak))
    assert w.mfu == pytest.approx(_mfu(F, t))
    assert w.mfu_after == pytest.approx(_mfu(F, t - (100.0 - at_peak)))
    assert _what(a, "non_matmul").step_time_after_us == pytest.approx(t - 50.0)
    entry = [it for it in a.advice if it.term == "matmul_below_peak"][0]
    assert entry.mfu_after == pytest.approx(w.mfu_after)
    _never_more_than_bounds(a)


def test_no_peak_leaves_the_mfu_unknown_never_zero(tmp_path):
    b = Builder(device_properties=[{"id": 0, "name": "Mystery Accelerator", "totalGlobalMem": 1}])
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::mm", 10, 30, **shapes([[N, N], [N, N]]))
    b.kernel("gemm_kernel", 12, 100, 100)
    b.op("aten::add", 45, 10)
    b.kernel("elementwise_kernel_add", 50, 200, 50)
    a = analyze(b.write(tmp_path / "nopeak.json.gz"))
    assert a.totals.mfu is None
    w = _what(a, "non_matmul")
    assert w.step_time_after_us == pytest.approx(100.0) and w.mfu is None and w.mfu_after is None
    below = _what(a, "matmul_below_peak")
    assert below.step_time_after_us is None and below.mfu_after is None and "cannot be bounded" in below.bound


def test_report_carries_the_counterfactuals(tmp_path):
    a = traceflops.analyze(_below_peak(tmp_path), peak_tflops=PEAK_TFLOPS)
    d = a.to_dict()
    keys = list(d)
    assert keys.index("what_if") == keys.index("advice") + 1
    rows = {w["term"]: w for w in d["what_if"]}
    assert set(rows) == {"matmul_below_peak", "non_matmul"}
    w = rows["matmul_below_peak"]
    assert set(w) == {"term", "title", "step_time_us", "step_time_after_us", "mfu", "mfu_after", "bound"}
    assert w["step_time_after_us"] == pytest.approx(150.0 - (100.0 - F / PEAK * 1e6))
    for it in d["advice"]:
        assert {"mfu_after", "step_time_after_us", "bound"} <= set(it)
        for f in it.get("findings", []):
            assert {"mfu_after", "step_time_after_us", "bound"} <= set(f)
    html = traceflops.to_html(a)
    assert "if every matmul of known FLOPs ran at peak" in html and 'class="what-if"' in html
