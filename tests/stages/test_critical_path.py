"""The critical path of a step, on traces whose path is known by construction (written out by hand below).

Each case is one step of a synthetic Kineto GPU trace (tests/builders.py): the
expected segments follow from the timestamps alone, without the code under test.
On every shared Kineto trace the path is contiguous, as long as each step's
window, made of events that exist in the trace, and its host share agrees in
direction with the idle-gap reasons.
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import Builder, shared_fixtures
from traceflops.run.load import analyze
from traceflops.stages.critical_path import BETWEEN_OPS, KINDS, breakdown

ELT = "void at::native::vectorized_elementwise_kernel<4>"


def path_of(b: Builder, tmp_path) -> tuple[list[tuple], dict]:
    a = analyze(b.write(tmp_path / "t.json.gz"))
    seg = a.critical_path.sort("start")
    rows = [(k, round(s, 6), round(e, 6)) for k, s, e in seg.select("kind", "start", "end").iter_rows()]
    return rows, {k: v for k, v in breakdown(seg).drop("step", "length").row(0, named=True).items() if v}


def test_a_host_bound_step_is_host_then_launch_then_the_last_kernel(tmp_path):
    # The host runs 10..900 and launches each kernel 5 us before it can start: launches trail the device.
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("aten::mul", 10, 890)
    for t in (100, 300, 500):
        b.kernel(ELT, t, t + 10, 20)  # launch call t..t+2, kernel t+10..t+30
    rows, by_kind = path_of(b, tmp_path)
    # Window: first kernel start 110 .. last kernel end 530 (the last step ends at its last activity).
    # One launch, one segment: the call (500..502) and its latency until the kernel starts (..510).
    assert rows == [("host", 110.0, 500.0), ("launch", 500.0, 510.0), ("device_other", 510.0, 530.0)]
    assert by_kind == {"host": 390.0, "launch": 10.0, "device_other": 20.0}


def test_a_device_bound_step_is_its_stream_back_to_back(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    for i, t in enumerate((10, 12, 14)):
        b.op("aten::mm", t, 1.5, **{"Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]})
        b.kernel("sm80_xmma_gemm_f32f32", t + 0.1, 100 + 100 * i, 100)
    rows, by_kind = path_of(b, tmp_path)
    assert rows == [("device_matmul", 100.0, 200.0), ("device_matmul", 200.0, 300.0), ("device_matmul", 300.0, 400.0)]
    assert by_kind == {"device_matmul": 300.0}


def test_a_step_ended_by_a_synchronisation_goes_through_the_kernel_it_waited_for(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("aten::mul", 5, 8)
    b.kernel(ELT, 10, 20, 480)  # A: 20..500
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": b.pid, "tid": b.main_tid,
                     "ts": 15, "dur": 490, "args": {"correlation": 9999}})  # returns at 505, after A ended
    b.op("aten::mul", 508, 5)
    b.kernel(ELT, 510, 520, 40)  # B: launched 510..512, runs 520..560
    rows, by_kind = path_of(b, tmp_path)
    # The host's 505..510 is cut where the second aten::mul starts (508): segments are named by the op the host ran.
    assert rows == [("device_other", 20.0, 500.0), ("sync", 500.0, 505.0), ("host", 505.0, 508.0), ("host", 508.0, 510.0),
                    ("launch", 510.0, 520.0), ("device_other", 520.0, 560.0)]
    assert by_kind == {"device_other": 520.0, "sync": 5.0, "host": 5.0, "launch": 10.0}


def test_a_wait_on_another_stream_links_the_two_streams(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.kernel(ELT, 10, 100, 200, stream=7)  # A: 100..300
    b.kernel(ELT, 12, 302, 98, stream=8)  # B: queued at 12, starts when A is done (an event wait)
    rows, by_kind = path_of(b, tmp_path)
    assert rows == [("device_other", 100.0, 300.0), ("sync", 300.0, 302.0), ("device_other", 302.0, 400.0)]
    assert by_kind == {"device_other": 298.0, "sync": 2.0}


def test_a_step_that_is_not_the_last_ends_where_the_next_one_starts(tmp_path):
    # Step 0: a kernel 100..200, in parallel with the host, which runs aten::mul 10..290 and aten::add 310..410
    # and launches step 1's first kernel at 390. The window 100..400 was the host's: the kernel is off the path.
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 300)
    b.op("aten::mul", 10, 280)
    b.kernel(ELT, 20, 100, 100)
    b.annotation("ProfilerStep#1", 300, 300)
    b.op("aten::add", 310, 100)
    b.kernel(ELT, 390, 400, 50)
    a = analyze(b.write(tmp_path / "t.json.gz"))
    first = a.critical_path.filter(pl.col("step") == 0).sort("start")
    assert [(k, s, e) for k, s, e in first.select("kind", "start", "end").iter_rows()] == [
        ("host", 100.0, 290.0), ("host", 290.0, 310.0), ("host", 310.0, 390.0), ("launch", 390.0, 400.0)]
    assert first["name"].to_list()[:3] == ["aten::mul", BETWEEN_OPS, "aten::add"]  # named by the op the host ran


KINETO = ("a100_ddp_resnet_rank0", "a100_torchrec_rank3", "b200_inference_rank0", "h100_qwen_inference", "mi250_toy_train",
          "mi300_resnet_act_checkpoint_rank0", "rtx2080ti_linear_train", "v100_resnet50_legacy2021", "v100_transformer_rank1")


@pytest.mark.parametrize("name", KINETO)
def test_every_step_of_a_real_trace_has_a_contiguous_path_as_long_as_its_window(name):
    path = shared_fixtures() / "kineto" / f"{name}.json.gz"
    if not path.exists():
        pytest.skip(f"shared fixture {path} absent (set TRACEFLOPS_FIXTURES)")
    a = analyze(str(path))
    seg = a.critical_path.sort("step", "start")
    steps = a.steps.select("step", "start", "window")
    assert set(seg["step"].unique()) == set(steps["step"])
    for (step,), g in seg.group_by("step"):
        s = steps.filter(pl.col("step") == step).row(0, named=True)
        starts, ends = g["start"].to_list(), g["end"].to_list()
        assert starts[0] == pytest.approx(s["start"], abs=1e-3) and ends[-1] == pytest.approx(s["start"] + s["window"], abs=1e-3)
        assert all(abs(e - n) < 1e-6 for e, n in zip(ends[:-1], starts[1:], strict=True))  # contiguous
        assert sum(g["dur"]) == pytest.approx(s["window"], abs=1e-3)
    assert set(seg["kind"]) <= set(KINDS)
    # Named segments are events of the trace: kernels, runtime calls, host ops.
    names = set(a.kernels["name"]) | set(a.trace.launches["name"]) | set(a.ops["name"]) | {BETWEEN_OPS, "idle", "wait on another stream"}
    assert set(seg["name"]) <= names
    # Direction: a device idle mostly for the host (host-bound, input pipeline) goes with a path mostly on the host,
    # and a path almost never on the host with little host-caused idle. (A busy device can still end a step behind
    # a host that was busier: both near 100%, the path takes the longer chain.)
    reasons = a.totals["idle_us_by_reason"] or {}
    host_share = float(seg.filter(pl.col("kind").is_in(["host", "launch"]))["dur"].sum()) / float(seg["dur"].sum())
    idle = a.totals["time_us"]["idle"]
    host_caused = reasons.get("host_bound", 0) + reasons.get("input_pipeline", 0)
    if idle > 0.3 * a.totals["wall_us"] and host_caused > 0.5 * idle:
        assert host_share > 0.5, (host_share, reasons)
    if host_share < 0.1:
        assert host_caused < 0.1 * a.totals["wall_us"], (host_share, reasons)


def test_a_tpu_profile_has_a_device_only_path():
    """TPU profiles record no host launches: the path runs on the chips' op lines alone, and still spans each window."""
    path = shared_fixtures() / "xplane" / "tpu_v6e_inference.xplane.pb"
    if not path.exists():
        pytest.skip(f"shared fixture {path} absent (set TRACEFLOPS_FIXTURES)")
    a = analyze(str(path))
    seg = a.critical_path
    assert not set(seg["kind"]) & {"host", "launch"}
    window = a.steps["window"].sum()
    assert float(seg["dur"].sum()) == pytest.approx(window, abs=1e-3)
    # The chips were busy most of the window (the partition's idle is 13.7 s of 92.5 s a chip): so is the path.
    assert float(seg.filter(pl.col("kind") == "idle")["dur"].sum()) < 0.25 * window


def test_the_host_bound_verdict_rests_on_the_path(tmp_path):
    """The host-bound case above: the advice says the host bounded the step, and recovers no more than the path's host time."""
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("aten::mul", 10, 890)
    for t in (100, 300, 500):
        b.kernel(ELT, t, t + 10, 20)
    a = analyze(b.write(tmp_path / "t.json.gz"))

    def items(xs):
        for x in xs:
            yield x
            yield from items(x.get("findings") or [])

    hb = next(x for x in items(a.advice) if x["kind"] == "host_bound")
    assert "critical path" in hb["title"] and "host bounds" in hb["title"]
    # Path: host 390 + launch 10 of the 420 us window; the idle gaps sum to 420 - 60 = 360 us, all host-bound.
    assert hb["data"]["critical_path_host_us"] == pytest.approx(400.0)
    assert hb["recoverable"] == pytest.approx(360.0 / 420.0)
