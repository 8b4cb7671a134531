"""A job's rank worker (this module run on its own, `core.frames.own_module_command`): ranks in, their packed
summaries out.

A process of its own, not multiprocessing's spawn: it never re-runs the
caller's script (a script that starts a job needs no `if __name__ ==
"__main__":` guard) and needs no resource-tracker process beside it (a
Python process more in every job's memory). A request is a rank's
`(path, options, cache folder)`, a reply its packed summary, its
NotATraceError, or the error that stopped it; each a pickled frame
(`core.frames`) on a pipe between this package's own two processes.
"""

from __future__ import annotations

import pickle
from typing import BinaryIO

from traceflops.core.frames import read_frame, run_worker, write_reply


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Rank after rank until the input ends."""
    from traceflops.run.ranks import attempt_packed  # polars loads here, in the environment the job set

    while (request := read_frame(inp)) is not None:
        try:
            reply = attempt_packed(pickle.loads(request))
        except Exception as e:  # the job's own process raises it, as it would its own
            reply = e
        write_reply(out, reply)


if __name__ == "__main__":
    run_worker(serve)
