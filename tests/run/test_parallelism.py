"""`--jobs auto`: no more processes than the cores (given), the ranks, and what the available memory (given) holds at
the largest rank's estimated peak; one inside a pool's worker; the command's and the API's reading of `--jobs`. What
this process may use is `core.limits`' (tests/core/test_limits.py), so what this machine has changes nothing here."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceflops.cli.common import Progress
from traceflops.cli.main import main
from traceflops.run.parallelism import auto_jobs

GIB = 1 << 30
MIB = 1 << 20


def _sparse(path: Path, size: int, head: bytes = b"{") -> str:
    """A file of `size` bytes that takes no disk (its size is all the estimate reads, with its first two bytes)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


def test_no_more_processes_than_ranks_or_cores(tmp_path):
    ranks = [_sparse(tmp_path / f"r{i}.json", 1 * MIB) for i in range(3)]
    assert auto_jobs(ranks, cores=8, available=64 * GIB) == 3
    assert auto_jobs(ranks, cores=2, available=64 * GIB) == 2
    assert auto_jobs(ranks[:1], cores=8, available=64 * GIB) == 1


def test_one_process_inside_a_pool_s_worker(tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ranks = [_sparse(tmp_path / f"r{i}.json", MIB) for i in range(3)]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:  # no fork of threads
        assert pool.submit(auto_jobs, ranks, 8, 64 * GIB).result() == 1
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(auto_jobs, (ranks, 8, 64 * GIB)) == 1
    assert auto_jobs(ranks, cores=8, available=64 * GIB) == 3


def test_memory_bounds_the_processes_at_the_largest_ranks_peak(tmp_path):
    # Four ranks, the largest 1 GiB of JSON: each process is estimated at 128 MiB + 1.25 GiB, about 1.375 GiB. Of 4 GiB
    # available, four fifths (3.2 GiB) hold two such processes, not three; of 64 GiB, all four.
    ranks = [_sparse(tmp_path / f"r{i}.json", size) for i, size in enumerate([GIB, MIB, MIB, MIB])]
    assert auto_jobs(ranks, cores=16, available=4 * GIB) == 2
    assert auto_jobs(ranks, cores=16, available=3 * GIB) == 1  # four fifths of 3 GiB, 2.4 GiB, hold one
    assert auto_jobs(ranks, cores=16, available=64 * GIB) == 4
    assert auto_jobs(ranks, cores=16, available=100 * MIB) == 1  # too little for even one: still one


def test_a_gzipped_rank_is_estimated_at_eight_times_its_size(tmp_path):
    # 128 MiB gzipped is ~1 GiB of JSON: the same two processes of 4 GiB as above; named .json, it is read as gzip by
    # its first bytes, as the parser reads it
    ranks = [_sparse(tmp_path / "r0.json", 128 * MIB, b"\x1f\x8b"), _sparse(tmp_path / "r1.json", MIB)]
    assert auto_jobs(ranks * 2, cores=16, available=4 * GIB) == 2
    plain = [_sparse(tmp_path / "p0.json", 128 * MIB), ranks[1]]
    assert auto_jobs(plain * 2, cores=16, available=4 * GIB) == 4


def test_a_remote_or_missing_rank_adds_only_a_process_s_own_memory(tmp_path):
    ranks = ["s3://bucket/rank0.json.gz", str(tmp_path / "gone.json")]
    assert auto_jobs(ranks, cores=8, available=GIB) == 2


def test_jobs_takes_auto_or_a_whole_number(tmp_path):
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "--jobs", "two"])
    assert r.exit_code == 2
    assert "'two' is neither auto nor a whole number" in r.output
    for args in (["--jobs", "0"], ["--pipeline-stages", "-1"]):  # out of range: said before the empty folder is
        r = CliRunner().invoke(main, ["analyze", str(tmp_path), *args])
        assert r.exit_code == 2 and "must be" in r.output and "no trace files" not in r.output, r.output
    assert "[default: auto]" in CliRunner().invoke(main, ["analyze", "--help"]).output


def test_the_ranks_line_says_how_many_run_at_once(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = Progress(quiet=False)
    progress.on, progress.at_once = True, 2
    progress.ranks(3, 8)
    assert err.getvalue().endswith("ranks: 3/8, 2 at a time")
    progress.at_once = 1
    progress.ranks(4, 8)
    assert err.getvalue().endswith("ranks: 4/8")


@pytest.mark.parametrize("jobs", ["two", 0, 1025, 2.0, True])
def test_the_api_takes_auto_or_a_whole_number_too(tmp_path, jobs):
    from traceflops.api import analyze_job
    from traceflops.core.errors import OptionsError

    ranks = [_sparse(tmp_path / f"r{i}.json", MIB) for i in range(2)]
    with pytest.raises(OptionsError, match=r"--jobs \(jobs\) must be"):
        analyze_job(ranks, jobs=jobs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptionsError, match=r"--jobs \(jobs\) must be"):  # before the folder is looked into
        analyze_job(tmp_path / "empty", jobs=jobs)
