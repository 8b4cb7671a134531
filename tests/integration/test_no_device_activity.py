"""A trace that names a device but holds none of its activity: MFU and HFU unknown, no time from host ops, said first.

A GPU job profiled with CPU activity only (deviceProperties lists a GPU, NCCL or record_stream ops, runtime
launches, but no kernel, memcpy or memset), or captured with the CUPTI range profiler (counters per range, no
timeline), is not a CPU run: its host ops' durations are not device time. A true CPU trace keeps its numbers.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.builders import BF16, write_doc
from traceflops.cli.main import main

M, K, N = 256, 128, 64
MODEL = ["--params", "1.2e6", "--layers", "2", "--heads", "4", "--head-dim", "12", "--seq-len", "40", "--tokens-per-step", "160"]
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920, "computeMajor": 8, "computeMinor": 0, "numSms": 108}


def events(extra=()) -> list[dict]:
    """One step of a linear layer on the host (an aten::mm with its shapes inside aten::linear, then an add), no device event."""
    def op(name, ts, dur, ext, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 1, "ts": ts, "dur": dur,
                "args": {"External id": ext, **args}}
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 100, "tid": 1, "ts": 0, "dur": 1000,
         "args": {"External id": 1}},
        op("aten::linear", 100, 400, 2),
        op("aten::mm", 110, 380, 3, **{"Input Dims": [[M, K], [K, N]], "Input type": [BF16, BF16]}),
        op("aten::add", 600, 50, 4, **{"Input Dims": [[M, N], [M, N]], "Input type": [BF16, BF16]}),
        *extra,
    ]


def doc(devices=(A100,), extra=()) -> dict:
    d = {"schemaVersion": 1, "traceEvents": events(extra)}
    if devices:
        d["deviceProperties"] = list(devices)
    return d


def run(path, *flags):
    r = CliRunner().invoke(main, ["analyze", str(path), "--no-cache", "--quiet", *flags])
    assert r.exit_code == 0, r.output
    return r.stdout


def report(path, *flags) -> dict:
    return json.loads(run(path, "--format", "json", *flags))


def assert_no_device_numbers(d: dict) -> None:
    """MFU and HFU null everywhere, and no time class, loss budget or critical path made from host op durations."""
    t = d["totals"]
    assert t["mfu"] is None and t["hfu"] is None and t["mfu_no_attention"] is None
    assert t["time_us"] is None and t["loss_budget"] is None
    assert d["ranks"][0]["device_mfu"] is None and d["ranks"][0]["time_us"] is None
    for s in d["steps"]:
        assert s["mfu"] is None and s["hfu"] is None
        assert s["time_us"]["matmul"] is None and s["time_us"]["other_compute"] is None
        assert s["loss_budget"] is None
    assert d["advice"] == []
    assert d["critical_path"]["available"] is False and "CPU-only" not in d["critical_path"]["why"]  # not called a CPU run


def headline_warning(out: str, opening: str) -> str:
    """The warning that opens with `opening` (its lines joined: piped output wraps at the width), asserted to come
    before the MFU line (the headline)."""
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"warning: {opening}"))
    mfu = next(i for i, ln in enumerate(lines) if ln.startswith("MFU "))
    assert at < mfu, out
    end = next((i for i in range(at + 1, mfu) if lines[i].startswith(("warning:", "hardware:"))), mfu)
    return " ".join(lines[at:end])


# ------------------------------------------------------------------ a hand-built trace (no shared folder needed)


def test_a_gpu_named_in_device_properties_without_device_activity_has_no_mfu(tmp_path):
    path = write_doc(doc(), tmp_path / "gpu_cpu_only.json.gz")
    d = report(path)
    assert_no_device_numbers(d)
    w = d["warnings"][0]
    assert w.startswith("no device activity in this capture")
    assert "NVIDIA A100-SXM4-80GB" in w and "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]" in w
    # what the host dispatched is still counted: its FLOPs come from the recorded shapes, not from time
    assert d["totals"]["flops"]["executed"] == 2 * M * K * N


def test_the_warning_is_in_the_terminal_headline_and_no_device_time_is_shown(tmp_path):
    out = run(write_doc(doc(), tmp_path / "gpu_cpu_only.json.gz"))
    line = headline_warning(out, "no device activity in this capture")
    assert "ProfilerActivity.CUDA" in line
    assert "MFU — (no attention —)   HFU —" in out
    assert "device time:" not in out and "loss budget" not in out


@pytest.mark.parametrize("extra", [
    pytest.param([{"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "pid": 100, "tid": 1, "ts": 700, "dur": 30,
                   "args": {"External id": 9}}], id="nccl-op"),
    pytest.param([{"ph": "X", "cat": "cpu_op", "name": "aten::record_stream", "pid": 100, "tid": 1, "ts": 700, "dur": 3,
                   "args": {"External id": 9}}], id="record_stream"),
    pytest.param([{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": 120, "dur": 5,
                   "args": {"correlation": 77, "External id": 3}}], id="launch"),
])
def test_a_device_named_by_its_ops_or_launches_alone_is_not_a_cpu_run(tmp_path, extra):
    d = report(write_doc(doc(devices=(), extra=extra), tmp_path / "t.json.gz"), "--peak-tflops", "1")
    assert_no_device_numbers(d)
    assert d["warnings"][0].startswith("no device activity in this capture")


def test_a_cpu_run_keeps_its_numbers(tmp_path):
    """The same host ops with no device named anywhere: a CPU trace, the ops are the work."""
    d = report(write_doc(doc(devices=()), tmp_path / "cpu.json.gz"), "--peak-tflops", "1")
    t = d["totals"]
    assert t["mfu"] is not None and t["hfu"] == pytest.approx(2 * M * K * N / (1000e-6 * 1e12))
    assert t["time_us"]["matmul"] == 380
    assert not any("no device activity" in w or "range-profiler" in w for w in d["warnings"])


def range_events(n: int) -> list[dict]:
    """CUPTI range-profiler events: one per profiled kernel, hardware counters as args, on no timeline of their own."""
    return [{"ph": "X", "cat": "cuda_profiler_range", "name": f"kernel_{i}", "pid": 0, "tid": 0, "ts": 100 + 10 * i, "dur": 5,
             "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 1000 * i,
                      "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": 0}} for i in range(n)]


def test_a_range_profiler_capture_says_what_it_holds(tmp_path):
    path = write_doc(doc(extra=range_events(5)), tmp_path / "ranges.json.gz")
    d = report(path)
    assert_no_device_numbers(d)
    assert d["warnings"][0].startswith("this is a CUPTI range-profiler capture: 5 profiled ranges with hardware counters, "
                                       "no kernel timeline; MFU/HFU need a trace with ProfilerActivity.CUDA")
    assert not any("unknown category" in w for w in d["warnings"])  # the events are recognised, not unknown
    headline_warning(run(path), "this is a CUPTI range-profiler capture: 5 profiled ranges")


# ------------------------------------------------------------------ the shared real traces


def test_a100_captured_with_cpu_activity_only(shared):
    path = shared / "kineto" / "a100_cpu_activity_only.json.gz"
    d = report(path)
    assert_no_device_numbers(d)
    w = d["warnings"][0]
    assert w.startswith("no device activity in this capture")
    assert "NVIDIA A100-PG509-200" in w and "nccl:all_to_all" in w and "aten::record_stream" in w
    assert "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]" in w
    assert d["model"]["band"] is None
    headline_warning(run(path), "no device activity in this capture")


def test_a100_cupti_range_profiler_capture(shared):
    path = shared / "kineto" / "a100_cupti_range_profiler.json.gz"
    d = report(path, *MODEL)  # a model given: MFU would be a number from the host's wall time
    assert_no_device_numbers(d)
    assert d["warnings"][0].startswith("this is a CUPTI range-profiler capture: 77 profiled ranges with hardware counters")
    assert not any("unknown category" in w for w in d["warnings"])
    headline_warning(run(path), "this is a CUPTI range-profiler capture: 77 profiled ranges")
