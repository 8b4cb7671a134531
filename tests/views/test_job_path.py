"""The critical path across ranks: a collective's time on a rank's path split into waiting for the last rank and the transfer.

The RANKS job of tests/builders.py, by construction (true time, per step): every rank runs a GEMM from 50 µs, rank 2
for 700 µs and the others for 400 µs, then an all-reduce that starts 10 µs after its GEMM ends and ends at 900 µs on
every rank. So the last rank arrives at 760 µs: a fast rank's all-reduce (460..900) waits 300 µs and transfers 140 µs;
rank 2's (760..900) waits 0 and transfers 140. Each rank's clock is off by a known offset, removed by alignment.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.builders import RANKS, rank_traces
from traceflops.cli.main import main


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("ranks")
    rank_traces(d)
    # the late rank shows in the last step (the first one's path runs on the host): counted with --keep-last-step
    r = CliRunner().invoke(main, ["analyze", str(d), "--format", "json", "--no-cache", "--quiet", "--keep-last-step"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_late_rank_makes_the_others_wait_on_their_path(job):
    last = {s["rank"]: s["critical_path_us"] for s in job["steps"] if s["step"] == 1}  # the last step: its window ends at 900
    for rank, path in last.items():
        gemm = 700.0 if rank == RANKS.SLOW else 400.0
        wait = 0.0 if rank == RANKS.SLOW else 300.0
        assert path["device_matmul"] == pytest.approx(gemm)
        assert path["sync"] == pytest.approx(10.0)  # the all-reduce's stream waits for the GEMM's
        assert path["communication"] == pytest.approx(wait + 140.0)
        assert path["communication_waiting"] == pytest.approx(wait, abs=1e-6)
        assert path["communication_transfer"] == pytest.approx(140.0)


def test_the_job_step_carries_the_slowest_ranks_path(job):
    step = next(s for s in job["job_steps"] if s["step"] == 1)
    assert sum(v for k, v in step["critical_path_us"].items() if not k.startswith("communication_")) == pytest.approx(step["dur_us"])


def test_the_job_says_to_look_at_the_late_rank(job):
    late = next(x for x in job["advice"] if x["kind"] == "late_rank")
    # Waiting on the paths: 3 fast ranks × 300 µs in the last step (the first step's path runs on the host) over
    # the ranks' summed windows, 4 × (1000 + 850) µs.
    assert late["share"] == pytest.approx(900.0 / (4 * 1850.0))
    assert any("rank 2 arrived last" in e for e in late["evidence"])
    per_rank = [x for x in job["advice"] if "ranks" in (x.get("data") or {})]
    assert per_rank and all(x["data"]["ranks"] == [0, 1, 2, 3] for x in per_rank)


def test_the_job_terminal_report_shows_the_jobs_own_advice(tmp_path):
    rank_traces(tmp_path)
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache", "--quiet", "--keep-last-step"])
    assert r.exit_code == 0, r.stderr
    assert "What to try for the job" in r.stdout and "Ranks wait for a late rank" in r.stdout
    assert "rank 2 arrived last" in r.stdout
