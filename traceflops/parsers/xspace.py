"""Decoding a serialized XSpace: the protobuf runtime (upb) when it is installed, else the pure-Python reader."""

from __future__ import annotations

import os

from traceflops.parsers import xplane_pb
from traceflops.parsers.xplane_proto import XSpace, decode_xspace_python


def decode_xspace(buf: bytes, path: str | None = None, *, backend: str | None = None) -> XSpace:
    """Decode a serialized XSpace; raises FormatError on malformed input.

    backend: 'protobuf' (the upb runtime, about twice as fast; see `xplane_pb`),
    'python' (this module's reader), or None = protobuf when installed, else python.
    The environment variable TRACEFLOPS_XPLANE_DECODER sets the default.
    """
    backend = backend or os.environ.get("TRACEFLOPS_XPLANE_DECODER") or "auto"
    if backend in ("auto", "protobuf"):
        if xplane_pb.available():
            return xplane_pb.decode_xspace(buf, path)
        if backend == "protobuf":
            raise ImportError("the protobuf runtime (upb) is not installed: pip install protobuf")
    return decode_xspace_python(buf, path)
