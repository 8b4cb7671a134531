"""Reading trace files: bounded decompression, so a gzip bomb is an error, not an OOM kill."""

from __future__ import annotations

import os
import zlib

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


def read_bytes(path: str, *, max_bytes: int | None = None) -> bytes:
    limit = max_bytes or max_bytes_default()
    with open_trace(path) as f:
        magic = f.read(2)
        f.seek(0)
        if magic != b"\x1f\x8b":
            if os.fstat(f.fileno()).st_size > limit:
                raise InputError(path, f"file is larger than the {limit}-byte limit", "raise TRACEFLOPS_MAX_BYTES if it is genuine")
            return f.read()
        return _gunzip(f, path, limit)


def _gunzip(f, path: str, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    try:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out += d.decompress(chunk, limit + 1 - len(out))
            while d.unconsumed_tail and len(out) <= limit:
                out += d.decompress(d.unconsumed_tail, limit + 1 - len(out))
            if len(out) > limit:
                raise InputError(path, f"decompresses to more than {limit} bytes (a gzip bomb or a huge trace)", "raise TRACEFLOPS_MAX_BYTES if it is genuine")
            if d.eof:
                # concatenated gzip members
                rest = d.unused_data
                d = zlib.decompressobj(wbits=31)
                if rest:
                    out += d.decompress(rest, limit + 1 - len(out))
    except zlib.error as e:
        raise InputError(path, f"corrupt gzip data ({e})", "re-copy or re-export the trace") from None
    return bytes(out)
