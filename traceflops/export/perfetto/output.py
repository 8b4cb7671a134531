"""The one writer of an annotated trace: atomic, gzipped as it is written, or plain JSON to standard output.

The output is written atomically (a temporary file beside it, then a rename),
gzipped unless the name ends in plain `.json`, compressed as it is written;
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
    `tmp` is that file's path, for scratch files beside it.
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
                result = fill(cast(BinaryIO, f), tmp)  # a binary file; typeshed's GzipFile is no BinaryIO
        raw.flush()
        os.fsync(raw.fileno())
        return result

    return write_file(path, write)  # the one writer: a failed write is exit 2 naming the path
