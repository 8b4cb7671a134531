"""Length-prefixed frames on a pipe between traceflops' own processes (the decode helper, a job's rank workers,
annotate's reader), and how such a worker is started and answers.

A frame is its length (8 bytes, little-endian), then its bytes; a frame of length 0, or the pipe's end, ends the
stream.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, BinaryIO, Protocol

from traceflops.core.limits import usable_cores
from traceflops.core.process_exit import leave

LEN = 8


class Readable(Protocol):
    """What frames are read from: a pipe, a file, or a file read at an offset of its own."""

    def read(self, n: int, /) -> bytes: ...

    def tell(self) -> int: ...


def write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(LEN, "little"))
    stream.write(data)


def end_frames(stream: IO[bytes]) -> None:
    stream.write((0).to_bytes(LEN, "little"))


def read_frame(stream: Readable) -> bytes | None:
    """The next frame's bytes; None at the end (an empty frame, or a stream cut short)."""
    head = stream.read(LEN)
    if len(head) < LEN:
        return None
    n = int.from_bytes(head, "little")
    if n == 0:
        return None
    body = stream.read(n)
    return body if len(body) == n else None


def own_module_command(module: str) -> list[str]:
    """The command that runs `module` of this traceflops (`python -m module` would put the caller's folder first on
    the path: a checkout of another version there would be imported instead)."""
    root = str(Path(__file__).resolve().parents[2])
    code = f"import runpy, sys; sys.path.insert(0, {root!r}); runpy.run_module({module!r}, run_name='__main__')"
    return [sys.executable, "-c", code]


def write_reply(stream: IO[bytes], reply: object) -> None:
    """A worker's reply (a result, or the error that stopped it) as a pickled frame, flushed; an error that does not
    pickle goes as its type and text."""
    try:
        blob = pickle.dumps(reply)
    except Exception:
        blob = pickle.dumps(RuntimeError(f"{type(reply).__name__}: {reply}"))
    write_frame(stream, blob)
    stream.flush()


def run_worker(serve: Callable[[BinaryIO, BinaryIO], None]) -> None:
    """A worker module's main: `serve(requests, replies)` on stdin and the real stdout (anything else printed goes to
    stderr); Ctrl-C ignored (it reaches the whole process group: the caller stops its workers). A caller gone (killed)
    ends it without a word: its traceback would land on the user's terminal after the command's own last line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        serve(sys.stdin.buffer, replies)
        replies.flush()
    except BrokenPipeError:
        os._exit(1)  # not a normal exit: flushing the replies at exit would raise it again
    leave(0)  # no teardown on a core the command is still using


def switch(name: str) -> bool | None:
    """A user's switch for one of this package's further processes (a parse's decode helper, annotate's reader):
    True where the environment variable `name` is set to anything but 0 or nothing, False where it is, None unset."""
    value = os.environ.get(name)
    return None if value is None else value.strip() not in ("", "0")


_running: set[OwnProcess] = set()  # this process's own workers started and not yet stopped


def spare_cores() -> int:
    """`usable_cores` less one for each of this process's own workers still running: what a further process (a
    parse's decode helper, annotate's reader) would have to itself. Annotate's reader holds one while the trace is
    parsed; a helper beside it made three processes on two cores, which only contended."""
    return usable_cores() - len(_running)


class OwnProcess:
    """This package's `module` run as a worker (`own_module_command`): requests in and replies out as pickled frames
    on its stdin and stdout (`run_worker`, `write_reply`)."""

    def __init__(self, module: str, env: dict | None = None, pass_fds: Sequence[int] = ()) -> None:
        self.proc = subprocess.Popen(
            own_module_command(module), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, pass_fds=pass_fds
        )
        _running.add(self)

    def send(self, request: object) -> None:
        """A request; OSError or ValueError where the worker is gone or its input was closed."""
        assert self.proc.stdin is not None  # started with it piped
        write_frame(self.proc.stdin, pickle.dumps(request))
        self.proc.stdin.flush()

    def receive(self) -> object | None:
        """The next reply, unpickled (from this package's own worker, never from a trace); None where the worker's
        output ended (it died)."""
        assert self.proc.stdout is not None
        frame = read_frame(self.proc.stdout)
        return None if frame is None else pickle.loads(frame)

    def stop(self, at_once: bool) -> None:
        """Its input closed (it ends after its request), or, at once, killed: an error, Ctrl-C or SIGTERM must not
        wait for it."""
        if at_once and self.proc.poll() is None:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                if pipe is not None:
                    pipe.close()
        try:
            self.proc.wait()
        finally:
            _running.discard(self)
