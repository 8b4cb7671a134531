"""traceflops: MFU, HFU, recompute and where the time went, from profiler traces.

In a notebook:

    import traceflops
    a = traceflops.analyze("trace.json.gz", hardware="h100-sxm")   # an Analysis: shows as a short summary
    job = traceflops.analyze_job("traces/", jobs=4)                  # a Job across ranks
    d = traceflops.diff("before.json.gz", "after.json.gz")          # what moved (a dict, traceflops.diff/1)
    a.to_pandas().kernels                                           # every table, by name (Frames)
"""

from traceflops.core import hooks as _hooks
from traceflops.core.version import VERSION as __version__  # noqa: F401 - the package's public version

# The notebook API (`traceflops.api`), loaded on first use so `traceflops --help` stays fast.
__all__ = ["Frames", "analyze", "analyze_job", "diff", "save_html", "to_dict", "to_html", "to_pandas", "to_polars"]


def __getattr__(name):
    """`traceflops.analyze(path, ...)` and the rest of `__all__`, from `traceflops.api` on first use."""
    if name in __all__:
        from traceflops import api

        return getattr(api, name)
    raise AttributeError(f"module 'traceflops' has no attribute {name!r}")


def __dir__():
    """What a notebook's completion offers: the API's names beside the module's own."""
    return sorted({*globals(), *__all__})


def _notebook(name: str):
    """A function of the notebook API or the notebook card, imported when first called (core calls it by name)."""

    def call(value):
        if name == "html_card":
            from traceflops.report.notebook import card

            return card(value)
        from traceflops import api

        return getattr(api, name)(value)

    return call


_hooks.NOTEBOOK.update({n: _notebook(n) for n in ("to_html", "to_dict", "to_pandas", "html_card")})
