"""A process's end without the interpreter's teardown, once its outputs are flushed.

After a command's last line, Python still unloads every module and frees
every object one by one: 40-110 ms of a small trace's `analyze` (8-14% of it;
on a 476 MB trace within the run-to-run noise), and as much again in each
worker process, on cores the command is still using. `leave` skips that teardown where nothing can be
lost: the exit functions run (the job's pool, temporary folders, logging),
the standard streams are flushed, and no thread that Python would wait for is
running. Anywhere that does not hold, the process exits as Python exits.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

_run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's, there since 3.0; elsewhere the usual exit


def leave(code: int | str | None = 0) -> NoReturn:
    """Exit with `code` (an exit status: an int, or None for 0), skipping the teardown where that changes nothing.

    A code that is not an int (`sys.exit("message")`), a thread Python would
    join at exit, an exit function that raises, or a stream that does not
    flush (a closed pipe: Python then reports it and exits 120) take the usual
    exit, with the same result as before.
    """
    if code is None:
        code = 0
    if not isinstance(code, int) or _run_exitfuncs is None or _joined_at_exit():
        sys.exit(code)
    try:
        _run_exitfuncs()  # what atexit holds, once, then the streams flushed: the usual exit's order
        _flush()
    except BaseException:  # whatever happens here, the usual exit handles as it always did
        sys.exit(code)
    os._exit(code)


def _joined_at_exit() -> bool:
    """A thread other than this one that the interpreter would wait for (not a daemon, still running)."""
    me = threading.current_thread()
    return any(t is not me and t.is_alive() and not t.daemon for t in threading.enumerate())


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
