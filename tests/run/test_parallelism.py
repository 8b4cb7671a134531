"""`--jobs auto`: a process per usable core (a cgroup's CPU quota counts), no more than the ranks, and no more than the
available memory holds at the largest rank's estimated peak. The limits are read from fake cgroup and meminfo files,
so what this machine has changes nothing here."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceflops.cli.common import Progress
from traceflops.cli.main import main
from traceflops.run.parallelism import auto_jobs, available_memory, cgroup_cpus, usable_cores

GIB = 1 << 30
MIB = 1 << 20


def _sparse(path: Path, size: int, head: bytes = b"{") -> str:
    """A file of `size` bytes that takes no disk (its size is all the estimate reads, with its first two bytes)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


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


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # v2: 1.5 cores, rounded up
        ({"cpu.max": "max 100000\n"}, None),  # v2: no quota
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1: no quota
        ({}, None),  # no cgroup files at all (not Linux, or not mounted)
    ],
)
def test_a_cgroup_cpu_quota_in_whole_cores(tmp_path, files, cores):
    own = _tree(tmp_path, {"self": "0::/\n"}) / "self"
    assert cgroup_cpus(_tree(tmp_path / "cg", files), own) == cores


def test_the_tightest_quota_of_the_process_s_cgroup_and_its_ancestors(tmp_path):
    root = _tree(tmp_path / "cg", {"cpu.max": "400000 100000\n", "kube/pod1/cpu.max": "100000 100000\n"})
    own = _tree(tmp_path, {"self": "0::/kube/pod1\n"}) / "self"
    assert cgroup_cpus(root, own) == 1  # its own, under the root's 4
    # a pod's limit on the pod's cgroup, none on the container's own inside it: the pod's counts
    nested = _tree(tmp_path / "nest", {"kube/pod2/cpu.max": "200000 100000\n", "kube/pod2/ctr/cpu.max": "max 100000\n"})
    own2 = _tree(tmp_path, {"self2": "0::/kube/pod2/ctr\n"}) / "self2"
    assert cgroup_cpus(nested, own2) == 2
    v1 = _tree(tmp_path / "v1", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
                                 "cpu/pod/cpu.cfs_quota_us": "400000\n", "cpu/pod/cpu.cfs_period_us": "100000\n"})
    own1 = _tree(tmp_path, {"self1": "4:memory:/other\n3:cpu,cpuacct:/pod\n0::/\n"}) / "self1"
    assert cgroup_cpus(v1, own1) == 4
    assert usable_cores(root, own) == 1  # whatever this machine's cores, the quota of one bounds them


def test_available_memory_is_the_least_of_the_system_s_and_the_cgroup_s(tmp_path):
    meminfo = _tree(tmp_path, {"meminfo": "MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n"}) / "meminfo"
    none = _tree(tmp_path, {"self": ""}) / "self"
    assert available_memory(tmp_path / "empty", none, meminfo) == 4 * GIB
    v2 = _tree(tmp_path / "v2", {"memory.max": f"{3 * GIB}\n", "memory.current": f"{GIB}\n"})
    assert available_memory(v2, none, meminfo) == 2 * GIB
    unlimited = _tree(tmp_path / "v2max", {"memory.max": "max\n", "memory.current": f"{GIB}\n"})
    assert available_memory(unlimited, none, meminfo) == 4 * GIB
    v1 = _tree(tmp_path / "v1", {"memory/app/memory.limit_in_bytes": f"{GIB}\n",
                                 "memory/app/memory.usage_in_bytes": f"{256 * MIB}\n",
                                 "memory/memory.limit_in_bytes": "9223372036854771712\n",
                                 "memory/memory.usage_in_bytes": f"{GIB}\n"})
    own = _tree(tmp_path, {"self1": "4:memory:/app\n0::/\n"}) / "self1"
    assert available_memory(v1, own, meminfo) == 768 * MIB  # its own cgroup's limit, not the root's
    parent = _tree(tmp_path / "v2p", {"pod/memory.max": f"{2 * GIB}\n", "pod/memory.current": f"{GIB + 512 * MIB}\n",
                                      "pod/ctr/memory.max": f"{3 * GIB}\n", "pod/ctr/memory.current": f"{GIB}\n"})
    own2 = _tree(tmp_path, {"self2": "0::/pod/ctr\n"}) / "self2"
    # the container's own limit leaves 2 GiB, its pod's 512 MiB (its siblings counted): the tighter one
    assert available_memory(parent, own2, meminfo) == 512 * MIB


def test_no_meminfo_falls_back_to_free_pages_else_unknown(tmp_path, monkeypatch):
    none = _tree(tmp_path, {"self": ""}) / "self"
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr("os.sysconf", pages.__getitem__)
    assert available_memory(tmp_path / "empty", none, tmp_path / "no-meminfo") == 1000 * 4096

    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr("os.sysconf", unknown)
    assert available_memory(tmp_path / "empty", none, tmp_path / "no-meminfo") is None


def test_jobs_takes_auto_or_a_whole_number(tmp_path):
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "--jobs", "two"])
    assert r.exit_code == 2
    assert "'two' is neither auto nor a whole number" in r.output
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
