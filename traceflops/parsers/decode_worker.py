"""The decode helper process (`python -m traceflops.parsers.decode_worker`): Kineto event arrays in, tables out."""

from traceflops.core.frames import run_worker
from traceflops.parsers.helper import serve
from traceflops.parsers.kineto import decode_counted

if __name__ == "__main__":
    # As every worker of this package runs: replies on the real stdout, Ctrl-C left to the command, no teardown.
    run_worker(lambda requests, replies: serve(requests, replies, decode_counted))
