"""2-rank gloo (CPU) training traces against the generator's truth.

`fixtures/generate_dist.py` trained a tiny non-square MLP on 2 processes over gloo
(DistributedDataParallel, DDP with the PowerSGD communication hook, FSDP2
`fully_shard`), profiled 2 steps on each rank, measured each phase's FLOPs with
torch.utils.flop_counter over a replay of the same steps, took every collective each
rank issued from c10d's flight recorder, and added a known clock offset to rank 1's
trace after export.  See fixtures/dist/README.md.

Every case is exact.
"""

import functools
import json

import pytest

from tests.builders import FIXTURES

DIST = FIXTURES / "dist"
TRUTH_PATH = DIST / "truth.json"
CASES = ("ddp", "ddp_powersgd", "ddp_powersgd_offthread", "fsdp2")
HOOK_CASES = ("ddp_powersgd", "ddp_powersgd_offthread")
RANKS = (0, 1)
PHASES = ("forward", "backward", "recompute", "optimizer", "other")
REGENERATE = "run `python fixtures/generate_dist.py`"

@functools.cache
def all_truth():
    if not TRUTH_PATH.exists():
        return None
    return json.loads(TRUTH_PATH.read_text())


def trace_path(case, rank):
    return DIST / case / f"rank{rank}.json.gz"


def truth_of(case):
    truth = all_truth()
    if truth is None:
        pytest.skip(f"{TRUTH_PATH} absent: {REGENERATE}")
    if case not in truth or not all(trace_path(case, r).exists() for r in RANKS):
        pytest.skip(f"{case} not generated ({DIST / case}): {REGENERATE}")
    return truth[case]


@functools.cache
def analysis(case, rank):
    from traceflops.run.load import analyze

    return analyze(str(trace_path(case, rank)))


@functools.cache
def job(case):
    from traceflops.api import analyze_job

    return analyze_job([str(trace_path(case, r)) for r in RANKS])


def steps_of(a):
    return list(a.steps.sort("ts").iter_rows(named=True))


def recorded(step):
    """The collectives of a truth step that the trace holds (issued on the training thread)."""
    return [c for c in step["collectives"] if c["in_trace"]]


def expected_phases(t, key):
    """Truth in the analyzer's phases: the hook's recorded matmuls belong to 'other'."""
    d = {p: t[key][p] for p in PHASES}
    d["other"] += t[key]["hook"]
    return d


# --------------------------------------------------------------- the truth itself (no traceflops)


@pytest.mark.parametrize("case", CASES)
def test_truth_closed_forms(case):
    truth = truth_of(case)
    m = truth["model"]
    d0, d1, _, _ = m["dims"]
    n, rows = m["params_matmul"], m["rows_per_rank"]
    for rank in map(str, RANKS):
        for t in truth["ranks"][rank]["steps"]:
            f = t["flops"]
            assert f["forward"] == 2 * n * rows
            # weight gradients of every Linear, data gradients of all but the first
            assert f["backward"] == 2 * n * rows + 2 * (n - d0 * d1) * rows
            assert f["recompute"] == f["optimizer"] == f["other"] == 0
            hook_total = f["hook"] + t["hook_unrecorded"]["flops"]
            # PowerSGD rank 1 on an (r x c) weight: P = M Q, Q = M^T P, M = P Q^T, 2rc each
            assert hook_total == (6 * n if truth["hook"] else 0)
            assert t["matmul_count"]["hook"] + t["hook_unrecorded"]["count"] == (9 if truth["hook"] else 0)
            assert t["trace_matmul_events"] == sum(t["matmul_count"].values())


def test_truth_hook_placement():
    on_thread, off_thread = truth_of("ddp_powersgd"), truth_of("ddp_powersgd_offthread")
    for rank in map(str, RANKS):
        for t in on_thread["ranks"][rank]["steps"]:
            assert t["hook_unrecorded"]["count"] == 0 and all(c["in_trace"] for c in t["collectives"])
        for t in off_thread["ranks"][rank]["steps"]:
            assert (t["matmul_count"]["hook"], t["hook_unrecorded"]["count"]) == (3, 6)
            assert [c["in_trace"] for c in t["collectives"]] == [True, False, False]


@pytest.mark.parametrize("case", CASES)
def test_truth_ranks_issue_the_same_collectives(case):
    truth = truth_of(case)
    per_rank = [[[(c["seq"], c["kind"], c["bytes"], c["in_trace"]) for c in t["collectives"]]
                 for t in truth["ranks"][str(r)]["steps"]] for r in RANKS]
    assert per_rank[0] == per_rank[1]
    assert all(c["bytes"] for t in truth["ranks"]["0"]["steps"] for c in t["collectives"])
    assert truth["clock"]["expected_offsets_us"]["1"] == -truth["clock"]["injected_offset_us"]["1"]


