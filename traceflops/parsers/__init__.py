"""Format detection: every parser ends at the `Trace` model."""

from __future__ import annotations

from pathlib import Path

from traceflops.core.errors import FormatError
from traceflops.core.trace import Trace


def detect_format(path: str) -> str:
    name = Path(path).name
    if name.endswith(".xplane.pb") or name.endswith(".pb"):
        return "xplane"
    if name.endswith((".json", ".json.gz", ".gz")):
        return "kineto"
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"\x1f\x8b" or head[:1] in (b"{", b"["):
        return "kineto"
    raise FormatError(path, "unknown trace format (expected a Kineto .json/.json.gz or an .xplane.pb)", "pass a PyTorch profiler or XLA profile file")


def load(path: str, cache_dir=None, progress=None) -> Trace:
    """Parse a trace; with a cache directory, reuse (or store) its parsed tables."""
    if cache_dir is not None and Path(path).is_file():
        from traceflops.storage import cache

        hit = cache.load(str(path), cache_dir)
        if hit is not None:
            return hit
        trace = _parse(path, progress)
        try:
            cache.store(str(path), trace, cache_dir)
        except OSError as e:
            trace.warnings.add(f"cache not written ({e.strerror})")
        return trace
    return _parse(path, progress)


def _parse(path: str, progress=None) -> Trace:
    fmt = detect_format(str(path))
    if fmt == "kineto":
        from traceflops.parsers.kineto import parse_kineto

        return parse_kineto(str(path), progress=progress)
    # --- xplane (XLA profiler XSpace) ---
    if fmt == "xplane":
        from traceflops.parsers.xplane import parse_xplane

        return parse_xplane(str(path))
    # --- end xplane ---
    raise FormatError(str(path), f"unsupported trace format '{fmt}'", "pass a PyTorch profiler or XLA profile file")
