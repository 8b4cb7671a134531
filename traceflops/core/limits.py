"""What this process may use of the machine: its cores (CPU affinity, within a cgroup CPU quota) and the memory it may
still take (the system's available memory, within a cgroup memory limit).

A container's limits are what it may use, not the host's cores and memory: a
container given 4 CPUs on a 128-core host has 4. Linux cgroup v2 and v1 are
read, at the process's own cgroup and every ancestor's; elsewhere, the cores
and the free physical memory. Plain file reads: no polars, nothing of
traceflops.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")
_OWN = Path("/proc/self/cgroup")


def usable_cores(cgroup: Path = _CGROUP, own: Path = _OWN) -> int:
    """The cores this process may run on (its affinity), within its cgroup's CPU quota where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        n = os.cpu_count() or 1
    quota = cgroup_cpus(cgroup, own)
    return max(1, min(n, quota) if quota is not None else n)


def cgroup_cpus(cgroup: Path = _CGROUP, own: Path = _OWN) -> int | None:
    """The tightest CPU quota of this process's cgroup and its ancestors, in whole cores rounded up (v2 `cpu.max`, v1
    `cpu.cfs_quota_us`); None where none is set or none can be read."""
    quotas = []
    for folder in _folders(cgroup, own, None):
        parts = (_read(folder / "cpu.max") or "").split()
        if len(parts) == 2 and parts[0] != "max":
            quotas.append(_cores(parts[0], parts[1]))
    for folder in _folders(cgroup, own, "cpu"):
        quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota is not None and period is not None and quota.strip() != "-1":
            quotas.append(_cores(quota, period))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def available_memory(cgroup: Path = _CGROUP, own: Path = _OWN, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes this process may still take: the system's available memory, or less where the limit of its cgroup or of
    one of its ancestors leaves less; None where neither can be read."""
    got = []
    text = _read(meminfo)
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            got.append(int(line.split()[1]) * 1024)
    if text is None and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            got.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    left = [_left(f / "memory.max", f / "memory.current") for f in _folders(cgroup, own, None)]
    left += [_left(f / "memory.limit_in_bytes", f / "memory.usage_in_bytes") for f in _folders(cgroup, own, "memory")]
    got += [x for x in left if x is not None]
    return min(got) if got else None


def _left(limit: Path, used: Path) -> int | None:
    a, b = (_read(limit) or "").strip(), (_read(used) or "").strip()
    return max(0, int(a) - int(b)) if a.isdigit() and b.isdigit() else None


def _folders(cgroup: Path, own: Path, controller: str | None) -> list[Path]:
    """Where limits on this process are written for `controller` (None: cgroup v2's one hierarchy): its own cgroup's
    folder as `own` (`/proc/self/cgroup`) names it, each ancestor's, and the hierarchy's root (what a container with
    its own cgroup namespace sees there)."""
    base = cgroup if controller is None else cgroup / controller
    found = []
    for line in (_read(own) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        mine = names == "" if controller is None else controller in names.split(",")
        steps = [p for p in path.split("/") if p]
        if hierarchy and mine and path.startswith("/"):
            found += [base.joinpath(*steps[:i]) for i in range(len(steps), 0, -1)]
    return [*found, base]


def _cores(quota: str, period: str) -> int | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None
