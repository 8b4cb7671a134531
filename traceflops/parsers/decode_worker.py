"""The decode helper process (`python -m traceflops.parsers.decode_worker`): Kineto event arrays in, tables out."""

import os
import sys

from traceflops.core.process_exit import leave
from traceflops.parsers.helper import serve
from traceflops.parsers.kineto import decode_counted

if __name__ == "__main__":
    # Replies own the real stdout; anything else printed goes to stderr.
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, reply, decode_counted)
    reply.flush()
    leave(0)  # no teardown on a core the command is still using
