"""traceflops: MFU, HFU, recompute and where the time went, from profiler traces."""

__version__ = "0.1.0"


def __getattr__(name):
    """`traceflops.analyze(path, ...)` for notebooks, loaded on first use (keeps `--help` fast)."""
    if name in ("analyze", "analyze_job", "to_html", "to_pandas", "to_polars", "to_dict", "save_html"):
        from traceflops import api

        return getattr(api, name)
    raise AttributeError(name)
