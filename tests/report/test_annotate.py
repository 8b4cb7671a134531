"""The annotated trace: every input event kept, kernels' args extended, phase tracks and counters added, secrets redacted."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import math

import click
import orjson
import pytest
from click.testing import CliRunner

from tests.builders import BF16, CPU, Builder, shared_fixtures, write_doc
from traceflops.core.errors import FormatError
from traceflops.core.redact import REDACTED
from traceflops.core.results import ModelOptions
from traceflops.export.perfetto import annotate, numbering
from traceflops.run.load import analyze
from traceflops.run.options import model_options

M, K, N = 48, 80, 24
SECRET = "hf_verySecretToken0042"
KEYS = ("traceflops.phase", "traceflops.class", "traceflops.flops", "traceflops.achieved_tflops")


def gpu_doc():
    """Forward and backward GEMMs, an optimizer kernel, plus events the parser skips before the kernels."""
    b = Builder()
    b.annotation("ProfilerStep#3", 50, 950)
    # events the parser does not number: no dur, an ignored category, an instant, a non-object
    b.events.append({"ph": "X", "cat": "kernel", "name": "no_dur", "pid": 0, "tid": 7, "ts": 60})
    b.events.append({"ph": "X", "cat": "python_function", "name": "fn", "pid": 100, "tid": 1, "ts": 61, "dur": 1})
    b.events.append({"ph": "i", "cat": "kernel", "name": "instant", "pid": 0, "tid": 7, "ts": 62, "s": "t"})
    b.events.append({"ph": "X", "cat": "kernel", "name": "negative", "pid": 0, "tid": 7, "ts": 63, "dur": -1})
    b.op("aten::mm", 100, 40, **{"Input Dims": [[M, K], [K, N]], "Input type": [BF16, BF16]})
    b.kernel("Memset (Device)", 102, 150, 2, cat="gpu_memset")
    b.kernel("sm90_gemm_fwd", 105, 160, 30)
    b.op("autograd::engine::evaluate_function: MmBackward0", 300, 100, tid=2)
    b.op("MmBackward0", 301, 98, tid=2)
    b.op("aten::mm", 310, 20, tid=2, **{"Input Dims": [[M, N], [N, K]], "Input type": [BF16, BF16]})
    b.kernel("sm90_gemm_bwd", 315, 400, 20, tid=2)
    b.op("aten::mm", 340, 20, tid=2, **{"Input Dims": [[K, M], [M, N]], "Input type": [BF16, BF16]})
    b.kernel("sm90_gemm_bwd", 345, 420, 20, tid=2, stream=8)  # another stream: its own track
    b.annotation("Optimizer.step#AdamW.step", 600, 100)
    b.op("aten::_foreach_add_", 610, 20)
    b.kernel("multi_tensor_apply_kernel", 612, 700, 20)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16", 620, 705, 40, stream=20)
    doc = b.doc()
    doc["metadata"] = {"env": {"HF_TOKEN": SECRET, "HOME": "/root"}, "experiment": {"repo_id": "x/y", "api_key": SECRET}}
    doc["traceName"] = "keep-me"
    return doc


def load(path):
    with gzip.open(path, "rb") as f:
        return json.loads(f.read())


@pytest.fixture
def gpu(tmp_path):
    doc = gpu_doc()
    src = write_doc(doc, tmp_path / "in.json.gz")
    a = analyze(src)
    out = tmp_path / "out" / "annotated.json.gz"
    out.parent.mkdir()
    summary = annotate(src, a, str(out))
    return doc, a, load(out), summary, out


def test_every_input_event_is_kept_with_only_args_added(gpu):
    doc, _a, got, summary, _ = gpu
    src = doc["traceEvents"]
    assert summary["events_in"] == len(src)
    assert len(got["traceEvents"]) == len(src) + summary["events_added"]
    for before, after in zip(src, got["traceEvents"]):
        assert {k: v for k, v in after.items() if k != "args"} == {k: v for k, v in before.items() if k != "args"}
        old, new = before.get("args") or {}, after.get("args") or {}
        assert {k: v for k, v in new.items() if not k.startswith("traceflops.")} == old
    assert got["traceName"] == "keep-me" and got["schemaVersion"] == doc["schemaVersion"]
    assert got["deviceProperties"] == doc["deviceProperties"]


def test_every_kernel_gets_phase_class_flops_and_rate(gpu):
    doc, a, got, summary, _ = gpu
    events = got["traceEvents"][: len(doc["traceEvents"])]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memset") and "traceflops.phase" in e.get("args", {})]
    assert len(device) == a.kernels.height == summary["kernels_annotated"]
    for e in device:
        assert set(KEYS) <= set(e["args"])
    by_name = {}
    for e in device:
        by_name.setdefault(e["name"], []).append(e["args"])
    fwd = by_name["sm90_gemm_fwd"][0]
    assert (fwd["traceflops.phase"], fwd["traceflops.class"], fwd["traceflops.flops"]) == ("forward", "matmul", 2 * M * K * N)
    assert fwd["traceflops.achieved_tflops"] == pytest.approx(2 * M * K * N / 30e-6 / 1e12)
    assert {x["traceflops.phase"] for x in by_name["sm90_gemm_bwd"]} == {"backward"}
    assert by_name["multi_tensor_apply_kernel"][0]["traceflops.phase"] == "optimizer"
    assert by_name["Memset (Device)"][0]["traceflops.class"] == "memset"
    assert by_name["Memset (Device)"][0]["traceflops.flops"] is None
    assert by_name["ncclDevKernel_AllReduce_Sum_bf16"][0]["traceflops.class"] == "communication"
    # events the parser skipped are untouched
    for e in events:
        if e.get("name") in ("no_dur", "fn", "instant", "negative"):
            assert not any(k.startswith("traceflops.") for k in e.get("args", {}))


def test_phase_tracks_and_counters(gpu):
    doc, a, got, summary, _ = gpu
    new = got["traceEvents"][len(doc["traceEvents"]):]
    pid = summary["pid"]
    assert all(e["pid"] == pid for e in new)
    assert pid not in {e.get("pid") for e in doc["traceEvents"]}
    names = {e["args"]["name"] for e in new if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("traceflops: forward") for n in names)
    assert any(n.startswith("traceflops: backward") for n in names)
    assert "traceflops: steps" in names
    assert {e["args"]["name"] for e in new if e["ph"] == "M" and e["name"] == "process_name"} == {"traceflops"}
    dup = [e for e in new if e["ph"] == "X" and "kernel_id" in e.get("args", {})]
    assert len(dup) == a.kernels.height
    # a track never holds overlapping slices (one track per phase and stream)
    by_tid = {}
    for e in dup:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(b[0] >= a_[1] for a_, b in itertools.pairwise(spans))
    counters = {e["name"] for e in new if e["ph"] == "C"}
    assert {"traceflops: achieved TFLOP/s", "traceflops: MFU %", "traceflops: HFU %"} <= counters
    rate = [e for e in new if e["ph"] == "C" and e["name"] == "traceflops: achieved TFLOP/s"]
    assert rate[-1]["args"]["TFLOP/s"] == 0.0
    peak = max(e["args"]["TFLOP/s"] for e in rate)
    assert peak == pytest.approx(2 * M * K * N / 20e-6 / 1e12)  # the backward GEMMs (20 µs each, one after the other)
    hfu = [e for e in new if e["ph"] == "C" and e["name"] == "traceflops: HFU %"]
    assert hfu[0]["args"]["HFU %"] == pytest.approx(a.steps["hfu"][0] * 100)
    for e in new:
        assert isinstance(e["ts"], (int, float))
        if e["ph"] == "X":
            assert e["dur"] >= 0


def test_secrets_are_redacted_and_the_file_is_gzipped_atomically(gpu):
    _doc, _a, got, summary, out = gpu
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert SECRET.encode() not in gzip.decompress(raw)
    assert got["metadata"]["env"] == {"HF_TOKEN": REDACTED, "HOME": REDACTED}
    assert got["metadata"]["experiment"] == {"repo_id": "x/y", "api_key": REDACTED}
    assert summary["redacted_values"] == 3 and got["traceflops"]["redacted_values"] == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["annotated.json.gz"]  # no temp file left


def test_the_critical_path_is_a_track_of_back_to_back_slices(gpu):
    doc, a, got, _summary, _ = gpu
    new = got["traceEvents"][len(doc["traceEvents"]):]
    tid = next(e["tid"] for e in new if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == "traceflops: critical path")
    path = sorted((e for e in new if e["ph"] == "X" and e["tid"] == tid), key=lambda e: e["ts"])
    window = a.steps.row(0, named=True)
    assert path[0]["ts"] == pytest.approx(window["start"]) and path[-1]["ts"] + path[-1]["dur"] == pytest.approx(window["start"] + window["window"])
    assert all(abs(p["ts"] + p["dur"] - q["ts"]) < 1e-6 for p, q in itertools.pairwise(path))  # back to back: followable in Perfetto
    kernel_names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    on_device = [e for e in path if e["args"]["traceflops.path_kind"].startswith(("device", "communication"))]
    assert on_device and all(e["name"].split(": ", 1)[1] in kernel_names for e in on_device)


def test_achieved_rate_sums_concurrent_kernels():
    from traceflops.export.perfetto.tracks import _achieved_counter

    # (ts, dur, TFLOP/s): two overlap on [5, 10), a third starts exactly when the first ends
    got = _achieved_counter([(0.0, 10.0, 2.0), (5.0, 10.0, 3.0), (10.0, 2.0, 1.0)])
    assert got == [(0.0, 2.0), (5.0, 5.0), (10.0, 4.0), (12.0, 3.0), (15.0, 0.0)]


def test_numbering_matches_the_parser(gpu):
    doc, a, *_ = gpu
    kernels, ops = numbering(doc["traceEvents"])
    assert [doc["traceEvents"][i]["name"] for i in kernels] == a.kernels.sort("kernel_id")["name"].to_list()
    assert [doc["traceEvents"][i]["name"] for i in ops] == a.ops.sort("op_id")["name"].to_list()


def test_annotated_trace_analyses_to_the_same_numbers(gpu, tmp_path):
    _doc, a, _got, _summary, out = gpu
    b = analyze(str(out))
    assert b.kernels.height == a.kernels.height
    assert b.totals["flops"] == a.totals["flops"] and b.totals["hfu"] == a.totals["hfu"]


def test_cpu_trace_gets_op_args_and_phase_tracks(tmp_path):
    src = CPU / "ns_ckpt_nonreentrant.json.gz"
    a = analyze(str(src), ModelOptions(peak_tflops=1))
    out = tmp_path / "cpu.json.gz"
    s = annotate(str(src), a, str(out))
    got = load(out)
    doc = load(src)
    assert got["traceEvents"][: len(doc["traceEvents"])] != doc["traceEvents"]  # args were added
    phases = {e["args"].get("traceflops.phase") for e in got["traceEvents"][: s["events_in"]] if e.get("cat") == "cpu_op"}
    assert {"forward", "backward", "recompute"} <= phases
    new = got["traceEvents"][s["events_in"]:]
    tracks = {e["args"]["name"] for e in new if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(t.startswith("traceflops: recompute") for t in tracks)
    assert any(e["ph"] == "C" and e["name"] == "traceflops: achieved TFLOP/s" for e in new)
    mm = [e for e in got["traceEvents"][: s["events_in"]] if e.get("args", {}).get("traceflops.ran")]
    assert sum(e["args"]["traceflops.flops"] for e in mm) == a.ops.filter(a.ops["matmul"] & a.ops["ran"])["flops"].sum()
    b = analyze(str(out), ModelOptions(peak_tflops=1))
    assert b.totals["loss_budget"] == a.totals["loss_budget"]


def test_plain_json_output_when_asked(tmp_path, gpu):
    doc, a, *_ = gpu
    src = write_doc(doc, tmp_path / "again.json.gz")
    out = tmp_path / "plain.json"
    annotate(src, a, str(out))
    assert json.loads(out.read_text())["traceEvents"]


def test_analysis_of_another_trace_is_refused(tmp_path, gpu):
    doc, a, *_ = gpu
    other = copy.deepcopy(doc)
    for e in other["traceEvents"]:
        if e.get("name") == "sm90_gemm_fwd":
            e["name"] = "renamed"
    src = write_doc(other, tmp_path / "other.json.gz")
    with pytest.raises(FormatError):
        annotate(src, a, str(tmp_path / "x.json.gz"))


def test_cli_annotate(tmp_path):
    from traceflops.cli.reports import annotate_cmd

    group = click.Group(commands={"annotate": annotate_cmd})
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    out = tmp_path / "o.json.gz"
    r = CliRunner().invoke(group, ["annotate", src, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "events kept" in r.output and out.exists()
    r = CliRunner().invoke(group, ["annotate", str(tmp_path / "missing.json.gz"), "-o", str(out)])
    assert r.exit_code == 2 and "no such file" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(group, ["annotate", src, "-o", str(tmp_path / "nodir" / "o.json.gz")])
    assert r.exit_code == 2 and "cannot write" in r.output


@pytest.mark.parametrize("name", ["h100_qwen_inference.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz"])
def test_real_traces(shared, tmp_path, name):
    src = str(shared / "kineto" / name)
    a = analyze(src)
    out = tmp_path / "a.json.gz"
    s = annotate(src, a, str(out))
    got = load(out)
    assert s["kernels_annotated"] == a.kernels.height
    marked = [e for e in got["traceEvents"][: s["events_in"]] if "traceflops.class" in (e.get("args") or {})]
    assert len(marked) == a.kernels.height
    for e in got["traceEvents"][s["events_in"]:]:
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    env = (got.get("metadata") or {}).get("system", {}).get("env")
    if env is not None:  # the H100 trace carries its environment (an HF token among it)
        assert env and set(env.values()) == {REDACTED}


# --- every shared real trace ---------------------------------------------------------------

SHARED_KINETO = sorted(str(p.relative_to(shared_fixtures() / "kineto")) for p in (shared_fixtures() / "kineto").glob("**/*.json.gz")) \
    if (shared_fixtures() / "kineto").is_dir() else ["(none)"]
STEP_COLS = ("step", "name", *[f"{k}_{p}" for p in ("forward", "backward", "recompute", "optimizer", "other") for k in ("flops", "count")],
             "flops_unknown_count", "flops_executed", "time_matmul", "time_other_compute", "time_memcpy", "time_communication_exposed",
             "time_idle", "time_communication_overlapped", "time_recompute")


def assert_chrome_trace(doc):
    """What chrome://tracing and Perfetto need of a JSON object trace."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert isinstance(e, dict) and isinstance(e.get("ph"), str), e
        if e.get("cat") == "traceflops" or e.get("pid") == doc["traceflops"]["pid"]:
            assert isinstance(e["name"], str) and isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
            assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int), e
            if e["ph"] == "X":
                assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            if e["ph"] in ("C", "M"):
                assert isinstance(e["args"], dict), e
            if e["ph"] == "C":
                assert all(isinstance(v, (int, float)) for v in e["args"].values()), e


