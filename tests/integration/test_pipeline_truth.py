"""Pipeline parallelism on CPU jobs built with `torch.distributed.pipelining`, against the generator's truth.

`fixtures/generate_dist.py` made four gloo jobs (fixtures/dist/README.md, "Pipeline parallelism"):
ScheduleGPipe and Schedule1F1B over 2 and 4 stages (one rank per stage), 4 micro-batches. Truth: each
stage's P2P from the schedule's own calls (which sends and receives, to which peer, forward activation or
backward gradient, in order), checked against the schedule's definition. The bubble is checked against the
time each rank's thread was blocked in its receives with no compute running, computed here from the raw
trace events.
"""

import collections
import functools
import gzip
import json

import numpy as np
import polars as pl
import pytest

from tests.builders import FIXTURES

DIST = FIXTURES / "dist"
TRUTH_PATH = DIST / "truth.json"
CASES = ("pp_gpipe_2", "pp_1f1b_2", "pp_gpipe_4", "pp_1f1b_4")


@functools.cache
def truth_of(case):
    if not TRUTH_PATH.exists():
        pytest.skip(f"{TRUTH_PATH} absent: run `python fixtures/generate_dist.py --only {case}`")
    t = json.loads(TRUTH_PATH.read_text())
    if case not in t or not all((DIST / f).exists() for f in t[case]["files"].values()):
        pytest.skip(f"{case} not generated: run `python fixtures/generate_dist.py --only {case}`")
    return t[case]


def paths(case):
    t = truth_of(case)
    return [str(DIST / t["files"][str(r)]) for r in range(t["world_size"])]


@functools.cache
def job(case, **flags):
    from traceflops.api import analyze_job

    return analyze_job(paths(case), **flags)


def rows(case):
    """The pipeline rows by (rank, step)."""
    return {(r["rank"], r["step"]): r for r in job(case).pipeline.iter_rows(named=True)}


def truth_steps(case, rank):
    """The rank's truth per profiled step, keyed by the step's number in the trace (ProfilerStep#1, #2)."""
    return dict(enumerate(truth_of(case)["ranks"][str(rank)]["steps"], start=1))


def blocked_in_recv(path):
    """Per ProfilerStep#N of the raw trace: the time the step's thread spent in `gloo:recv` spans with no `cpu_op`
    other than a `c10d::` call running on it (the union of receives minus the union of compute), and the step's span."""
    with gzip.open(path, "rt") as f:
        xs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for st in (e for e in xs if e["name"].startswith("ProfilerStep#")):
        lo, hi = st["ts"], st["ts"] + st["dur"]
        mine = [e for e in xs if e["tid"] == st["tid"] and lo <= e["ts"] < hi]
        grid = np.arange(np.floor(lo), np.ceil(hi) + 1, 0.05)  # 50 ns samples of the step
        recv = np.zeros(len(grid), bool)
        busy = np.zeros(len(grid), bool)
        for e in mine:
            hit = (grid >= e["ts"]) & (grid < e["ts"] + e["dur"])
            if e["name"] == "gloo:recv":
                recv |= hit
            elif e.get("cat") == "cpu_op" and not e["name"].startswith("c10d::"):
                busy |= hit
        out[int(st["name"].split("#")[1])] = (float((recv & ~busy).sum()) * 0.05, st["dur"])
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_pipeline_section_appears_without_flags(case):
    p = job(case).pipeline
    assert p is not None
    assert p.height == truth_of(case)["world_size"] * 2  # every stage, both profiled steps
    assert set(p["bubble_source"]) == {"recv_blocked"}


def test_a_job_without_p2p_keeps_its_report():
    """A job with no P2P (DDP) has no pipeline rows and no bubble advice; the P2P columns stay empty."""
    t = json.loads(TRUTH_PATH.read_text()) if TRUTH_PATH.exists() else pytest.skip("no truth")
    from traceflops.api import analyze_job

    j = analyze_job([str(DIST / f) for f in t["ddp"]["files"].values()])
    assert j.pipeline is None
    assert not [x for x in j.advice if x["kind"] == "pipeline_bubble"]
    assert all(s.collectives["p2p"].is_null().all() and s.collectives["peer"].is_null().all() for s in j.summaries)


