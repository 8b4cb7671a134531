"""Length-prefixed frames on a pipe between traceflops' own processes (the decode helper, a job's rank workers,
annotate's reader), and how such a worker is started and answers.

A frame is its length (8 bytes, little-endian), then its bytes; a frame of length 0, or the pipe's end, ends the
stream.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO, Protocol

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
    stderr); Ctrl-C ignored (it reaches the whole process group: the caller stops its workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, replies)
