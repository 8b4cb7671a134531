"""File → `Trace`: the format detected, then its parser. Every parser ends at the `Trace` model; nothing here caches or
analyses.

The one place names enter the model: `parse` returns the trace redacted (`core.redact.redact_trace`), so no
secret in an event's name, label, recorded input or category reaches a report, a summary or the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traceflops.core.errors import FormatError, NotATraceError
from traceflops.parsers.io import GZIP_MAGIC, open_trace

if TYPE_CHECKING:  # polars loads with the parser that is used, not with this package (see helper_start)
    from traceflops.core.trace import Trace


def detect_format(path: str) -> str:
    name = Path(path).name
    if name.endswith((".xplane.pb", ".pb", ".xplane.pb.gz", ".pb.gz")):
        return "xplane"
    if name.endswith((".json", ".json.gz", ".gz")):
        return "kineto"
    with open_trace(path) as f:  # a FIFO or a device is an InputError here, never a blocked read
        head = f.read(2)
    if head == GZIP_MAGIC or head[:1] in (b"{", b"["):
        return "kineto"
    raise NotATraceError(
        path,
        "unknown trace format (expected a Kineto .json/.json.gz or an .xplane.pb)",
        "pass a PyTorch profiler or XLA profile file",
    )


def parse(path: str, progress=None) -> Trace:
    """The file's `Trace`, by its detected format; `progress(done_bytes, total_bytes)` while a large file is read."""
    fmt = detect_format(str(path))
    if fmt == "kineto":
        from traceflops.core.redact import redact_trace
        from traceflops.parsers.kineto import parse_kineto

        return redact_trace(parse_kineto(str(path), progress=progress))
    if fmt == "xplane":
        from traceflops.core.redact import redact_trace
        from traceflops.parsers.xla import parse_xplane

        return redact_trace(parse_xplane(str(path)))
    raise FormatError(str(path), f"unsupported trace format '{fmt}'", "pass a PyTorch profiler or XLA profile file")
