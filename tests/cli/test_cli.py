"""The command line: PaLM's published numbers, the JSON contract, and errors as one line."""

import json

from click.testing import CliRunner

from tests.builders import CPU
from traceflops.cli.main import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_mfu_reproduces_palm_540b():
    """PaLM (Chowdhery et al. 2022, §4.1 and appendix B): 238.3K tokens/s on 6144 TPU v4 chips at
    275 TFLOP/s give 45.7% MFU without attention and 46.2% with; 4.10 TFLOPs executed per token
    (rematerialization included) give 57.8% HFU."""
    r = run("mfu", "--tokens-per-second", 238.3e3, "--params", 540e9, "--layers", 118, "--heads", 48,
            "--head-dim", 256, "--seq-len", 2048, "--devices", 6144, "--peak-tflops", 275,
            "--executed-flops-per-token", 4.10e12, "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert round(d["mfu"] * 100, 1) == 46.2
    assert round(d["mfu_no_attention"] * 100, 1) == 45.7
    assert round(d["hfu"] * 100, 1) == 57.8
    assert d["band"] == "good"


def test_mfu_with_a_named_part_uses_its_dense_peak():
    r = run("mfu", "--tokens-per-second", 1e4, "--params", 7e9, "--layers", 32, "--heads", 32,
            "--head-dim", 128, "--seq-len", 4096, "--hardware", "h100-sxm", "--precision", "bf16", "--format", "json")
    d = json.loads(r.output)
    assert d["peak_flops"] == 989.4e12  # dense, not the 1,979 sparse headline
    per_token = 6 * 7e9 + 12 * 32 * 32 * 128 * 4096
    assert abs(d["mfu"] - 1e4 * per_token / 989.4e12) < 1e-12


def test_analyze_json_contract_keys():
    r = run("analyze", CPU / "ns_eager_sdpa.json.gz", "--format", "json", "--peak-tflops", 0.5)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["schema"] == "traceflops.report/1"
    for k in ("inputs", "hardware", "model", "steps", "ranks", "outside_steps", "totals", "warnings"):
        assert k in d
    t = d["totals"]
    for k in ("wall_us", "matmul_count", "flops", "flops_coverage", "matmul_flops_unknown_count", "mfu", "mfu_no_attention", "hfu"):
        assert k in t
    assert set(t["flops"]) == {"forward", "backward", "recompute", "optimizer", "other", "executed"}
    assert d["hardware"]["sparse"] is False and d["hardware"]["peak_flops"] == 0.5e12
    # trace-derived model FLOPs are forward + backward of the analysed steps
    assert d["model"]["source"] == "trace"
    s = d["steps"][0]
    assert s["model_flops"] == s["flops"]["forward"] + s["flops"]["backward"]


def test_analyze_with_flags_labels_the_model(tmp_path):
    r = run("analyze", CPU / "ns_eager_manual.json.gz", "--format", "json", "--peak-tflops", 0.5,
            "--params", 136320, "--layers", 2, "--heads", 4, "--head-dim", 20, "--seq-len", 24)
    d = json.loads(r.output)
    assert d["model"]["source"] == "flags" and d["model"]["mode"] == "training"
    assert d["model"]["band"] is None and "inference" in d["model"]["band_caveat"]  # no band against --peak-tflops


def test_analyze_grades_the_band_against_a_known_device_only():
    """A band graded against an arbitrary peak (--peak-tflops) says nothing: none; against a table device's, one."""
    args = ["analyze", CPU / "ns_eager_manual.json.gz", "--format", "json", "--params", 136320, "--layers", 2,
            "--heads", 4, "--head-dim", 20, "--seq-len", 24]
    arbitrary = json.loads(run(*args, "--peak-tflops", 0.5).output)["model"]
    known = json.loads(run(*args, "--hardware", "a100").output)["model"]
    assert arbitrary["band"] is None
    assert known["band"] is not None


def test_incomplete_model_flags_are_a_usage_error():
    r = CliRunner().invoke(main, ["analyze", str(CPU / "ns_eager_manual.json.gz"), "--params", "1e6"])
    assert r.exit_code == 2
    assert "--layers" in r.output


def test_missing_file_is_one_line_and_exit_2(tmp_path):
    r = CliRunner().invoke(main, ["analyze", str(tmp_path / "nope.json")])
    assert r.exit_code == 2
    assert "no such file" in r.output and "Traceback" not in r.output
