"""Length-prefixed frames on a pipe between traceflops' own processes (the decode helper, a job's rank workers).

A frame is its length (8 bytes, little-endian), then its bytes; a frame of length 0, or the pipe's end, ends the
stream.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

LEN = 8


def write_frame(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(LEN, "little"))
    stream.write(data)


def end_frames(stream: IO[bytes]) -> None:
    stream.write((0).to_bytes(LEN, "little"))


def read_frame(stream: IO[bytes]) -> bytes | None:
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
