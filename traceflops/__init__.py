"""traceflops: MFU, HFU, recompute and where the time went, from profiler traces."""

from traceflops.core.version import VERSION as __version__  # noqa: F401 - the package's public version


def __getattr__(name):
    """`traceflops.analyze(path, ...)` for notebooks, loaded on first use (keeps `--help` fast)."""
    if name in ("analyze", "analyze_job", "to_html", "to_pandas", "to_polars", "to_dict", "save_html"):
        from traceflops import api

        return getattr(api, name)
    raise AttributeError(name)
