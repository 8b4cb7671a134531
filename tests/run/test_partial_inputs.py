"""Partial inputs say so: a cut file in the headline, never zeros as a result; a folder's other files named, graph
captures kept out of a job's ranks; the unbounded last step shown but left out of the totals."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

from tests.builders import BF16, Builder, shapes
from traceflops.cli.main import main
from traceflops.run.inputs import expand_with_warnings
from traceflops.run.load import analyze
from traceflops.run.options import model_options


def _gpu_step(b: Builder, t0: float) -> None:
    b.annotation(f"ProfilerStep#{int(t0 // 1000)}", t0, 900)
    b.op("aten::mm", t0 + 10, 50, **shapes([[64, 48], [48, 80]], [BF16, BF16]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", t0 + 20, t0 + 100, 40)


def _cut_before_kernels(tmp_path) -> str:
    """A GPU trace whose file ends before its device events: Kineto writes host events first."""
    b = Builder()
    for t in (1000, 2000):
        _gpu_step(b, t)
    host = [e for e in b.events if e["cat"] != "kernel"]
    device = [e for e in b.events if e["cat"] == "kernel"]
    text = json.dumps({"schemaVersion": 1, "deviceProperties": b.device_properties, "traceEvents": host + device})
    cut = text[: text.index(json.dumps(device[0]))]  # ends after the last host event's comma
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(cut.encode()))
    return str(path)


def test_a_file_cut_before_its_kernels_says_so_and_reports_no_zeros(tmp_path):
    path = _cut_before_kernels(tmp_path)
    a = analyze(path)
    t = a.totals
    assert t["mfu"] is None and t["hfu"] is None
    assert any(w.startswith("the file is cut") for w in a.warnings)
    assert any("the file is cut before its device activity" in w for w in a.warnings)
    r = CliRunner().invoke(main, ["analyze", path, "--no-cache"])
    assert r.exit_code == 0
    # in the headline, before any number (piped output wraps at the width: the lines before the MFU line, joined)
    head = " ".join(r.stdout.split("\nMFU ")[0].splitlines())
    assert "the file is cut" in head, head


def test_a_cut_file_whose_steps_hold_no_matmul_reports_unknown_not_zero(tmp_path, shared):
    """Half of a real GPU trace's gzip stream: the step it keeps ran no matmul the file still holds."""
    raw = (shared / "kineto" / "a100_ddp_resnet_rank0.json.gz").read_bytes()
    path = tmp_path / "half.json.gz"
    path.write_bytes(raw[: len(raw) // 2])
    a = analyze(str(path))
    assert a.steps.height >= 1 and a.totals["flops"]["executed"] == 0
    assert a.totals["mfu"] is None and a.totals["hfu"] is None  # was MFU 0.0%, "band: likely broken"
    assert any("hold no matmul FLOP" in w for w in a.warnings)


def test_a_folder_names_what_it_leaves_out(tmp_path):
    b = Builder()
    _gpu_step(b, 1000)
    b.write(tmp_path / "rank0.json.gz")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "data.csv").write_text("a,b")
    (tmp_path / "capture_traces").mkdir()
    b.write(tmp_path / "capture_traces" / "graph_capture_rank_0.json.gz")
    (tmp_path / "capture_traces" / "execution_details.json").write_text("[]")
    found, warnings = expand_with_warnings([str(tmp_path)])
    assert found == [str(tmp_path / "rank0.json.gz")]  # the captures are not ranks
    assert any("2 file(s) that are not traces left out (data.csv, notes.txt)" in w for w in warnings)
    assert any("capture_traces" in w and "not ranks" in w for w in warnings)


def test_a_folder_mixing_formats_says_so(tmp_path, shared):
    shutil.copy(shared / "xplane" / "mi300_jax_gemm.xplane.pb", tmp_path)
    shutil.copy(shared / "kineto" / "mi250_toy_train.json.gz", tmp_path)
    found, warnings = expand_with_warnings([str(tmp_path)])
    assert len(found) == 2
    assert any("mixes 1 XLA profile(s) and 1 Kineto trace(s)" in w for w in warnings)


def _first_kernel_per_step(path) -> dict[str, float]:
    """Independently of the tool: each ProfilerStep's earliest device activity launched inside its host span."""
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")
             and e.get("cat") in ("user_annotation", "Operator", "cpu_op")]
    launch = {}
    for e in events:
        args = e.get("args") or {}
        corr = args.get("correlation")
        if corr is not None and e.get("cat") in ("cuda_runtime", "Runtime"):
            launch[corr] = e["ts"]
    first: dict[str, float] = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset") and args.get("correlation") in launch:
            t = launch[args["correlation"]]
            for name, lo, hi in steps:
                if lo <= t <= hi:
                    first[name] = min(first.get(name, e["ts"]), e["ts"])
    return first


def test_the_last_step_is_shown_but_left_out_of_the_totals(shared):
    path = shared / "kineto" / "v100_resnet50_legacy2021.json.gz"
    first = _first_kernel_per_step(path)
    a = analyze(str(path))
    names = a.steps["name"].to_list()
    assert names[-1] == "ProfilerStep#10" and a.steps["last"].to_list()[-1]
    # the totals cover steps 5..9: from step 5's first device activity to step 10's
    assert a.totals["wall_us"] == pytest.approx(first["ProfilerStep#10"] - first["ProfilerStep#5"], abs=0.01)
    assert a.totals["step_count"]["excluded"] == [10] and a.totals["step_count"]["counted"] == 5
    assert any("the last" in w and "left out of the totals" in w for w in a.warnings)
    # kept on request
    k = analyze(str(path), model_options(keep_last_step=True))
    assert k.totals["step_count"]["counted"] == 6 and k.totals["mfu"] > a.totals["mfu"]


def test_a_single_step_is_never_left_out(tmp_path):
    b = Builder()
    _gpu_step(b, 1000)
    a = analyze(b.write(tmp_path / "one.json.gz"))
    assert a.totals["step_count"]["counted"] == 1 and a.totals["hfu"] is not None
