"""Writing a file so that a reader never sees half of it: a temporary file beside it, then one rename.

A new output's mode is 0666 less the umask, as every program's files are.

Only a regular file (or nothing) is ever replaced: a character device or a FIFO
(`/dev/null`, `/dev/stdout`, a named pipe) is written in place once the whole
output exists, a block device is refused, and a symlink keeps being a symlink
(its target is replaced).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

from traceflops.core.errors import InputError
from traceflops.core.fmt import encodable


def open_if_regular(path: str | os.PathLike, *, follow_links: bool = True) -> tuple[BinaryIO | None, os.stat_result]:
    """The file opened for reading if it is a regular file (else None), and its stat; nothing is read.

    Opened non-blocking and checked with fstat first: a FIFO without a writer
    would hang the open, and a device such as /dev/zero never ends. Raises what
    `os.open` raises (OSError; ValueError for a NUL in the name).
    """
    fd = os.open(
        path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
    )
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None, st
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` are one existing file (same device and inode: links and spellings included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False  # one does not exist (yet): writing it cannot overwrite the other


def _mode(path: Path) -> int | None:
    """The file type bits of what `path` points at, None when nothing is there."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file, which then replaces `path`; on failure nothing is left and `path` is
    untouched."""
    path = Path(path)
    mode = _mode(path)
    if mode is not None and stat.S_ISBLK(mode):
        raise OSError(errno.EPERM, "a block device; reports are never written to one", str(path))
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return _write_through(path, write)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    tmp = None
    try:
        for _ in range(8):
            # Named before it exists: `tempfile.mkstemp` names the file only once it is made, and a signal raised
            # between the two (as one was, under load) left it behind.
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            if _created(tmp):
                break
            tmp = None  # someone else's (1 in 2**48): never removed
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))
        write(tmp)
        os.replace(tmp, path)
    finally:  # Ctrl-C or SIGTERM (raised as an exception) included, wherever it lands
        if tmp is not None and tmp.exists():
            tmp.unlink()


def _created(tmp: Path) -> bool:
    """A new empty file at `tmp`, or False where one is there already.

    Mode 0666 less the process's umask, as any program's new file (`open(..., "w")`, a shell's `>`): 0644 under the
    usual umask 022, 0600 under 077. The rename keeps it, so the output is as readable as the user's umask says.
    """
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the kernel applies the umask
        return True
    except FileExistsError:
        return False


def _write_through(path: Path, write: Callable[[Path], None]) -> None:
    """A device or a FIFO: the whole output in a private temporary folder first, then copied into it (never
    replaced)."""
    with tempfile.TemporaryDirectory(prefix="traceflops-") as d:
        tmp = Path(d) / "out"
        write(tmp)
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)


class _Watched:
    """A file whose OS errors are kept: a library that writes through it may raise its own error in their place
    (polars' parquet writer says "File out of specification" for a full disk)."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.os_error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.os_error = e
            raise

    def __getattr__(self, name):
        return getattr(self._f, name)


def write_file(path: str | os.PathLike, fill: Callable[[BinaryIO], Any]) -> Any:
    """The one writer of outputs: `fill(f)` writes into an open binary file, which replaces `path` as `write_atomic`
    does.

    A library is handed the open file, never the name (one that is not UTF-8 is legal on Linux and not every library
    takes it). An OS error on the way (no folder, no space, a file-size limit), raised as such or behind a library's
    own error, is an InputError (exit 2) naming the path; what `fill` returned otherwise.
    """
    result, watched = None, None

    def write(tmp: Path) -> None:
        nonlocal result, watched
        with open(tmp, "wb") as raw:
            watched = _Watched(raw)
            result = fill(cast(BinaryIO, watched))  # a proxy of the open file: every other call goes to it

    try:
        write_atomic(path, write)
    except OSError as e:
        raise _cannot_write(path, e) from None
    except Exception:
        if watched is None or watched.os_error is None:
            raise
        raise _cannot_write(path, watched.os_error) from None
    return result


def write_text(path: str | os.PathLike, text: str) -> None:
    """A text output (a report) in UTF-8 through `write_file`; lone surrogates (a file name's bytes) as escapes."""
    write_file(path, lambda f: f.write(encodable(text).encode("utf-8")))


def _cannot_write(path, e: OSError) -> InputError:
    return InputError(
        str(path),
        f"cannot write ({e.strerror or e})",
        "check the folder exists and is writable, and that the disk has space and no file-size limit is hit",
    )
