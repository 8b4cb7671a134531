"""The annotated trace's deflate on a thread of its own (`Behind`), beside the command's thread that fills the places.

Where the reader finishes before the analysis, the command's process is all
that is left working after it: filling the places and deflating the output
ran one after the other on one core while the other idled. ISA-L's deflate
and a join of a MiB or more release the interpreter's lock, so on a thread
they take the other core. (Reading the spool ahead and making the added
events' text on threads too were measured no faster: their Python work
contends for that lock, and polars has one thread in this process.)
"""

from __future__ import annotations

import queue
import threading


class Behind:
    """A binary file whose writes are gathered into pieces of `batch` bytes and written to `f` on a thread of their
    own (at most `depth` pieces waiting: memory stays bounded). `close` writes what is left and waits; an error the
    thread met is raised there, or at the next write."""

    def __init__(self, f, batch: int = 4 << 20, depth: int = 2) -> None:
        self._f, self._batch = f, batch
        self._pending: list[bytes] = []
        self._size = 0
        self._error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="annotate-behind", daemon=True)
        self._thread.start()

    def write(self, data) -> int:
        if self._error is not None:
            raise self._error
        data = data if data.__class__ is bytes else bytes(data)  # a buffer the caller may change after this returns
        self._pending.append(data)
        self._size += len(data)
        if self._size >= self._batch:
            self._hand()
        return len(data)

    def _hand(self) -> None:
        if self._pending:
            self._queue.put(self._pending)
            self._pending, self._size = [], 0

    def _run(self) -> None:
        while (pieces := self._queue.get()) is not None:
            if self._error is None:  # after an error the rest is only taken off the queue
                try:
                    self._f.write(b"".join(pieces))  # joined here: a join of a MiB or more releases the lock
                except BaseException as e:
                    self._error = e

    def close(self) -> None:
        """What is left written and the thread ended; the error it met raised."""
        self._hand()
        self._end()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """The thread ended without writing what was not yet handed to it (the output is being given up)."""
        self._pending, self._size = [], 0
        if self._thread.is_alive():
            self._error = self._error or _Abandoned()
            self._end()

    def _end(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class _Abandoned(Exception):
    """The output was given up: the thread writes nothing more."""
