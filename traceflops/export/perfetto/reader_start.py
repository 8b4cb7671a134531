"""Whether `annotate` reads a Kineto trace in a process of its own beside the analysis, decided before polars loads
(the command's own process then leaves that core to the reader: polars on one thread fewer, two threads beside the
reader on two cores only contended), and the reader started (`start_reading`) before the command loads what the
analysis needs. Imports nothing heavy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from traceflops.core.errors import TraceflopsError
from traceflops.core.frames import spare_cores, switch
from traceflops.export.perfetto.output import STDOUT
from traceflops.parsers import detect_format

if TYPE_CHECKING:
    from traceflops.export.perfetto.prepare_worker import Beside

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


def start_reading(trace_path: str, out_path: str) -> Beside | None:
    """The input read beside the analysis, in a worker process (where `reads_beside` says so); None where the spool's
    folder cannot be written (`annotate` then reads the input itself and names the problem as it always does).

    Loads no polars here: the command starts the reader first, so the worker's own start (~0.3 s of imports) runs
    while the command loads the analysis, not after it."""
    folder = tempfile.gettempdir() if str(out_path) == STDOUT else str(Path(out_path).resolve().parent)
    from traceflops.export.perfetto.prepare_worker import Beside

    try:
        return Beside(trace_path, folder)
    except OSError:
        return None
