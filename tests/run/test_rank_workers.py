"""A job's rank worker processes: started on their own (no re-run of the caller's script, no resource tracker beside
them), the same job report as one process gives, and gone once the job is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "fixtures" / "dist" / "ddp"

# Run as a file, so it is its own `__main__`, without the guard multiprocessing's spawn needed (it re-ran the script
# in each worker). A thread notes every process under it while the job runs.
SCRIPT = """
import json, os, pathlib, threading, time
import psutil
import traceflops

me, seen = psutil.Process(os.getpid()), set()
mine = " ".join(me.cmdline())  # a child between its fork and its exec still shows this

def watch():
    while True:
        for c in me.children(recursive=True):
            try:
                line = " ".join(c.cmdline())
                if line != mine:
                    seen.add(line)
            except psutil.Error:
                pass
        time.sleep(0.005)

threading.Thread(target=watch, daemon=True).start()
job = traceflops.analyze_job(sorted(str(p) for p in pathlib.Path({ddp!r}).glob("*.json.gz")), jobs={jobs})
left = [" ".join(c.cmdline()) for c in me.children(recursive=True)]
print(json.dumps({{"totals": repr(job.totals), "seen": sorted(seen), "left": left}}))
"""


def _job(jobs: int, tmp_path: Path, cwd: Path = ROOT) -> dict:
    path = tmp_path / f"job_{jobs}.py"
    path.write_text(SCRIPT.format(ddp=str(DDP), jobs=jobs))
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=cwd, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_script_without_a_main_guard_runs_a_job_on_workers_alone(tmp_path):
    one, two = _job(1, tmp_path), _job(2, tmp_path)
    assert two["totals"] == one["totals"]
    assert one["seen"] == []  # one job: no process started
    assert two["seen"] and all("traceflops.run.rank_worker" in c for c in two["seen"]), two["seen"]  # no tracker
    assert two["left"] == []


def test_workers_import_this_traceflops_whatever_the_folder_holds(tmp_path):
    """Run from a folder holding another `traceflops` (a checkout of another version): the workers still run this one
    (`python -m` would have imported the folder's)."""
    other = tmp_path / "other"
    (other / "traceflops").mkdir(parents=True)
    (other / "traceflops" / "__init__.py").write_text('raise ImportError("the folder\'s traceflops")\n')
    (tmp_path / "script").mkdir()
    got = _job(2, tmp_path / "script", cwd=other)
    assert got["totals"] == _job(1, tmp_path / "script")["totals"]
    assert got["seen"]
