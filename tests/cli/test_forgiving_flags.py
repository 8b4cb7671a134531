"""Flags and inputs that forgive, or say why not: every case a one-line answer before (or instead of) a wrong report."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.builders import CPU, FIXTURES, Builder
from traceflops.cli.main import main
from traceflops.core.errors import EXIT_INPUT

CPU_TRACE = CPU / "ns_ckpt_nonreentrant.json.gz"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(r, code, *needles):
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def a100_trace(tmp_path):
    b = Builder(device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920,
                                    "computeMajor": 8, "computeMinor": 0, "numSms": 108}])
    b.annotation("ProfilerStep#0", 0, 900)
    b.op("aten::mm", 10, 50, **{"Input Dims": [[64, 32], [32, 16]], "Input type": ["c10::BFloat16"] * 2})
    b.kernel("ampere_bf16_s16816gemm", 20, 100, 30)
    return b.write(tmp_path / "a100.json.gz")


def test_an_unknown_hardware_is_exit_2_listing_the_known_names():
    line = one_line(run("analyze", CPU_TRACE, "--hardware", "foo", "--no-cache"), EXIT_INPUT, "unknown hardware 'foo'")
    assert "h100-sxm" in line and "a100" in line


def test_a_hardware_that_contradicts_the_trace_is_a_warning(tmp_path):
    r = run("analyze", a100_trace(tmp_path), "--hardware", "h100-sxm", "--format", "json", "--no-cache")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert "H100" in d["hardware"]["name"]  # as asked
    assert any("--hardware h100-sxm" in w and "A100" in w for w in d["warnings"]), d["warnings"]


def test_the_detected_hardware_says_nothing_when_it_agrees(tmp_path):
    r = run("analyze", a100_trace(tmp_path), "--hardware", "a100-sxm-80gb", "--format", "json", "--no-cache")
    assert r.exit_code == 0, r.stderr
    assert not any("--hardware" in w for w in json.loads(r.stdout)["warnings"])


def test_an_excluded_step_that_does_not_exist_is_said_and_counts_reflect_exclusions():
    r = run("analyze", CPU_TRACE, "--peak-tflops", 1, "--exclude-step", 99, "--exclude-step", 1, "--format", "json", "--no-cache")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert any("--exclude-step 99" in w and "no such step" in w for w in d["warnings"]), d["warnings"]
    assert d["totals"]["step_count"] == {"in_trace": 2, "excluded": [1], "counted": 1}
    # The totals are the other step's alone (steps 1 and 2 in this trace).
    kept = [s for s in d["steps"] if s["step"] != 1]
    assert d["totals"]["flops"]["executed"] == sum(s["flops"]["executed"] for s in kept)


def test_html_into_a_folder_that_cannot_be_made_fails_before_the_analysis(tmp_path, monkeypatch):
    """A missing folder is made (as --tables makes its own); one under a file cannot be, and is refused up front."""
    import traceflops.run.load

    def parse(*args, **kwargs):
        raise AssertionError("the trace was parsed before the output folder was refused")

    monkeypatch.setattr(traceflops.run.load, "parse", parse)
    (tmp_path / "file").write_text("x")
    one_line(run("analyze", FIXTURES / "hf" / "gpt2.json.gz", "--html", tmp_path / "file" / "no" / "r.html", "--no-cache"),
             EXIT_INPUT, "is not a folder")


def test_an_unreachable_ray_cluster_is_exit_2():
    pytest.importorskip("ray")
    one_line(run("analyze", FIXTURES / "dist" / "ddp", "--executor", "ray", "--ray-address", "auto", "--no-cache", "--quiet"),
             EXIT_INPUT, "cannot reach the Ray cluster")


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "[::1]:1"])
def test_an_explicit_cluster_address_nobody_answers_on_is_exit_2_at_once(address, monkeypatch):
    """Ray retries such an address for minutes; nothing listens on port 1, so the connection is refused before Ray is
    asked (a Ray that is asked fails the test)."""
    import sys
    import types

    asked = []

    def init(*args, **kwargs):
        asked.append(kwargs)
        raise ConnectionError("retried for minutes")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init, is_initialized=lambda: False))
    one_line(run("analyze", FIXTURES / "dist" / "ddp", "--executor", "ray", "--ray-address", address, "--no-cache", "--quiet"),
             EXIT_INPUT, "cannot reach the Ray cluster")
    assert not asked