# --------------------------------------------------------------- one rank


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("case", CASES)
def test_per_phase_flops_and_counts(case, rank):
    truth = truth_of(case)
    got = steps_of(analysis(case, rank))
    want = truth["ranks"][str(rank)]["steps"]
    assert len(got) == len(want)
    for s, t in zip(got, want):
        assert {p: s[f"flops_{p}"] for p in PHASES} == expected_phases(t, "flops")
        assert {p: s[f"count_{p}"] for p in PHASES} == expected_phases(t, "matmul_count")


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("case", HOOK_CASES)
def test_hook_matmuls_are_other_and_not_model_flops(case, rank):
    truth = truth_of(case)
    a = analysis(case, rank)
    assert a.model["source"] == "trace"
    for s, t in zip(steps_of(a), truth["ranks"][str(rank)]["steps"]):
        assert t["flops"]["hook"] > 0
        assert s["flops_other"] == t["flops"]["hook"]
        assert s["model_flops"] == t["flops"]["forward"] + t["flops"]["backward"]
        # executed = what the trace shows; the hook's callbacks on a gloo thread are not in it
        assert s["flops_executed"] == sum(t["flops"].values())


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("case", CASES)
def test_step_time_matches_the_generators_wall_clock(case, rank):
    truth = truth_of(case)
    for s, t in zip(steps_of(analysis(case, rank)), truth["ranks"][str(rank)]["steps"]):
        assert s["window"] == pytest.approx(t["wall_us"], rel=0.05)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("case", CASES)
def test_gloo_collectives_are_communication(case, rank):
    from traceflops.views.collectives import collectives

    truth = truth_of(case)
    a = analysis(case, rank)
    want = [c for t in truth["ranks"][str(rank)]["steps"] for c in recorded(t)]
    got = collectives(a)
    assert got.height == len(want)
    assert a.totals["overlay_us"]["communication_total"] > 0


# --------------------------------------------------------------- the job


@pytest.mark.parametrize("case", CASES)
def test_job_matches_every_recorded_collective(case):
    truth = truth_of(case)
    j = job(case)
    want = [c for t in truth["ranks"]["0"]["steps"] for c in recorded(t)]
    assert j.collectives.height == len(want) == j.totals["collectives_matched"]
    assert set(j.collectives["ranks"].to_list()) == {len(RANKS)}
    assert j.totals["world_size"] == truth["world_size"]
    assert j.clock["residual_skew_us"] is not None


@pytest.mark.parametrize("case", CASES)
def test_job_collective_kinds_and_bytes(case):
    truth = truth_of(case)
    want = [c for t in truth["ranks"]["0"]["steps"] for c in recorded(t)]
    got = list(job(case).collectives.sort("pg", "seq").iter_rows(named=True))
    assert len(got) == len(want) > 0
    for g, c in zip(got, want):
        # gloo runs FSDP2's reduce_scatter_tensor as an all-reduce: either name will do
        assert g["kind"] in {c["kind"], c["api_kind"]}, (g, c)
        assert g["bytes"] == c["bytes"], (g, c)


@pytest.mark.parametrize("case", CASES)
def test_job_recovers_the_injected_clock_offset(case):
    truth = truth_of(case)
    clock = truth["clock"]
    j = job(case)
    assert j.clock["reference_rank"] == 0
    got = j.clock["offsets_us"]
    assert got["0"] == 0.0
    # the ranks shared one host clock: the only true offset is the injected one.  Aligning on
    # the median end of the gloo:* events leaves their natural skew (truth's tolerance_us).
    assert got["1"] == pytest.approx(clock["expected_offsets_us"]["1"], abs=clock["tolerance_us"])


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("case", CASES)
def test_gloo_work_takes_the_phase_of_the_call_that_issued_it(case, rank):
    """DDP's all-reduces are issued from AccumulateGrad (backward); FSDP2 all-gathers before each forward and
    backward, and reduce-scatters after the backward (its last one from the root post-backward callback)."""
    import polars as pl

    a = analysis(case, rank)
    work = a.ops.filter(pl.col("name").str.starts_with("gloo:"))
    want = {"ddp": {"backward"}, "ddp_powersgd": {"backward"}, "ddp_powersgd_offthread": {"backward"},
            "fsdp2": {"forward", "backward"}}[case]
    assert set(work["phase"]) == want
    if case == "fsdp2":
        calls = a.ops.filter(pl.col("name") == "c10d::_reduce_scatter_base_")
        assert calls.height and set(calls["phase"]) == {"backward"}
        got = dict(work.group_by("phase").len().iter_rows())
        sharded, steps = 3, a.steps.filter(pl.col("step") >= 0).height  # fc1, fc2, fc3: one all-gather each per forward
        assert got["forward"] == sharded * steps
