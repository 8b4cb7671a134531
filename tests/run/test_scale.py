"""Per-rank summaries that merge, the parse cache, and ranks on a local Ray instance."""

import json
import os

import pytest
from click.testing import CliRunner

from tests.builders import RANKS, rank_traces
from traceflops.cli.main import main
from traceflops.run.load import load
from traceflops.storage import trace_cache as cache


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def strip_paths(rep):
    rep = json.loads(rep)
    rep.pop("inputs")
    for r in rep["ranks"]:
        r.pop("path")
    return rep


@pytest.fixture
def ranks(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    return rank_traces(d), d


def test_merged_summaries_equal_the_job_analysed_at_once(ranks, tmp_path):
    files, d = ranks
    sums = []
    for f in files:
        out = tmp_path / (os.path.basename(f) + ".tfsum")
        cli("summarize", f, "-o", out, "--no-cache")
        sums.append(out)
    merged = strip_paths(cli("merge", *sums, "--format", "json"))
    direct = strip_paths(cli("analyze", d, "--format", "json", "--no-cache"))
    assert merged == direct
    assert [s["rank"] for s in merged["stragglers"]] == [RANKS.SLOW, RANKS.SLOW]


def test_a_damaged_summary_is_one_clean_error(tmp_path):
    bad = tmp_path / "x.tfsum"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    r = CliRunner().invoke(main, ["merge", str(bad)])
    assert r.exit_code == 3 and "Traceback" not in r.output
    assert "summary" in r.output or "bundle" in r.output


def test_cache_hit_gives_the_same_tables_and_a_changed_file_misses(ranks, tmp_path):
    files, _ = ranks
    cdir = tmp_path / "cache"
    first = load(files[0], cdir)
    assert len(list(cdir.glob("*.tfcache"))) == 1
    again = load(files[0], cdir)
    for t in cache.TABLES:
        assert getattr(again, t).equals(getattr(first, t)), t
    assert again.meta["rank"] == first.meta["rank"] and again.warnings.counts == first.warnings.counts
    k1 = cache.key(files[0])
    os.utime(files[0], ns=(1, 1))  # mtime changes: a new key
    assert cache.key(files[0]) != k1


def test_ranks_on_a_local_ray_instance(ranks):
    ray = pytest.importorskip("ray", reason="Ray is the optional extra traceflops[ray]")
    files, d = ranks
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        via_ray = strip_paths(cli("analyze", d, "--format", "json", "--executor", "ray", "--no-cache"))
    finally:
        ray.shutdown()
    local = strip_paths(cli("analyze", d, "--format", "json", "--no-cache"))
    assert via_ray == local


def test_dlrm_same_report_sequential_parallel_merged_and_on_ray(shared, tmp_path):
    """dlrm_8rank: --jobs 2, --jobs auto (the default), summarize + merge, and --executor ray give the sequential
    report."""
    d = shared / "kineto" / "dlrm_8rank"
    seq = strip_paths(cli("analyze", d, "--format", "json", "--no-cache", "--jobs", "1"))
    assert strip_paths(cli("analyze", d, "--format", "json", "--no-cache", "--jobs", "2")) == seq
    assert strip_paths(cli("analyze", d, "--format", "json", "--no-cache")) == seq
    sums = []
    for f in sorted(d.glob("rank*.json.gz")):
        out = tmp_path / (f.name + ".tfsum")
        cli("summarize", f, "-o", out, "--no-cache")
        sums.append(out)
    assert strip_paths(cli("merge", *sums, "--format", "json")) == seq
    ray = pytest.importorskip("ray", reason="Ray is the optional extra traceflops[ray]")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        assert strip_paths(cli("analyze", d, "--format", "json", "--no-cache", "--executor", "ray")) == seq
    finally:
        ray.shutdown()


@pytest.mark.parametrize("fmt", ["json", "terminal"])
def test_the_same_command_again_renders_the_kept_report(shared, tmp_path, fmt):
    """Fresh and kept reports are the same; other options are analysed afresh, not served from the kept one."""
    trace = shared / "kineto" / "a100_ddp_resnet_rank0.json.gz"
    cdir = tmp_path / "cache"
    fresh = cli("analyze", trace, "--format", fmt, "--no-cache")
    cli("analyze", trace, "--format", fmt, "--cache-dir", cdir)
    assert len(list(cdir.glob("*.tfreport"))) == 1
    kept = cli("analyze", trace, "--format", fmt, "--cache-dir", cdir)
    if fmt == "json":
        a, b = json.loads(fresh), json.loads(kept)
        assert a.keys() == b.keys()
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or _close(a, b)
    else:
        assert kept == fresh
    other = cli("analyze", trace, "--format", "json", "--cache-dir", cdir, "--peak-tflops", "100")
    assert json.loads(other)["hardware"]["peak_flops"] == 100e12
    assert len(list(cdir.glob("*.tfreport"))) == 2


def _close(a, b, rel=1e-12):
    """Equal up to the last bits of floats summed in parallel (polars' sum order varies between runs)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= rel * max(1.0, abs(a))
    return a == b
