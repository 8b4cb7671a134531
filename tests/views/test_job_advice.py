"""The job's "what to try" in two ranked sections, and the late ranks' counterfactual, on the RANKS job of
tests/builders.py.

By construction (true time, per step): every rank runs a GEMM from 50 µs, rank RANKS.SLOW for 400 + LATE µs and the
others for 400 µs, then an all-reduce that starts 10 µs after its GEMM ends and ends at 900 µs on every rank. Steps
start 1000 µs apart; the last one ends at its last device activity (the all-reduce's end, 900 µs, from its first at
50 µs). So at each step's all-reduce three ranks arrive at 460 µs and the late one at 460 + LATE: the median rank's
arrival is 460 µs, and the late rank holds the step LATE µs beyond it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from html import escape

import pytest
from click.testing import CliRunner

from tests.builders import RANKS, rank_traces
from traceflops.cli.main import main
from traceflops.core.sections import RankAdvice
from traceflops.run.load import analyze
from traceflops.views.job import job_view, summarize
from traceflops.views.job_advice import FLOOR, JOB_UNIT, RANK_UNIT

MM = 2 * RANKS.M * RANKS.N * RANKS.K  # each rank's one GEMM per step
PEAK = 989.4e12  # the H100's dense bf16 peak the traces' device gets
WINDOWS = (1000.0, 900.0 - 50.0)  # step 0: to the next step; step 1 (the last, kept): first to last device activity


def job_of(tmp_path, late_us: float):
    # the late rank shows on the paths in the last step (the first one's path runs on the host): kept
    return job_view([summarize(analyze(p)) for p in rank_traces(tmp_path, late_us=late_us)], keep_last_step=True)


@pytest.mark.parametrize("late_us", [RANKS.LATE, 200.0])
def test_the_job_at_the_median_ranks_pace(tmp_path, late_us):
    job = job_of(tmp_path, late_us)
    item = next(x for x in job.advice if x.kind == "late_rank")
    steps = len(WINDOWS)
    wall = sum(WINDOWS)
    after = wall - steps * late_us  # each step loses what the late rank held it beyond the median rank's arrival
    model = RANKS.WORLD * MM  # per step: the trace's forward matmul FLOPs, summed over ranks
    mfu = steps * model / (wall * 1e-6 * PEAK * RANKS.WORLD)
    assert job.totals.mfu == pytest.approx(mfu, rel=1e-9)
    assert item.step_time_us == pytest.approx(wall / steps)
    assert item.step_time_after_us == pytest.approx(after / steps)
    assert item.mfu_after == pytest.approx(steps * model / (after * 1e-6 * PEAK * RANKS.WORLD), rel=1e-9)
    assert item.bound and "upper bound" in item.bound and "median rank" in item.bound
    # its share: the fast ranks' paths waited late_us in the last step, over the ranks' summed windows
    assert item.share == pytest.approx((RANKS.WORLD - 1) * late_us / (RANKS.WORLD * wall))


def test_two_sections_each_biggest_first_above_the_floor(tmp_path):
    job = job_of(tmp_path, RANKS.LATE)
    scopes = [x.scope for x in job.advice]
    assert scopes == sorted(scopes, key=["job", "rank"].index) and set(scopes) == {"job", "rank"}
    for scope, unit in (("job", JOB_UNIT), ("rank", RANK_UNIT)):
        items = [x for x in job.advice if x.scope == scope]
        assert {x.unit for x in items} == {unit}  # one denominator per section
        shares = [x.share for x in items]
        assert shares == sorted(shares, reverse=True) and min(shares) >= FLOOR
    assert all(x.rank is None for x in job.advice if x.scope == "job")
    # a rank's item sits on the rank where its share is largest: the matmuls run longest on the late rank
    # ((400 + LATE) µs of its 1000 µs first step), below peak there
    below = next(x for x in job.advice if x.scope == "rank" and x.kind == "matmul_below_peak")
    assert below.rank == RANKS.SLOW
    assert below.share == max(below.data["shares"].values())
    assert below.data["ranks"] == list(range(RANKS.WORLD))


def test_items_below_the_floor_are_left_out(tmp_path):
    summaries = [summarize(analyze(p)) for p in rank_traces(tmp_path)]
    small = RankAdvice(kind="idle", title="A small thing", share=FLOOR / 2, recoverable=FLOOR / 2, term="idle")
    big = RankAdvice(kind="idle", title="A big thing", share=0.5, recoverable=0.5, term="idle")
    summaries = [replace(s, advice=[small, big]) if s.rank == 1 else replace(s, advice=[]) for s in summaries]
    job = job_view(summaries, keep_last_step=True)
    titles = [x.title for x in job.advice if x.scope == "rank"]
    assert titles == ["A big thing"]
    assert next(x for x in job.advice if x.scope == "rank").rank == 1


def test_the_reports_show_both_sections_with_their_denominators_once(tmp_path):
    rank_traces(tmp_path)
    page = tmp_path / "job.html"
    run = lambda *a: CliRunner().invoke(main, ["analyze", str(tmp_path), "--no-cache", "--quiet", "--keep-last-step", *a])
    js = run("--format", "json")
    assert js.exit_code == 0, js.stderr
    advice = json.loads(js.stdout)["advice"]
    assert [x["scope"] for x in advice][0] == "job" and advice[-1]["scope"] == "rank"
    late = next(x for x in advice if x["kind"] == "late_rank")
    assert {"step_time_us", "step_time_after_us", "mfu_after", "bound"} <= set(late)
    assert all("step_time_after_us" not in x for x in advice if x["kind"] != "late_rank")
    term = run("--html", str(page))
    assert term.exit_code == 0, term.stderr
    out = term.stdout
    assert out.count(JOB_UNIT) == 1 and out.count(RANK_UNIT) == 1  # said once, in each section's head
    assert out.index("What to try for the job") < out.index("What to try on the worst ranks")
    assert "if the late ranks ran at the median rank's pace: MFU" in out and "→ ≤" in out
    html = page.read_text()
    assert html.count(f"Shares {escape(JOB_UNIT)}") == 1 and html.count(f"Shares {escape(RANK_UNIT)}") == 1
    assert html.index('data-scope="job"') < html.index('data-scope="rank"')
    assert "If the late ranks ran at the median rank's pace: MFU" in html


def test_expert_imbalance_on_the_jobs_denominator(tmp_path):
    import polars as pl

    from traceflops.core.sections import replace as changed
    from traceflops.views.experts import imbalance_advice
    from traceflops.views.job_advice import on_job_time

    summaries = [summarize(analyze(p)) for p in rank_traces(tmp_path)]
    busiest, ratio, matmul_us, expert, executed = 1, 1.6, 800.0, 3.0e9, 4.0e9
    s = next(s for s in summaries if s.rank == busiest)
    t = changed(
        s.totals,
        expert_flops={"executed": int(expert)},
        flops={**s.totals.flops, "executed": int(executed)},
        time_us={**s.totals.time_us, "matmul": matmul_us},
    )
    summaries = [replace(x, totals=t) if x.rank == busiest else x for x in summaries]
    experts = pl.DataFrame(
        {
            "rank": [0, 1, 2, 3],
            "ep_group": ["[0,1]", "[0,1]", "[2,3]", "[2,3]"],
            "expert_flops_per_step": [1.0, ratio, 1.0, 1.0],
            "flops_vs_group_mean": [2 - ratio, ratio, 1.0, 1.0],
            "a2a_bytes_per_step": [1.0, 1.0, 1.0, 1.0],
        }
    )
    window = 4 * 1000.0
    item = on_job_time(imbalance_advice(experts), summaries, experts, window)
    # an even split saves 1 - 1/ratio of the busiest rank's expert time (its matmul time × its expert share of FLOPs),
    # on each of its EP group's 2 ranks
    excess = matmul_us * expert / executed * (1 - 1 / ratio)
    assert item["share"] == pytest.approx(excess * 2 / window)
    assert item["unit"] == JOB_UNIT and item["data"]["share_of_expert_time"] == pytest.approx(1 - 1 / ratio)
