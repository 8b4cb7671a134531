"""Writing a file so that a reader never sees half of it: a temporary file beside it, then one rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file in `path`'s folder, which then replaces `path`; on failure nothing is left."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
