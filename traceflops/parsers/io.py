"""Reading trace files: regular files only, bounded decompression, so a gzip bomb or /dev/zero is an error, not an OOM
kill or a hang."""

from __future__ import annotations

import errno
import os
import re
import stat
import types
import zlib
from collections.abc import Iterator

from traceflops.core.errors import InputError, OptionsError
from traceflops.core.files import open_if_regular

inflate: types.ModuleType
try:  # ISA-L's inflate: zlib's API, about four times as fast (a 42 MB rank: 0.015 s against 0.063 s)
    from isal import isal_zlib as inflate
except ImportError:  # a platform without its wheel
    inflate = zlib

DEFAULT_MAX_BYTES = 32 << 30  # decompressed bytes; override with TRACEFLOPS_MAX_BYTES
MAX_BYTES_VAR = "TRACEFLOPS_MAX_BYTES"
GZIP_MAGIC = b"\x1f\x8b"
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*")
_KINDS = (
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def parse_byte_count(text: str) -> int:
    """`32000000000`, `1e9`, `32GiB` or `4GB` as a positive whole number of bytes; OptionsError naming the variable
    otherwise."""
    m = _SIZE.fullmatch(text.lower())
    number = m and (
        int(m.group(1)) if m.group(1).isdigit() else float(m.group(1))
    )  # integers exactly, `1e9` as a float
    value = number * _UNITS[m.group(2)] if m and number is not None and m.group(2) in _UNITS else None
    if value is None or value < 1 or value != value // 1 or value > 1 << 62:
        raise OptionsError(
            None,
            f"{MAX_BYTES_VAR}={text!r} is not a positive byte count",
            "set it to a whole number of bytes such as 32000000000, 1e9 or 32GiB, or unset it",
        )
    return int(value)


def max_bytes_default() -> int:
    """The decompressed-size limit: TRACEFLOPS_MAX_BYTES when set (a bad value is an error, never silently ignored)."""
    env = os.environ.get(MAX_BYTES_VAR)
    return DEFAULT_MAX_BYTES if env is None or env == "" else parse_byte_count(env)


def not_regular(path: str, mode: int) -> InputError | None:
    """Why a file of this mode cannot be read as a trace (a pipe or a device never ends, or has no size), or None."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return InputError(path, "is a directory, not a trace file", "pass the trace file itself")
    kind = next((k for test, k in _KINDS if test(mode)), "not a plain file")
    return InputError(
        path,
        f"is {kind}, not a regular file",
        "save it to a file first (e.g. `cat SOURCE > trace.json`) and pass that file",
    )


def _os_error(path: str, e: OSError) -> InputError:
    """One clear line for a file that cannot be opened."""
    if e.errno == errno.ENOENT:
        return InputError(path, "no such file", "check the path")
    if e.errno == errno.EISDIR:
        return InputError(path, "is a directory, not a trace file", "pass the trace file itself")
    if e.errno in (errno.EACCES, errno.EPERM):
        return InputError(path, "permission denied", "check the file's permissions")
    if e.errno == errno.ELOOP:
        return InputError(path, "is a symbolic link loop (too many levels of links)", "point at the real file")
    if e.errno == errno.ENXIO:
        return InputError(
            path,
            "is a socket or a device without a reader, not a regular file",
            "save it to a file first and pass that file",
        )
    return InputError(path, f"cannot be opened ({e.strerror or e})", "check the path and the file")


def check_regular(path: str) -> os.stat_result:
    """The file's stat, or InputError when it is missing, unreadable, a link loop, or not a regular file; reads
    nothing."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _os_error(path, e) from None
    except ValueError:  # an embedded NUL byte
        raise InputError(path, "is not a valid file name", "check the path") from None
    err = not_regular(path, st.st_mode)
    if err is not None:
        raise err
    return st


def open_trace(path: str):
    """The regular file opened for reading, or one clear InputError saying why it cannot be.

    A FIFO without a writer does not hang it and /dev/zero is never read (`open_if_regular`).
    """
    try:
        f, st = open_if_regular(path)
    except OSError as e:
        raise _os_error(path, e) from None
    except ValueError:
        raise InputError(path, "is not a valid file name", "check the path") from None
    if f is None:
        err = not_regular(path, st.st_mode)
        assert err is not None  # open_if_regular opens every regular file
        raise err
    return f


# What a gzipped trace expands to, for estimates made before reading it: traces compress about eightfold.
GZIP_RATIO = 8


def estimated_json_bytes(path: str) -> int:
    """The JSON a trace file holds, estimated from its size without reading it (gzip: `GZIP_RATIO` times); 0 where
    it cannot be opened (the parse says why)."""
    try:
        with open_trace(path) as f:
            size = os.fstat(f.fileno()).st_size
            gz = f.read(2) == GZIP_MAGIC
    except InputError:
        return 0
    return size * (GZIP_RATIO if gz else 1)


def chunks(path: str, limit: int, chunk: int = 8 << 20, progress=None) -> Iterator[bytes]:
    """The file's bytes in pieces of at most `chunk`, gunzipped (every member) if it is gzip; InputError past `limit`.

    A gzip stream that ends early yields what it held: a cut trace is the
    parser's to report. `progress(read, size)` follows the compressed bytes read.
    """
    with open_trace(path) as f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        if not gz and size > limit:
            raise InputError(
                path,
                f"is more than the {limit}-byte limit (a huge trace)",
                "raise TRACEFLOPS_MAX_BYTES if it is genuine",
            )

        def blocks() -> Iterator[bytes]:
            while block := f.read(chunk):
                if progress is not None:
                    progress(f.tell(), size)
                yield block

        total = 0
        for piece in _gunzip(blocks(), chunk, path) if gz else blocks():
            total += len(piece)
            if total > limit:
                raise InputError(
                    path,
                    f"decompresses to more than the {limit}-byte limit (a gzip bomb or a huge trace)",
                    "raise TRACEFLOPS_MAX_BYTES if it is genuine",
                )
            yield piece


def _gunzip(blocks: Iterator[bytes], piece: int, path: str) -> Iterator[bytes]:
    """Inflate gzip members one after another, never more than `piece` bytes at a time (a small block may expand a lot).

    Bytes after a member that do not start another one are trailing garbage:
    an InputError, not an unlabelled zlib error (or, for one stray byte, silence).
    """
    d = inflate.decompressobj(wbits=31)
    done = 0
    head: bytes | None = None  # the next member's first bytes, checked against the gzip magic
    try:
        for block in blocks:
            data = block
            while data:
                if head is not None:
                    head += data[: 2 - len(head)]
                    if not GZIP_MAGIC.startswith(head):
                        raise InputError(
                            path,
                            f"has trailing garbage after its gzip data ({done} bytes inflated)",
                            "re-copy or re-export the trace, or cut it at the end of the gzip data",
                        )
                    head = None if len(head) == 2 else head
                out = d.decompress(data, piece)
                done += len(out)
                if out:
                    yield out
                if d.eof:  # the next member starts with what this one left
                    data, d, head = d.unused_data, inflate.decompressobj(wbits=31), b""
                else:
                    data = d.unconsumed_tail
    except (zlib.error, inflate.error) as e:
        raise InputError(
            path, f"corrupt gzip data after {done} bytes ({e})", "re-copy or re-export the trace"
        ) from None


def read_bytes(path: str, *, max_bytes: int | None = None) -> bytes:
    """The whole file, gunzipped if needed, bounded by `max_bytes` (TRACEFLOPS_MAX_BYTES by default)."""
    return b"".join(chunks(path, max_bytes or max_bytes_default(), 1 << 20))
