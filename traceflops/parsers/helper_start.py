"""Starting the decode helper process: whether a trace wants one, and starting it early.

Light on purpose (no polars, no numpy): the CLI starts a large trace's helper
before its own imports, so the two processes import side by side (about 0.3 s
each) instead of the helper starting only when the parse begins, while this
process decodes alone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import multiprocessing
import os
import subprocess

from traceflops.core.frames import own_module_command, spare_cores, switch
from traceflops.parsers.io import estimated_json_bytes

ENV = "TRACEFLOPS_PARSE_HELPER"  # 1: always use a helper, 0: never; unset: large files with a core to spare
# Below this much JSON a helper is not worth its cost: on a 142 MB trace it took 3% off the wall time for 26% more
# CPU and 30 MiB more memory; on a 476 MB one, 12% off the wall time for 14% more CPU.
MIN_BYTES = 256 << 20

_early: list[subprocess.Popen] = []  # a helper started before the parse that has not been taken


def wanted(path: str) -> bool:
    """A helper pays for its start-up (about 0.3 s of imports) only on large traces, with a core to spare (none is
    while annotate's reader runs: `spare_cores`)."""
    forced = switch(ENV)
    if forced is not None:
        return forced
    if multiprocessing.current_process().daemon:
        return False
    if spare_cores() < 2:
        return False
    return estimated_json_bytes(path) >= MIN_BYTES  # never a FIFO or a device: such a path estimates 0


def start() -> subprocess.Popen | None:
    """A new helper (`python -m traceflops.parsers.decode_worker`, one core: no polars threads), or None."""
    env = dict(os.environ, **{ENV: "0", "POLARS_MAX_THREADS": "1"})
    try:
        proc = subprocess.Popen(
            own_module_command("traceflops.parsers.decode_worker"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except OSError:
        return None
    _widen(proc.stdin, proc.stdout)
    return proc


def _widen(*pipes) -> None:
    """1 MiB pipe buffers where Linux allows: an 8 MB array then crosses in 8 copies, not 128 wake-ups of its reader
    (the helper's read of one took 10 ms, now 5)."""
    size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if size is None:
        return
    for pipe in pipes:
        # above this system's pipe-max-size: the default buffer works, a little slower
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe.fileno(), size, 1 << 20)


def start_early(path: str) -> None:
    """Start the helper this Kineto trace's parse will want, now; one not taken by a parse is stopped at exit."""
    if _early or not wanted(path):
        return
    proc = start()
    if proc is not None:
        _early.append(proc)


def take() -> subprocess.Popen | None:
    """The helper started early if it is still running, else a new one."""
    while _early:
        proc = _early.pop()
        if proc.poll() is None:
            return proc
    return start()


def drop_early() -> None:
    """Stop a helper started early that no parse took (the report came from the cache, or the command failed)."""
    while _early:
        proc = _early.pop()
        proc.kill()
        proc.wait()


atexit.register(drop_early)
