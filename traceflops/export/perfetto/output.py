"""The one writer of an annotated trace: atomic, gzipped as it is written, or plain JSON to standard output.

The output is written atomically (a temporary file beside it, then a rename),
gzipped unless the name ends in plain `.json`, compressed as it is written (on a thread of its own: `overlap`);
`-` writes plain JSON to standard output.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

from traceflops.core.files import write_file
from traceflops.export.perfetto.overlap import Behind

try:  # ISA-L's deflate at level 2: ten times as fast as zlib's level 6 (a tenth of annotate's time), a third larger
    from isal.igzip import GzipFile as GzipWriter

    GZIP_LEVEL = 2
except ImportError:  # a platform without its wheel
    from gzip import GzipFile as GzipWriter  # type: ignore[assignment]  # isal's is a drop-in subclass of it

    GZIP_LEVEL = 6


STDOUT = "-"  # the output name that writes the annotated trace to standard output


def write_output(path: str, fill: Callable[[BinaryIO, Path], Any]) -> Any:
    """`fill(out, tmp)` writes the trace into a temporary file beside `path`, which then replaces it; what `fill`
    returned.

    Gzipped unless `path` ends in .json, compressed as `fill` writes it.
    `tmp` is that file's path, for scratch files beside it. `out` is for `write` only: gzipped, the writes are
    deflated on a thread of their own (`overlap.Behind`).
    `path` "-" (`STDOUT`) is standard output: plain JSON (for a pipe: `jq`, `gzip`), scratch files in the temporary
    folder.
    """
    if str(path) == STDOUT:
        sys.stdout.flush()
        done = fill(sys.stdout.buffer, Path(tempfile.gettempdir()) / STDOUT)
        sys.stdout.buffer.flush()
        return done

    def write(raw) -> Any:
        tmp = Path(raw.name)
        if Path(path).name.endswith(".json"):
            result = fill(raw, tmp)
        else:
            with GzipWriter(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as f:
                behind = Behind(f)  # deflated on a thread of its own while `fill` goes on
                try:
                    result = fill(cast(BinaryIO, behind), tmp)  # a binary file's write: all `fill` calls
                    behind.close()
                finally:
                    behind.abandon()  # ended before the gzip file closes under it
        raw.flush()
        os.fsync(raw.fileno())
        return result

    return write_file(path, write)  # the one writer: a failed write is exit 2 naming the path
