"""`prepare` in a process of its own, beside the analysis (this module run on its own,
`core.frames.own_module_command`): annotate's read of the input needs no analysis, and the analysis leaves a core idle.

The records go into a nameless spool file the caller opened (its descriptor
passed down, so nothing is left behind if either process is killed); after
each record the worker says how far the spool holds whole records, so the
caller can write them out while later ones are read; its last reply is
`prepare`'s `Prepared`, or the error that stopped it. Replies are pickled
frames on a pipe between this package's own two processes. The caller raises
that error only once it annotates: an input the analysis refuses is named as
the analysis names it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from traceflops.core.errors import InputError
from traceflops.core.frames import OwnProcess, read_frame, run_worker, write_reply

SPOOL_PREFIX = ".traceflops-events-"  # the spool's name, where the system gives it one

if TYPE_CHECKING:  # loaded where records are read (with polars): the command starts the worker before it loads them
    from traceflops.export.perfetto.prepare import Places, Prepared


class _Reader:
    """The spool read at an offset of its own: the worker writes through the same open file (and its offset)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def read(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos


class Beside:
    """The input being read in a worker process into a spool in `folder` (the output's, so the trace-sized spool
    lands on the output's disk)."""

    def __init__(self, path: str, folder: str, chunk: int | None = None) -> None:
        # Nameless where the system allows (O_TMPFILE): nothing is left beside the output if a process is killed.
        self.spool: BinaryIO = tempfile.TemporaryFile(dir=folder, prefix=SPOOL_PREFIX)  # noqa: SIM115 (held until close)
        fd = self.spool.fileno()
        self._reader = _Reader(fd)  # where the records followed so far end
        self._got: Prepared | None = None
        self._replies: queue.SimpleQueue[object | None] = queue.SimpleQueue()
        self._drain: threading.Thread | None = None
        self.opening: bytes | None = None  # the root object up to its traceEvents array's '[', once the worker has it
        self.worker: OwnProcess | None = None
        try:
            # One polars thread: the analysis has the other core.
            self.worker = OwnProcess(
                "traceflops.export.perfetto.prepare_worker",
                env=dict(os.environ, POLARS_MAX_THREADS="1"),
                pass_fds=(fd,),
            )
            self.worker.send((path, fd, chunk))
            # Replies read as they come, whatever this process is doing: a full pipe would stop the worker (a reply
            # a record: a few thousand replies on a trace of several GB) while the analysis runs here.
            self._drain = threading.Thread(target=self._read_replies, name="annotate-worker-replies", daemon=True)
            self._drain.start()
        except BaseException:
            self.close()
            raise

    def follow(self) -> Iterator[tuple[Places, bytes]]:
        """The records as the worker writes them, until it is done (`result` then has what it found); the error that
        stopped it is raised here."""
        from traceflops.export.perfetto.prepare import read_records

        while True:
            reply = self._reply()
            if reply.__class__ is not tuple:
                return
            yield from read_records(self._reader, reply[1])

    def replay(self) -> Iterator[tuple[Places, bytes]]:
        """Every record again, from the first (the worker done)."""
        from traceflops.export.perfetto.prepare import read_records

        self.result()
        return read_records(_Reader(self.spool.fileno()), self._reader.pos)

    def result(self) -> Prepared:
        """What the worker found, once it is done (records not yet followed are skipped over, kept for `replay`)."""
        while self._got is None:
            reply = self._reply()
            if reply.__class__ is tuple:
                self._reader.pos = reply[1]
        return self._got

    def _reply(self):
        """The worker's next reply: `("spooled", end, opening)` after each record, then what it found (kept)."""
        if self._got is not None:
            return self._got
        got = self._replies.get()
        if got is None:
            self.proc.wait()
            raise InputError(
                None,
                "the process reading the trace for annotate ended before it was done (killed, e.g. for memory)",
                "rerun; with TRACEFLOPS_ANNOTATE_WORKER=0 the trace is read in the command's own process",
            )
        if isinstance(got, BaseException):
            raise got
        if got.__class__ is tuple:
            if self.opening is None:
                self.opening = got[2]
            return got
        self._got = got
        self.proc.wait()
        return got

    @property
    def proc(self) -> subprocess.Popen:
        """The worker's process."""
        assert self.worker is not None  # started in __init__, or __init__ raised
        return self.worker.proc

    def _read_replies(self) -> None:
        """On a thread: each reply queued, then None (the worker's output ended)."""
        assert self.worker is not None
        with contextlib.suppress(OSError, ValueError):  # closed under it: the worker was stopped
            while (reply := self.worker.receive()) is not None:
                self._replies.put(reply)
        self._replies.put(None)

    def close(self) -> None:
        """The worker stopped (killed if still reading) and the spool let go."""
        if self.worker is not None:
            self.worker.stop(at_once=True)
        if self._drain is not None:
            self._drain.join(timeout=5)  # its pipe ended with the worker
        self.spool.close()

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """One request: the input read into the spool, the reply written."""
    request = read_frame(inp)
    if request is None:
        return
    from traceflops.export.perfetto.prepare import prepare

    path, fd, chunk = pickle.loads(request)
    reply: object
    sent: list[bytes] = []

    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as spool:

            def spooled(opening: bytes | None) -> None:
                spool.flush()
                write_reply(out, ("spooled", spool.tell(), None if sent else opening))
                if opening is not None:
                    sent.append(opening)

            reply = prepare(path, spool, chunk, spooled)
    except Exception as e:  # the caller raises it, as it would its own
        reply = e
    write_reply(out, reply)


if __name__ == "__main__":
    run_worker(serve)