def annotated(src, tmp_path):
    """The analysis of a shared trace, what annotate wrote (checked as a chrome trace), and its summary."""
    if not src.is_file():
        pytest.skip(f"no shared traces under {src.parent}")
    a = analyze(str(src))
    out = tmp_path / "annotated.json.gz"
    s = annotate(str(src), a, str(out))
    got = load(out)
    assert_chrome_trace(got)
    return a, out, got, s


@pytest.mark.parametrize("name", SHARED_KINETO)
def test_every_shared_trace_annotates_losslessly(shared, name, tmp_path):
    src = shared / "kineto" / name
    a, out, got, s = annotated(src, tmp_path)
    doc = load(src)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert s["events_in"] == len(events)
    assert len(got["traceEvents"]) == len(events) + s["events_added"]
    for before, after in zip(events, got["traceEvents"]):
        if not isinstance(before, dict):
            assert after == before
            continue
        for k in ("name", "ts", "dur", "ph", "cat", "pid", "tid"):
            assert after.get(k) == before.get(k), (k, before)
    captures = src.parent / "capture_traces"  # the graph captures found beside the source, given to its copy
    b = analyze(str(out), model_options(graph_captures=[str(captures)]) if captures.is_dir() else None)
    assert (b.kernels.height, b.ops.height, b.steps.height) == (a.kernels.height, a.ops.height, a.steps.height)
    assert b.steps.select(STEP_COLS).to_dicts() == a.steps.select(STEP_COLS).to_dicts()
    assert b.partition.to_dicts() == a.partition.to_dicts()
    for k in ("flops", "matmul_count", "matmul_flops_unknown_count", "time_us", "overlay_us", "wall_us"):
        assert b.totals[k] == a.totals[k], k


