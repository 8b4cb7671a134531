"""A path in, a `Trace` or an `Analysis` out: the parsed-trace cache consulted first, and filled after a parse."""

from __future__ import annotations

from pathlib import Path

from traceflops.core.results import Analysis, ModelOptions
from traceflops.core.trace import Trace
from traceflops.parsers import parse
from traceflops.pipeline import analyze_trace
from traceflops.storage import trace_cache


def load(path: str, cache_dir=None, progress=None) -> Trace:
    """Parse a trace; with a cache directory, reuse (or store) its parsed tables."""
    if cache_dir is None or not Path(path).is_file():
        return parse(path, progress)
    hit = trace_cache.load(str(path), cache_dir)
    if hit is not None:
        return hit
    trace = parse(path, progress)
    try:
        trace_cache.store(str(path), trace, cache_dir)
    except OSError as e:
        trace.warnings.add(f"cache not written ({e.strerror})")
    return trace


def analyze(path: str, options: ModelOptions | None = None, cache_dir=None, progress=None) -> Analysis:
    """`progress(done_bytes, total_bytes)` is called while a large file is read, and `progress.stage(name)` (if it
    has one) as each group of analysis stages starts."""
    return analyze_trace(load(path, cache_dir, progress), options or ModelOptions(), getattr(progress, "stage", None))
