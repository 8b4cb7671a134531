"""Settings a process reads as it starts: polars' allocator hands freed memory back (a large trace's peak is what is
live), polars' thread count, glibc's heap thresholds and huge pages for a job's workers; and handing glibc's freed
heap back.

Imports nothing heavy: `prefer_prompt_release` and `prefer_one_thread` must run before polars loads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

VAR = "_RJEM_MALLOC_CONF"  # polars' allocator (jemalloc) reads it once, as polars loads
PROMPT_RELEASE = "background_thread:true,dirty_decay_ms:300,muzzy_decay_ms:0"
POLARS_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"  # what polars puts first there (2.1), whatever else is set
AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"  # purged, not lazily freed (MADV_FREE pages still count in RSS)


def prefer_prompt_release() -> None:
    """polars' allocator (jemalloc) returns freed pages after 300 ms instead of 10 s.

    An analysis frees large intermediates stage after stage; pages kept for
    seconds were a sixth of a large trace's peak memory. Purging sooner, on a
    background thread, costs no measurable time (purging at once did: 0.7 s of
    6). Only before polars loads, and a user's own setting wins.
    """
    if "polars" not in sys.modules:
        os.environ.setdefault(VAR, PROMPT_RELEASE)


POLARS_THREADS = "POLARS_MAX_THREADS"  # read once, as polars loads


def prefer_one_thread() -> None:
    """polars on one thread in this process, before it loads, where processes already take a core each (a job's ranks).

    Two threads beside a rank worker on two cores only contended: a job of one
    48 MB rank copied 32 times took 10.5-10.9 s with them, 10.2-10.3 s without.
    A user's own setting wins.
    """
    prefer_threads(1)


def prefer_threads(n: int) -> None:
    """polars on `n` threads (at least one) in this process, before it loads, where another process of this command
    takes the other cores (annotate's reader). A user's own setting wins."""
    if "polars" not in sys.modules:
        os.environ.setdefault(POLARS_THREADS, str(max(1, n)))


def prefer_release_at_once() -> None:
    """`release_at_once` for this process, before polars loads: a job's own process analyses ranks beside its
    workers, as they do (see `release_at_once`)."""
    if "polars" not in sys.modules:
        os.environ[VAR] = release_at_once(os.environ.get(VAR))


def release_at_once(conf: str | None) -> str:
    """The allocator setting for a process that analyses trace after trace (a rank worker): freed pages handed back at
    once.

    A worker starts its next rank as soon as one ends, while the ~50 MB that
    rank freed are still unpurged (any decay above zero, even 1 ms, left them);
    the next parse grew past them, so each worker's peak from its second rank
    on was ~30% above its first. At once costs ~10% CPU. A user's own setting
    (anything but ours or polars' default) wins.
    """
    if conf and not conf.endswith((PROMPT_RELEASE, POLARS_DEFAULT)):
        return conf
    return f"{conf},{AT_ONCE}" if conf else AT_ONCE


@contextmanager
def children_environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in the environment of the processes started inside (this process read its own settings as it
    started: it keeps them), then the environment as it was."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# glibc's heap, for a process that analyses rank after rank: blocks of 64 KiB and more mapped on their own (returned
# as they are freed), the heap's free top trimmed past 128 KiB. The default threshold grows with the blocks freed (up
# to 32 MiB), so a rank's column-building values stayed in the heap; a 48 MB rank's analysis peaked 3-5 MiB lower.
GLIBC_PROMPT = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}  # read as a process starts
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3

# glibc's mapped blocks on transparent huge pages where the kernel gives them on request (its `madvise` mode; in
# `always` mode they already are, in `never` nothing changes). A rank worker maps and unmaps its large blocks rank
# after rank (`GLIBC_PROMPT`): a 48 MB rank analysed again and again with a worker's settings took 77-84 k minor page
# faults against 99-100 k, and 0.76 against 0.84 s of CPU (medians; six processes each, in ABBA order, lower in each
# pair). A job's own process analyses ranks too, without it, so a 32-rank job with --jobs 2 gains about half that:
# 2 % of its CPU, within its noise; its peak was the same (within 2 MiB). Read as a process starts: only processes
# started with it have it. Not given to the decode helper (a 2 GB trace's parse peaked 76 MiB higher and was no
# faster) or to annotate's reader (3 % less CPU for 7-24 MiB more).
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def trim_promptly() -> None:
    """`GLIBC_PROMPT` for this process, already started (its workers take it from their environment); a user's own
    setting of either wins."""
    if any(k in os.environ for k in GLIBC_PROMPT):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, int(GLIBC_PROMPT["MALLOC_MMAP_THRESHOLD_"]))
        libc.mallopt(_M_TRIM_THRESHOLD, int(GLIBC_PROMPT["MALLOC_TRIM_THRESHOLD_"]))
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def return_freed_memory() -> None:
    """Hand glibc's freed heap back to the OS (it keeps it otherwise), between stages that free a lot."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do
