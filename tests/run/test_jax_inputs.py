"""Inputs as JAX users have them: a `jax.profiler.trace` log directory and a gzipped xplane give the bare xplane's report."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

from tests.builders import CPU, FIXTURES

PROFILE = FIXTURES / "jax" / "remat_block1.xplane.pb"


def report(path) -> dict:
    r = subprocess.run([sys.executable, "-m", "traceflops.cli", "analyze", str(path), "--format", "json", "--no-cache"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "traceflops.report/1", d.get("schema")  # one trace's report, not a job's
    for row in (*d["inputs"], *d["ranks"]):  # the only place the file's name shows
        row.pop("path")
    return d


def test_a_log_directory_and_a_gzipped_xplane_give_the_bare_report(tmp_path):
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_12_01_10_00_00"
    run.mkdir(parents=True)
    shutil.copy(PROFILE, run / "host0.xplane.pb")
    shutil.copy(CPU / "ns_eager_sdpa.json.gz", run / "host0.trace.json.gz")  # what jax writes beside it: not a second rank
    gz = tmp_path / "host0.xplane.pb.gz"
    gz.write_bytes(gzip.compress(PROFILE.read_bytes()))
    bare = report(PROFILE)
    assert report(tmp_path / "logs") == bare
    assert report(gz) == bare
