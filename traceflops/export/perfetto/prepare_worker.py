"""`prepare` in a process of its own, beside the analysis (this module run on its own,
`core.frames.own_module_command`): annotate's read of the input needs no analysis, and the analysis leaves a core idle.

The records go into a nameless spool file the caller opened (its descriptor
passed down, so nothing is left behind if either process is killed); the
reply is `prepare`'s `Prepared`, or the error that stopped it, as a pickled
frame on a pipe between this package's own two processes. The caller raises
that error only once it annotates: an input the analysis refuses is named
as the analysis names it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import tempfile
from typing import BinaryIO

from traceflops.core.errors import InputError
from traceflops.core.frames import own_module_command, read_frame, run_worker, write_frame, write_reply
from traceflops.export.perfetto.prepare import SPOOL_PREFIX, prepare


class Beside:
    """The input being read in a worker process into a spool in `folder` (the output's, so the trace-sized spool
    lands on the output's disk)."""

    def __init__(self, path: str, folder: str, chunk: int) -> None:
        # Nameless where the system allows (O_TMPFILE): nothing is left beside the output if a process is killed.
        self.spool: BinaryIO = tempfile.TemporaryFile(dir=folder, prefix=SPOOL_PREFIX)  # noqa: SIM115 (held until close)
        fd = self.spool.fileno()
        try:
            # One polars thread: the analysis has the other core.
            self.proc = subprocess.Popen(
                own_module_command("traceflops.export.perfetto.prepare_worker"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(fd,),
                env=dict(os.environ, POLARS_MAX_THREADS="1"),
            )
            assert self.proc.stdin is not None  # started with it piped
            write_frame(self.proc.stdin, pickle.dumps((path, fd, chunk)))
            self.proc.stdin.close()
        except BaseException:
            self.close()
            raise

    def result(self):
        """`prepare`'s `Prepared` and the spool, at its start; the error that stopped the worker is raised here."""
        assert self.proc.stdout is not None
        reply = read_frame(self.proc.stdout)
        self.proc.wait()
        if reply is None:
            raise InputError(
                None,
                "the process reading the trace for annotate ended before it was done (killed, e.g. for memory)",
                "rerun; with TRACEFLOPS_ANNOTATE_WORKER=0 the trace is read in the command's own process",
            )
        got = pickle.loads(reply)  # from this package's own worker, never from a trace
        if isinstance(got, BaseException):
            raise got
        self.spool.seek(0)
        return got, self.spool

    def close(self) -> None:
        """The worker stopped (killed if still reading) and the spool let go."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
            proc.wait()
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
    path, fd, chunk = pickle.loads(request)
    reply: object
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as spool:
            reply = prepare(path, spool, chunk)
    except Exception as e:  # the caller raises it, as it would its own
        reply = e
    write_reply(out, reply)


if __name__ == "__main__":
    run_worker(serve)
