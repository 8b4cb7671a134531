"""A path in, a `Trace` or an `Analysis` out: the parsed-trace cache consulted first, and filled after a parse."""

from __future__ import annotations

from pathlib import Path

from traceflops.core.results import Analysis, ModelOptions
from traceflops.core.trace import Trace
from traceflops.parsers import parse
from traceflops.pipeline import analyze_trace
from traceflops.run.inputs import CAPTURE_DIR
from traceflops.stages.replays import replays_graphs
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
        trace.warnings.add(
            f"{trace_cache.NOT_WRITTEN} ({e.strerror})"
        )  # this run's only: never kept, retried next time
    return trace


def analyze(
    path: str, options: ModelOptions | None = None, cache_dir=None, progress=None, views: bool = True
) -> Analysis:
    """`progress(done_bytes, total_bytes)` is called while a large file is read, and `progress.stage(name)` (if it
    has one) as each group of analysis stages starts. Graph captures named in the options, or written beside the
    trace (`capture_traces/`, as vLLM and SGLang do), are read too: they say what a graph replay ran. `views`: see
    `pipeline.analyze_trace`."""
    options = options or ModelOptions()
    trace = load(path, cache_dir, progress)
    captures = [load(p, cache_dir) for p in capture_paths(path, options)] if replays_graphs(trace) else []
    return analyze_trace(trace, options, getattr(progress, "stage", None), captures, views)


def capture_paths(path: str, options: ModelOptions) -> list[str]:
    """The capture traces to read: those given, else the Kineto traces in `capture_traces/` beside the trace."""
    if options.graph_captures:
        return [str(p) for given in options.graph_captures for p in _traces_in(Path(given))]
    beside = Path(path).parent / CAPTURE_DIR
    return [str(p) for p in _traces_in(beside)] if beside.is_dir() else []


def _traces_in(p: Path) -> list[Path]:
    if not p.is_dir():
        return [p]
    return sorted(
        q
        for q in p.iterdir()
        if q.is_file()
        and (q.name.endswith(".json") or q.name.endswith(".json.gz"))
        and q.name != "execution_details.json"
    )
