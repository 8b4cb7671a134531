"""Decoding a serialized XSpace: the protobuf runtime (upb) when it is installed, else the pure-Python reader.

Why apart: the one place the decoder is chosen (argument, TRACEFLOPS_XPLANE_DECODER, what is installed).
"""

from __future__ import annotations

import os

from traceflops.parsers.xla import xspace_pb
from traceflops.parsers.xla.xspace_model import XSpace
from traceflops.parsers.xla.xspace_python import decode_xspace_python


def decode_xspace(buf: bytes, path: str | None = None, *, backend: str | None = None) -> XSpace:
    """Decode a serialized XSpace; raises FormatError on malformed input.

    backend: 'protobuf' (the upb runtime, about twice as fast; see `xspace_pb`),
    'python' (this module's reader), or None = protobuf when installed, else python.
    The environment variable TRACEFLOPS_XPLANE_DECODER sets the default.
    """
    backend = backend or os.environ.get("TRACEFLOPS_XPLANE_DECODER") or "auto"
    if backend in ("auto", "protobuf"):
        if xspace_pb.available():
            return xspace_pb.decode_xspace(buf, path)
        if backend == "protobuf":
            raise ImportError("the protobuf runtime (upb) is not installed: pip install protobuf")
    return decode_xspace_python(buf, path)
