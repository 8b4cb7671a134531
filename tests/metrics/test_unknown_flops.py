"""Unknown FLOPs read as unknown (null) in every row, never as 0: per step, in the totals, and for a job."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.builders import Builder
from traceflops.cli.main import main


def shapeless(path, rank: int):
    """Two steps of a GEMM recorded without shapes (record_shapes=False): its FLOPs cannot be known."""
    b = Builder(distributed={"rank": rank, "world_size": 2})
    for s in range(2):
        t = 1000.0 * s
        b.annotation(f"ProfilerStep#{s}", t, 900)
        b.op("aten::mm", t + 10, 50)
        b.kernel("ampere_bf16_s16816gemm_128x128", t + 20, t + 100, 30)
    return b.write(path)


def report(*paths) -> dict:
    r = CliRunner().invoke(main, ["analyze", *map(str, paths), "--format", "json", "--no-cache", "--quiet"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_step_whose_matmul_flops_are_unknown_has_no_hfu(tmp_path):
    d = report(shapeless(tmp_path / "t.json.gz", 0))
    assert d["totals"]["hfu"] is None
    assert [s["hfu"] for s in d["steps"]] == [None, None]


def test_a_job_where_no_rank_knows_its_flops_has_no_hfu(tmp_path):
    d = report(shapeless(tmp_path / "rank0.json.gz", 0), shapeless(tmp_path / "rank1.json.gz", 1))
    assert d["totals"]["hfu"] is None
    assert all(s["hfu"] is None for s in d["job_steps"])
    assert all(s["hfu"] is None for s in d["steps"])


def test_a_diff_against_a_trace_without_shapes_says_unknown_not_zero(tmp_path):
    from tests.cli.test_bad_input import small_gpu_trace

    before = shapeless(tmp_path / "before.json.gz", 0)
    after = small_gpu_trace().write(tmp_path / "after.json.gz")  # 2 steps of a 64x32x16 mm: 2*64*32*16 FLOPs each
    r = CliRunner().invoke(main, ["diff", before, after, "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["flops_per_step"]["executed"] == {"before": None, "after": 2 * 64 * 32 * 16, "delta": None}
    assert d["largest_change"] is None
    assert any("unknown before" in w for w in d["warnings"]), d["warnings"]


def device_only(path):
    """Two steps of GEMM kernels and no host event at all (a device-only capture): no shape, so no FLOP is known."""
    b = Builder()
    for s in range(2):
        b.kernel("ampere_bf16_s16816gemm_128x128", 1000.0 * s + 20, 1000.0 * s + 100, 30)
    return b.write(path)


def test_a_diff_of_device_only_traces_says_unknown_not_zero(tmp_path):
    before, after = device_only(tmp_path / "before.json.gz"), device_only(tmp_path / "after.json.gz")
    assert report(before)["totals"]["hfu"] is None
    r = CliRunner().invoke(main, ["diff", before, after, "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["flops_per_step"]["executed"] == {"before": None, "after": None, "delta": None}
