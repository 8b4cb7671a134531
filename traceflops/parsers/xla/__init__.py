"""XLA profiles (XSpace `.xplane.pb`) → `Trace`: the names outside code uses, each imported from its module on first
use.

Why lazy: a decoder alone (`decode_xspace`, `decode_hlo_proto`) then loads without polars and
the Trace builders, as the separate decoder modules did before this package.

Modules, lowest first:
  wire (protobuf primitives, message budget) → xspace_model (the decoded XSpace) →
  xspace_python (the XSpace reader, `decode_xspace`);
  hlo_proto (HloProto reader) → hlo_facts (HLO dataflow and program analysis);
  kinds, events → builder (rows) → tpu, gpu (event builders) → scan (routes events) → parse (`Trace`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceflops.parsers.xla.hlo_facts import ModuleFacts, OpFacts, Programs
    from traceflops.parsers.xla.hlo_proto import decode_hlo_proto
    from traceflops.parsers.xla.parse import build_trace, parse_xplane
    from traceflops.parsers.xla.wire import MAX_MESSAGES_ENV
    from traceflops.parsers.xla.xspace_model import XSpace
    from traceflops.parsers.xla.xspace_python import decode_xspace

_EXPORTS = {
    "parse_xplane": "parse",
    "build_trace": "parse",
    "decode_xspace": "xspace_python",
    "decode_hlo_proto": "hlo_proto",
    "MAX_MESSAGES_ENV": "wire",
    "XSpace": "xspace_model",
    "ModuleFacts": "hlo_facts",
    "OpFacts": "hlo_facts",
    "Programs": "hlo_facts",
}

__all__ = [
    "MAX_MESSAGES_ENV",
    "ModuleFacts",
    "OpFacts",
    "Programs",
    "XSpace",
    "build_trace",
    "decode_hlo_proto",
    "decode_xspace",
    "parse_xplane",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
