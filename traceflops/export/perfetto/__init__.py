"""The user's own trace written back for Perfetto / chrome://tracing, with phases, FLOPs and counters; one job per
module.

`annotate(trace_path, analysis, out_path)` keeps every input event, adds
`traceflops.*` args to device activities and ops, and adds a "traceflops"
process of tracks and counters; secrets are redacted in all it writes.

* `stream`: the Kineto trace written back, its entries given their args (`annotate`, `for_annotation`);
* `prepare`: the input read into a spool, numbered and redacted, each entry's place for its args marked (no analysis
  needed: `prepare_worker` runs it in a process beside the analysis);
* `entries`: its entries numbered as the parser numbers them, checked against the analysis, decoded where they must be;
* `added`: the args added to a device activity or an op, as JSON text, spliced into the entry's own bytes;
* `tracks`: the added "traceflops" process (phase tracks, steps, critical path, counters);
* `xla`: the trace written for an XLA profile, which has no JSON of its own;
* `redact`: the secrets rules over what is written, and the `traceflops` record;
* `output`: the one writer (atomic, gzipped or plain, or standard output);
* `reader_start`: whether the input is read beside the analysis, decided and started before polars loads
  (`start_reading`).

The names below load their modules (and polars) when first used, so `reader_start` can be imported first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceflops.export.perfetto.entries import numbering
    from traceflops.export.perfetto.reader_start import start_reading
    from traceflops.export.perfetto.stream import annotate, for_annotation

__all__ = ["annotate", "for_annotation", "numbering", "start_reading"]


def __getattr__(name: str) -> Any:
    if name == "numbering":
        from traceflops.export.perfetto.entries import numbering

        return numbering
    if name == "start_reading":
        from traceflops.export.perfetto.reader_start import start_reading

        return start_reading
    if name in ("annotate", "for_annotation"):
        from traceflops.export.perfetto import stream

        return getattr(stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
