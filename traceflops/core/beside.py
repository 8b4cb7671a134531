"""Two independent parts of an analysis at once: one worked out on a thread beside the caller (`beside`).

A stage is mostly polars queries and numpy calls, which release the interpreter's
lock while they work; yet run one after another they kept one core of two
busy for most of an analysis of one trace, polars' own threads helping little
on its many small queries. Side by side, the critical path beside the idle gaps
and the roofline took about a tenth off the analysis of the 476 MB trace.

Only where polars has more than one thread in this process: where the command
gave the other cores to processes of its own (a job's rank workers, annotate's
reader), a second thread would only contend; there the part runs at once, on
the caller's thread. A part run beside must be pure (no warning counted, no
shared frame changed): what it returns is the same either way. Its frames are
held at the same time as the caller's: the views' kernel and module rollups
beside the metrics took ~0.1 s more off but raised the peak of the 476 MB
trace's analysis by ~23 MiB (4%), so they stay on the caller's thread; the
critical path beside costs ~12 MiB (2%).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import polars as pl

T = TypeVar("T")


def threaded() -> bool:
    """Whether a part runs beside: polars has more than one thread in this process. (A benchmark's profiled run or a
    test sets this module's `threaded` to keep every part on the caller's thread, leaving polars itself untouched.)"""
    return pl.thread_pool_size() > 1


class Later(Generic[T]):
    """A value being worked out beside the caller; `result()` waits for it, or raises what its work raised."""

    def __init__(self, fn: Callable[..., T], args: tuple) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if not threaded():
            self._run(fn, args)
            return
        # In a copy of the caller's context: an analysis's `coded_once` codes are shared with the part run beside.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run, fn, args), name="traceflops-beside", daemon=True
        )
        self._thread.start()

    def _run(self, fn: Callable[..., T], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # raised where the value is asked for, on the caller's thread
            self._error = e

    def result(self) -> T:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        return self._value


def beside(fn: Callable[..., T], *args: Any) -> Later[T]:
    """`fn(*args)` started on a thread beside the caller where polars has more than one thread here, else run now."""
    return Later(fn, args)
