"""Length-prefixed frames on a pipe between traceflops' own processes (the decode helper, a job's rank workers).

A frame is its length (8 bytes, little-endian), then its bytes; a frame of length 0, or the pipe's end, ends the
stream.
"""

from __future__ import annotations

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
