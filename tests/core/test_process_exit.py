"""`leave`: a process ends as Python would end it (exit functions run, output flushed, threads waited for, the same
status), without the teardown that frees every object and module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Output to a pipe block-buffered, as a user's shell gives it (unbuffered, nothing would be left to flush).
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          cwd=ROOT, env=BUFFERED, timeout=60)


def test_exit_functions_run_and_buffered_output_is_flushed_with_the_status():
    r = _python("""
        import atexit, sys
        from traceflops.core.process_exit import leave
        atexit.register(lambda: sys.stdout.write("bye"))
        sys.stdout.write("hi ")  # a pipe: block-buffered, lost if not flushed before the process ends
        sys.stderr.write("err ")
        leave(3)
        """)
    assert (r.returncode, r.stdout, r.stderr) == (3, "hi bye", "err ")


def test_the_teardown_is_skipped():
    # An object freed at teardown says so; Python's own exit frees it, `leave` does not.
    code = """
        import sys
        from traceflops.core.process_exit import leave
        class Loud:
            def __del__(self):
                sys.stdout.write("freed")
                sys.stdout.flush()
        kept = Loud()
        {}
        """
    assert _python(code.format("sys.exit(0)")).stdout == "freed"  # the check itself can see a teardown
    r = _python(code.format("leave(0)"))
    assert (r.returncode, r.stdout) == (0, "")


def test_a_running_thread_is_waited_for(tmp_path):
    done = tmp_path / "done"
    r = _python("""
        import sys, threading, time
        from traceflops.core.process_exit import leave
        def late():
            time.sleep(0.3)
            open(sys.argv[1], "w").write("written")
        threading.Thread(target=late).start()
        leave(0)
        """, str(done))
    assert r.returncode == 0
    assert done.read_text() == "written"


def test_a_message_or_none_exits_as_python_does():
    r = _python("from traceflops.core.process_exit import leave\nleave('no trace given')")
    assert (r.returncode, r.stderr.strip()) == (1, "no trace given")
    assert _python("from traceflops.core.process_exit import leave\nleave(None)").returncode == 0
