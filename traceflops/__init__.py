"""traceflops: MFU, HFU, recompute and where the time went, from profiler traces."""

__version__ = "0.1.0"
