"""Traces written back for other tools, with what traceflops found: a layer above `report`, reading only `core` and
`parsers`.

It rewrites the user's own trace (the parser's streaming reader and event
rules), so it needs the parsers a renderer never sees; it renders nothing else.
`perfetto`: the annotated trace for Perfetto / chrome://tracing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceflops.export.perfetto import annotate, for_annotation

__all__ = ["annotate", "for_annotation"]


def __getattr__(name: str) -> Any:
    """Loaded when first used (with polars), not with the package: see `perfetto.reader_start`."""
    if name in __all__:
        from traceflops.export import perfetto

        return getattr(perfetto, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
