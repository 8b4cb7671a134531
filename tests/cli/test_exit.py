"""How the `traceflops` command ends: its whole report on a pipe and its status, and quietly when the reader of its
output stops reading (`| head`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from traceflops.core.errors import EXIT_PIPE_CLOSED

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "fixtures" / "cpu" / "ns_ckpt_nonreentrant.json.gz"
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe's output as a shell gives it


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traceflops.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env=BUFFERED)


def test_the_whole_report_reaches_a_pipe():
    p = _cli("analyze", str(TRACE), "--no-cache", "--format", "json")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    report = orjson.loads(out)  # all of it: the process ended only once its output was written
    assert report["schema"].startswith("traceflops.report/")


def test_an_input_error_keeps_its_exit_code(tmp_path):
    p = _cli("analyze", str(tmp_path / "missing.json"), "--no-cache")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert err.decode().count("\n") == 1 and "missing.json" in err.decode()


@pytest.mark.parametrize("fmt", ["json", "terminal"])
def test_a_reader_that_stopped_ends_it_quietly(fmt):
    p = _cli("analyze", str(TRACE), "--no-cache", "--format", fmt)
    p.stdout.close()  # gone before the report is written: its first write meets a closed pipe
    err = p.stderr.read()
    p.wait(timeout=120)
    assert (p.returncode, err) == (EXIT_PIPE_CLOSED, b"")


def test_a_broken_pipe_elsewhere_is_still_an_internal_error(capsys):
    # Standard output still open: the pipe that broke was another (a worker's), which is a bug to report.
    from traceflops.cli.common import run_command
    from traceflops.core.errors import EXIT_INTERNAL

    def fails():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as stopped:
        run_command(False, fails)
    assert stopped.value.code == EXIT_INTERNAL
    assert "internal error: BrokenPipeError" in capsys.readouterr().err
