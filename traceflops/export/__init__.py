"""Traces written back for other tools, with what traceflops found: a layer above `report`, reading only `core` and
`parsers`.

It rewrites the user's own trace (the parser's streaming reader and event
rules), so it needs the parsers a renderer never sees; it renders nothing else.
`perfetto`: the annotated trace for Perfetto / chrome://tracing.
"""

from traceflops.export.perfetto import annotate, for_annotation

__all__ = ["annotate", "for_annotation"]
