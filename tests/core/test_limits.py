"""What this process may use: cores within a cgroup CPU quota, memory within the system's available memory and a
cgroup memory limit, at its own cgroup and every ancestor's. Read from fake cgroup, /proc/self/cgroup and meminfo
files, so what this machine has changes nothing here."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflops.core.limits import available_memory, cgroup_cpus, usable_cores

GIB = 1 << 30
MIB = 1 << 20


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


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