@pytest.mark.parametrize("case", CASES)
def test_stages_and_microbatches_are_inferred_from_the_p2p_pattern(case):
    t = truth_of(case)
    for (rank, _), r in rows(case).items():
        assert (r["stages"], r["microbatches"], r["stages_source"]) == (t["stages"], t["microbatches"], "inferred")
        assert r["stage"] == t["stage_of_rank"][str(rank)]
        assert r["ideal_bubble"] == pytest.approx((t["stages"] - 1) / (t["microbatches"] + t["stages"] - 1))


@pytest.mark.parametrize("case", CASES)
def test_each_stage_bubble_is_its_blocked_receive_time(case):
    for rank, path in enumerate(paths(case)):
        for step, (blocked, span) in blocked_in_recv(path).items():
            r = rows(case)[(rank, step)]
            assert r["recv_blocked_us"] == pytest.approx(blocked, rel=0.10, abs=20.0), (rank, step)
            assert r["bubble"] == pytest.approx(blocked / span, rel=0.10, abs=0.005), (rank, step)


@pytest.mark.parametrize("case", CASES)
def test_transfers_match_as_the_schedule_issued_them(case):
    t = truth_of(case)
    total_sends = 0
    for (rank, step), r in rows(case).items():
        want = truth_steps(case, rank)[step]["p2p"]
        sends = sum(x["op"] == "send" for x in want)
        recvs = sum(x["op"] == "recv" for x in want)
        total_sends += sends
        assert (r["sends"], r["recvs"], r["matched"]) == (sends, recvs, sends + recvs), (rank, step)
    # every matched P2P pair in the job is one send and the receive it fed, by (sender, receiver, order)
    from traceflops.views.clocks import matched

    m = matched(list(job(case).summaries))
    p2p = m.filter(pl.col("kind") == "sendrecv")
    pairs = p2p.group_by("pg", "seq").agg(pl.col("p2p").sort().alias("ends"), pl.col("rank").n_unique().alias("n"))
    assert pairs.height == total_sends == sum(len([x for x in s["p2p"] if x["op"] == "send"])
                                              for rk in t["ranks"].values() for s in rk["steps"])
    assert all(e == ["recv", "send"] for e in pairs["ends"].to_list())
    assert set(pairs["n"]) == {2}


@pytest.mark.parametrize("case", CASES)
def test_gradient_transfers_are_backward(case):
    for s in job(case).summaries:
        c = s.collectives.filter(pl.col("kind") == "sendrecv")
        for step, t in truth_steps(case, s.rank).items():
            want = t["p2p"]
            got = collections.Counter(c.filter(pl.col("step") == step).select("p2p", "peer", "phase").iter_rows())
            assert got == collections.Counter((x["op"], x["peer"], x["phase"]) for x in want), (s.rank, step)
            r = rows(case)[(s.rank, step)]
            assert r["backward_p2p"] == sum(x["phase"] == "backward" for x in want)
            assert r["forward_p2p"] == sum(x["phase"] == "forward" for x in want)


@pytest.mark.parametrize("case", ("pp_gpipe_2", "pp_1f1b_4"))
def test_the_advice_names_the_bubble(case):
    t = truth_of(case)
    items = job(case).advice
    first = items[0]
    assert first["kind"] == "pipeline_bubble"
    assert not [x for x in items if x["kind"] == "communication"]  # not "overlap communication"
    m, p = t["microbatches"], t["stages"]
    assert any(f"m = {2 * m}" in x and f"{(p - 1) / (2 * m + p - 1):.1%}" in x for x in first["remedies"])
    assert any("interleaved" in x.lower() for x in first["remedies"])


def test_flags_override_the_inferred_stages():
    p = job("pp_1f1b_2", pipeline_stages=8, microbatches=16).pipeline
    assert set(p["stages"]) == {8} and set(p["microbatches"]) == {16} and set(p["stages_source"]) == {"given"}
    assert p["ideal_bubble"][0] == pytest.approx(7 / 23)


def test_reports_render_the_pipeline():
    import io

    from rich.console import Console

    from traceflops.report import jobreport
    from traceflops.report.html import render_job_html

    j = job("pp_gpipe_4")
    buf = io.StringIO()
    jobreport.render(j, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "Pipeline: stages 4 and micro-batches 4 (inferred)" in text and "blocked on recv" in text
    html = render_job_html(j)
    assert "Pipeline bubbles" in html and "blocked on recv" in html
    d = json.loads(jobreport.render_json(j))
    assert {r["stage"] for r in d["pipeline"]} == {0, 1, 2, 3}
