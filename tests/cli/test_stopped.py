"""A command stopped by SIGTERM (`kill`, `timeout`, a batch scheduler) or Ctrl-C: one line, the shell's exit code
(128 + the signal), and nothing left behind: no half-written output, no worker process of a job."""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pytest

from traceflops.core.errors import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "fixtures" / "cpu" / "ns_ckpt_nonreentrant.json.gz"
STOPS = [(signal.SIGTERM, EXIT_TERMINATED, "traceflops: terminated (SIGTERM)"),
         (signal.SIGINT, EXIT_INTERRUPTED, "traceflops: interrupted (Ctrl-C)")]


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "traceflops.cli", *map(str, args), "--quiet", "--no-cache"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(found, proc: subprocess.Popen, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (got := found()):
        assert proc.poll() is None, f"ended before {what}: {proc.stderr.read()}"
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} after {timeout} s")
        time.sleep(0.01)
    return got


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    """The job's rank worker processes."""
    found = []
    for c in parent.children(recursive=True):
        try:
            if "traceflops.run.rank_worker" in " ".join(c.cmdline()):
                found.append(c)
        except psutil.Error:  # gone already
            pass
    return found


def _stopped(proc: subprocess.Popen, sig: int, timeout: float = 30.0) -> tuple[int, str, float]:
    t = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:  # a command that ignored the signal is not left running after the test
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    return proc.returncode, err, time.monotonic() - t


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    """The CPU fixture eight times over, one copy after another in time (39 MB): a second or more to write annotated."""
    trace = orjson.loads(gzip.decompress(TRACE.read_bytes()))
    timed = [e for e in trace["traceEvents"] if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed) + 1
    trace["traceEvents"] = [{**e, "ts": e["ts"] + k * span} if k and isinstance(e.get("ts"), (int, float)) else e
                            for k in range(8) for e in trace["traceEvents"]]
    path = tmp_path_factory.mktemp("long") / "long.json"
    path.write_bytes(orjson.dumps(trace))
    return path


@pytest.mark.parametrize("sig, code, line", STOPS, ids=["SIGTERM", "SIGINT"])
def test_a_stopped_annotate_leaves_no_temporary_output(tmp_path, long_trace, sig, code, line):
    """Stopped while it writes: neither the output nor its temporary file is left."""
    out = tmp_path / "annotated.json.gz"
    proc = _start("annotate", long_trace, "-o", out)
    _wait_for(lambda: list(tmp_path.glob(".annotated.json.gz.*")), proc, "temporary output")
    rc, err, _ = _stopped(proc, sig)
    assert (rc, err.strip()) == (code, line)
    assert list(tmp_path.iterdir()) == []


def _running_job(tmp_path: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """A job of 120 ranks (the CPU fixture again and again, several seconds of work) on --jobs 2, its worker started."""
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(120):
        (folder / f"rank{r}.json.gz").symlink_to(TRACE)
    proc = _start("analyze", folder, "--format", "json", "--jobs", "2")
    parent = psutil.Process(proc.pid)
    return proc, _wait_for(lambda: _workers(parent), proc, "job workers")


@pytest.mark.parametrize("sig, code, line", STOPS, ids=["SIGTERM", "SIGINT"])
def test_a_stopped_job_stops_its_workers_at_once(tmp_path, sig, code, line):
    """It ends within seconds, its queued ranks dropped."""
    proc, workers = _running_job(tmp_path)
    time.sleep(0.5)  # this process and the worker at a rank each
    rc, err, took = _stopped(proc, sig)
    assert (rc, err.strip()) == (code, line)
    assert took < 5.0, took
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == []


def test_a_job_whose_worker_is_killed_says_so_in_one_line(tmp_path):
    """A worker killed under the job (the kernel's OOM killer, a `kill -9`): exit 2 and one line, not a traceback."""
    proc, workers = _running_job(tmp_path)
    time.sleep(0.5)
    workers[0].kill()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_INPUT, err
    assert len(err.strip().splitlines()) == 1 and "worker process of the job ended" in err and "Traceback" not in err, err
