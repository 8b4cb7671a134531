"""Whether `annotate` reads a Kineto trace in a process of its own beside the analysis (`stream.start_reading`),
decided before polars loads: the command's own process then leaves that core to the reader (polars on one thread
fewer: two threads beside the reader on two cores only contended). Imports nothing heavy.
"""

from __future__ import annotations

from traceflops.core.errors import TraceflopsError
from traceflops.core.frames import spare_cores, switch
from traceflops.parsers import detect_format

ENV = "TRACEFLOPS_ANNOTATE_WORKER"  # 0: read the input in this process, after the analysis; unset or 1: beside it


def reads_beside(trace_path: str) -> bool:
    """A Kineto trace, read beside the analysis where a core is spare for it (`ENV` decides if set); an XLA profile, or
    a file the analysis will refuse, is not."""
    try:
        if detect_format(trace_path) != "kineto":
            return False
    except TraceflopsError:  # the analysis names what is wrong with the file
        return False
    forced = switch(ENV)
    return spare_cores() >= 2 if forced is None else forced
