"""Reading trace files: bounded decompression, so a gzip bomb is an error, not an OOM kill."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

from traceflops.core.errors import InputError

DEFAULT_MAX_BYTES = 32 << 30  # decompressed bytes; override with TRACEFLOPS_MAX_BYTES


def max_bytes_default() -> int:
    env = os.environ.get("TRACEFLOPS_MAX_BYTES")
    return int(env) if env and env.isdigit() else DEFAULT_MAX_BYTES


def open_trace(path: str):
    """The file opened for reading, or one clear InputError saying why it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(path, "no such file", "check the path") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a trace file", "pass the trace file itself") from None
    except PermissionError:
        raise InputError(path, "permission denied", "check the file's permissions") from None


def chunks(path: str, limit: int, chunk: int = 8 << 20, progress=None) -> Iterator[bytes]:
    """The file's bytes in pieces of at most `chunk`, gunzipped (every member) if it is gzip; InputError past `limit`.

    A gzip stream that ends early yields what it held: a cut trace is the
    parser's to report. `progress(read, size)` follows the compressed bytes read.
    """
    with open_trace(path) as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        if not gz and size > limit:
            raise InputError(path, f"is more than the {limit}-byte limit (a huge trace)", "raise TRACEFLOPS_MAX_BYTES if it is genuine")

        def blocks() -> Iterator[bytes]:
            while block := f.read(chunk):
                if progress is not None:
                    progress(f.tell(), size)
                yield block

        total = 0
        for piece in (_gunzip(blocks(), chunk, path) if gz else blocks()):
            total += len(piece)
            if total > limit:
                raise InputError(path, f"decompresses to more than the {limit}-byte limit (a gzip bomb or a huge trace)",
                                 "raise TRACEFLOPS_MAX_BYTES if it is genuine")
            yield piece


def _gunzip(blocks: Iterator[bytes], piece: int, path: str) -> Iterator[bytes]:
    """Inflate gzip members one after another, never more than `piece` bytes at a time (a small block may expand a lot)."""
    d = zlib.decompressobj(wbits=31)
    done = 0
    try:
        for block in blocks:
            data = block
            while data:
                out = d.decompress(data, piece)
                done += len(out)
                if out:
                    yield out
                if d.eof:  # the next member starts with what this one left
                    data, d = d.unused_data, zlib.decompressobj(wbits=31)
                else:
                    data = d.unconsumed_tail
    except zlib.error as e:
        raise InputError(path, f"corrupt gzip data after {done} bytes ({e})", "re-copy or re-export the trace") from None


def read_bytes(path: str, *, max_bytes: int | None = None) -> bytes:
    """The whole file, gunzipped if needed, bounded by `max_bytes` (TRACEFLOPS_MAX_BYTES by default)."""
    return b"".join(chunks(path, max_bytes or max_bytes_default(), 1 << 20))
