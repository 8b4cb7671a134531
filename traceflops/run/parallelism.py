"""How many ranks a job analyses at once when the user leaves it to the tool (`--jobs auto`, the default): a process
per usable core, no more processes than ranks, and no more than the available memory holds at the largest rank's
estimated peak.

Light on purpose (no polars): the command decides before polars loads, because a job's processes each run polars on
one thread, a setting read as polars loads. Linux's cgroup limits count (a container's CPU quota and memory limit
are what it may use, not the host's cores and memory); elsewhere, the cores and the free physical memory.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path

from traceflops.core.errors import OptionsError
from traceflops.parsers.io import estimated_json_bytes
from traceflops.run.options import BOUNDS, bounds_text, check_number

AUTO = "auto"
MAX_JOBS = int(BOUNDS["jobs"][2])  # the most `--jobs` itself takes
# A rank's process at its peak, estimated high: its imports and what it keeps between ranks (~80 MiB measured: 54 MiB
# anonymous, 26 MiB of mapped libraries), plus its parse and analysis (0.7-1.25 times the rank's JSON measured, from a
# 48 MB rank to a 2 GB trace).
PROCESS_BYTES = 128 << 20
PEAK_PER_JSON_BYTE = 1.25
MEMORY_SHARE = 0.8  # of what is available: the rest left to the page cache and whatever else runs
_CGROUP = Path("/sys/fs/cgroup")
_OWN = Path("/proc/self/cgroup")


def jobs_for(jobs: int | str, paths: Sequence[str], local: bool = True) -> int:
    """`jobs` as the user gave it (`auto`, or a whole number within `--jobs`' bounds) as a count of processes; `local`
    False (ranks sent elsewhere, as Ray tasks) makes auto one. OptionsError for anything else."""
    if jobs == AUTO:
        return auto_jobs(paths) if local else 1
    if isinstance(jobs, str):
        raise OptionsError(
            None, f"--jobs (jobs) must be {AUTO} or {bounds_text('jobs')}, got {jobs!r}", "give --jobs one of those"
        )
    check_number("jobs", jobs)
    return int(jobs)


def auto_jobs(paths: Sequence[str], cores: int | None = None, available: int | None = None) -> int:
    """The processes for a job of `paths` (`cores` and `available` bytes of memory: this machine's where None).

    One inside a process that multiprocessing started (a pool's worker): what started it already spreads the work
    over the cores.
    """
    n = min(usable_cores() if cores is None else cores, len(paths), MAX_JOBS)
    if n <= 1 or multiprocessing.parent_process() is not None:
        return 1
    free = available_memory() if available is None else available
    if free is None:
        return n
    largest = max((estimated_json_bytes(p) for p in paths if "://" not in p), default=0)
    each = PROCESS_BYTES + PEAK_PER_JSON_BYTE * largest
    return max(1, min(n, int(MEMORY_SHARE * free // each)))


def usable_cores(cgroup: Path = _CGROUP, own: Path = _OWN) -> int:
    """The cores this process may run on (its affinity), within its cgroup's CPU quota where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
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
