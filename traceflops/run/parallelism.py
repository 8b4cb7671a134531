"""How many ranks a job analyses at once when the user leaves it to the tool (`--jobs auto`, the default): a process
per usable core, no more processes than ranks, and no more than the available memory holds at the largest rank's
estimated peak.

Light on purpose (no polars): the command decides before polars loads, because a job's processes each run polars on
one thread, a setting read as polars loads. The cores and the memory are what `core.limits` says this process may use
(a container's CPU quota and memory limit count).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

from traceflops.core.errors import OptionsError
from traceflops.core.limits import available_memory, usable_cores
from traceflops.parsers.io import estimated_json_bytes
from traceflops.run.options import BOUNDS, bounds_text, check_numbers

AUTO = "auto"
MAX_JOBS = int(BOUNDS["jobs"][2])  # the most `--jobs` itself takes
# A rank's process at its peak, estimated high: its imports and what it keeps between ranks (~80 MiB measured: 54 MiB
# anonymous, 26 MiB of mapped libraries), plus its parse and analysis (0.7-1.25 times the rank's JSON measured, from a
# 48 MB rank to a 2 GB trace).
PROCESS_BYTES = 128 << 20
PEAK_PER_JSON_BYTE = 1.25
MEMORY_SHARE = 0.8  # of what is available: the rest left to the page cache and whatever else runs


def check_job_numbers(jobs: int | str, **numbers: Any) -> None:
    """OptionsError unless `jobs` is `auto` or a whole number within `--jobs`' bounds and each of the job's other
    `numbers` is within its own (`run.options.check_numbers`). The command and the API call it before they look for
    their inputs, so a wrong value is the error a user sees first."""
    if isinstance(jobs, str) and jobs != AUTO:
        raise OptionsError(
            None, f"--jobs (jobs) must be {AUTO} or {bounds_text('jobs')}, got {jobs!r}", "give --jobs one of those"
        )
    check_numbers(**numbers, **({} if jobs == AUTO else {"jobs": jobs}))


def jobs_for(jobs: int | str, paths: Sequence[str], local: bool = True) -> int:
    """`jobs` as `check_job_numbers` accepted it, as a count of processes; `local` False (ranks sent elsewhere, as Ray
    tasks) makes auto one."""
    if jobs == AUTO:
        return auto_jobs(paths) if local else 1
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