SHARED_XPLANE = sorted(p.name for p in (shared_fixtures() / "xplane").glob("*.xplane.pb")) \
    if (shared_fixtures() / "xplane").is_dir() else ["(none)"]


@pytest.mark.parametrize("name", SHARED_XPLANE)
def test_every_shared_xplane_annotates_to_a_valid_trace(shared, name, tmp_path):
    a, _, got, s = annotated(shared / "xplane" / name, tmp_path)
    for e in got["traceEvents"]:  # every event, not only the added ones: the whole trace is written anew
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int) and math.isfinite(e["ts"]), e
    ops = [e for e in got["traceEvents"][: s["events_in"]] if e["ph"] == "X" and "op_id" in e["args"]]
    assert len(ops) == a.ops.height == s["ops_annotated"]
    ran = a.ops.filter(a.ops["matmul"] & a.ops["ran"])
    assert sum(e["args"].get("traceflops.flops") or 0 for e in ops if e["args"].get("traceflops.ran")) == int(ran["flops"].fill_null(0).sum())
    phase = dict(a.ops.select("op_id", "phase").iter_rows())
    assert all(e["args"]["traceflops.phase"] == phase[e["args"]["op_id"]] for e in ops)


@pytest.mark.parametrize("name", ["h100_qwen_inference.json.gz", "v100_transformer_rank1.json.gz"])
def test_real_traces_streamed_in_small_arrays_write_the_same_trace(shared, tmp_path, monkeypatch, name):
    """Ids, args and redaction counts carry across arrays: 64 KiB at a time writes what one array per 2 MiB does."""
    from traceflops.export.perfetto import prepare as module

    src = str(shared / "kineto" / name)
    a = analyze(src)
    whole = annotate(src, a, str(tmp_path / "whole.json"))
    monkeypatch.setattr(module, "CHUNK", 64 << 10)
    small = annotate(src, a, str(tmp_path / "small.json"))
    assert (tmp_path / "small.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    assert {k: v for k, v in small.items() if k != "path"} == {k: v for k, v in whole.items() if k != "path"}
    written = orjson.loads((tmp_path / "small.json").read_bytes())["traceEvents"]
    marked = [e for e in written if "traceflops.class" in (e.get("args") or {}) and e.get("cat") != "traceflops"]
    assert len(marked) == a.kernels.height  # every device activity the parser read, found again in the trace


@pytest.mark.parametrize("kind", ["an op", "an event nothing numbers"])
def test_the_added_process_takes_no_pid_of_the_trace(tmp_path, kind):
    """The added tracks' process id is one no input event uses, entries written through as their bytes included."""
    doc = gpu_doc()
    taken = 0x7FFF0000  # the first id the added process would take
    if kind == "an op":
        doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": taken, "tid": 1, "ts": 800,
                                   "dur": 5, "args": {}})
    else:
        doc["traceEvents"].append({"ph": "X", "cat": "python_function", "name": "f", "pid": str(taken), "tid": 1,
                                   "ts": 800, "dur": 5})
    src = write_doc(doc, tmp_path / "in.json.gz")
    summary = annotate(src, analyze(src), str(tmp_path / "out.json.gz"))
    used = {e.get("pid") for e in doc["traceEvents"]}
    assert summary["pid"] not in used and str(summary["pid"]) not in used
