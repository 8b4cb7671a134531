"""Process groups on CPU jobs built with PyTorch's own parallelism APIs, against the generator's truth.

`fixtures/generate_dist.py` made two gloo jobs (fixtures/dist/README.md, "Process groups"):
`tp`, 2 ranks with `parallelize_module` (ColwiseParallel fc1, RowwiseParallel fc2), and
`fsdp2_tp`, 4 ranks on a 2x2 `init_device_mesh(("dp", "tp"))` with `fully_shard` on dp and the
same TP plan on tp. Each step also all-reduces an int64 row count. Truth: every collective of
each rank from c10d's flight recorder (with its process group), the groups the program made,
FLOPs counted by hand from the local shapes, and a clock offset injected into ranks 1-3.
"""

import collections
import functools
import json

import polars as pl
import pytest

from tests.builders import FIXTURES

DIST = FIXTURES / "dist"
TRUTH_PATH = DIST / "truth.json"
CASES = ("tp", "fsdp2_tp")
PHASES = ("forward", "backward", "recompute", "optimizer", "other")


@functools.cache
def truth_of(case):
    if not TRUTH_PATH.exists():
        pytest.skip(f"{TRUTH_PATH} absent: run `python fixtures/generate_dist.py --only tp,fsdp2_tp`")
    t = json.loads(TRUTH_PATH.read_text())
    if case not in t or not all((DIST / f).exists() for f in t[case]["files"].values()):
        pytest.skip(f"{case} not generated: run `python fixtures/generate_dist.py --only {case}`")
    return t[case]


def ranks_of(case):
    return range(truth_of(case)["world_size"])


@functools.cache
def analysis(case, rank):
    from traceflops.run.load import analyze

    return analyze(str(DIST / truth_of(case)["files"][str(rank)]))


@functools.cache
def job(case):
    from traceflops.api import analyze_job

    t = truth_of(case)
    return analyze_job([str(DIST / t["files"][str(r)]) for r in range(t["world_size"])])


def issued(case, rank):
    """The rank's collectives in the truth, per group in the group's order."""
    by = collections.defaultdict(list)
    for s in truth_of(case)["ranks"][str(rank)]["steps"]:
        for c in s["collectives"]:
            by[c["pg"]].append(c)
    return {pg: sorted(cs, key=lambda c: c["seq"]) for pg, cs in by.items()}


ROLE = {"default_pg": "world", "mesh_dp": "dp", "mesh_tp": "tp"}


# --------------------------------------------------------------- one rank


@pytest.mark.parametrize("case", CASES)
def test_the_trace_lists_the_groups_the_program_made(case):
    for r in ranks_of(case):
        got = analysis(case, r).meta["process_groups"]
        want = truth_of(case)["ranks"][str(r)]["groups"]
        assert [(g["name"], g["desc"], g["size"], g["ranks"]) for g in got] == [(g["pg"], g["desc"], g["size"], g["ranks"]) for g in want]


@pytest.mark.parametrize("case", CASES)
def test_every_collective_carries_its_group_size_role_kind_and_bytes(case):
    from traceflops.views.collectives import collectives

    for r in ranks_of(case):
        got = collectives(analysis(case, r))
        want = issued(case, r)
        assert sorted(got["pg"].unique().to_list()) == sorted(want)
        for pg, cs in want.items():
            rows = got.filter(pl.col("pg") == pg).sort("seq")
            assert rows["seq"].to_list() == list(range(len(cs)))
            assert rows["kind"].to_list() == [c["api_kind"] for c in cs], (r, pg)
            assert rows["bytes"].to_list() == [c["bytes"] for c in cs], (r, pg)
            assert set(rows["group_size"]) == {cs[0]["group_size"]}
            assert set(rows["pg_desc"]) == {cs[0]["pg_desc"]}
            assert set(rows["role"]) == {ROLE[cs[0]["pg_desc"]]}
            assert set(rows["group_ranks"]) == {json.dumps(cs[0]["group_ranks"]).replace(" ", "")}


@pytest.mark.parametrize("case", CASES)
def test_per_rank_flops_from_local_shapes(case):
    for r in ranks_of(case):
        a = analysis(case, r)
        steps = list(a.steps.sort("ts").iter_rows(named=True))
        want = truth_of(case)["ranks"][str(r)]["steps"]
        assert len(steps) == len(want)
        for s, t in zip(steps, want):
            assert {p: s[f"flops_{p}"] for p in PHASES} == {p: t["flops"][p] for p in PHASES}
            assert {p: s[f"count_{p}"] for p in PHASES} == {p: t["matmul_count"][p] for p in PHASES}


def test_fsdp2s_reduce_scatter_is_called_one_though_gloo_runs_an_all_reduce():
    from traceflops.views.collectives import collectives

    got = collectives(analysis("fsdp2_tp", 0))
    rs = got.filter(pl.col("kind") == "reduce_scatter")
    assert rs.height == 6 and set(rs["name"]) == {"gloo:all_reduce"} and set(rs["role"]) == {"dp"}
    # the bus factor of a reduce-scatter over 2 ranks: (n-1)/n, not an all-reduce's 2(n-1)/n
    j = job("fsdp2_tp").collectives.filter(pl.col("kind") == "reduce_scatter")
    assert j.height == 12 and set(j["bus_factor"]) == {0.5}


@pytest.mark.parametrize("case", CASES)
def test_an_int64_payload_has_8_byte_elements(case):
    from traceflops.views.collectives import collectives

    want = truth_of(case)["int64_all_reduce"]["bytes"]
    for r in ranks_of(case):
        tiny = collectives(analysis(case, r)).filter(pl.col("bytes") == want)
        assert tiny.height == 2 and set(tiny["kind"]) == {"allreduce"}  # one per step


@pytest.mark.parametrize("case", CASES)
def test_a_thread_blocked_in_a_functional_wait_is_exposed_communication(case):
    """The TP all-reduce's `_c10d_functional::wait_tensor` blocks the training thread in forward: with nothing else
    running, that time is exposed communication (before: compute of the top-level op around it)."""
    from traceflops.stages.cpu_activities import cpu_activities

    for r in ranks_of(case):
        a = analysis(case, r)
        waits = a.ops.filter(pl.col("name") == "_c10d_functional::wait_tensor")
        assert set(waits["phase"]) == {"forward"}
        acts = cpu_activities(a.ops)
        shown = acts.filter(pl.col("name") == "_c10d_functional::wait_tensor")
        assert set(shown["cls"]) == {"communication"} and set(shown["phase"]) == {"forward"}
        for s, t in zip(a.steps.sort("ts").iter_rows(named=True), truth_of(case)["ranks"][str(r)]["steps"]):
            assert t["functional_waits"]["count"] == 1
            assert s["time_communication_exposed"] >= t["functional_waits"]["us"] - 1e-3
        # the op around the wait keeps the rest of its span: no compute on the thread while it waits
        for w in waits.iter_rows(named=True):
            lo, hi = w["ts"], w["ts"] + w["dur"]
            busy = acts.filter((pl.col("stream") == w["tid"]) & (pl.col("cls") != "communication")
                               & (pl.col("ts") < hi) & (pl.col("ts") + pl.col("dur") > lo))
            assert busy.height == 0, busy
        assert acts.filter(pl.col("cls") == "other_compute").height > waits.height


# --------------------------------------------------------------- the job


@pytest.mark.parametrize("case", CASES)
def test_collectives_match_by_group_among_its_members(case):
    t = truth_of(case)
    j = job(case)
    c = j.collectives
    per_group = {}
    for r in ranks_of(case):
        for pg, cs in issued(case, r).items():
            per_group.setdefault(pg, (len(cs), cs[0]))
    assert c.group_by("pg").len().sort("pg").rows() == sorted((pg, n) for pg, (n, _) in per_group.items())
    assert j.totals["collectives_matched"] == sum(n for n, _ in per_group.values())
    for pg, (_, first) in per_group.items():
        rows = c.filter(pl.col("pg") == pg)
        assert set(rows["ranks"]) == {first["group_size"]} == set(rows["group_size"])
        assert set(rows["role"]) == {ROLE[first["pg_desc"]]}
    assert j.totals["world_size"] == t["world_size"]
    assert not [w for w in j.warnings if "group" in w and "recorded different" in w]


@pytest.mark.parametrize("case", CASES)
def test_the_clock_offsets_are_the_injected_ones(case):
    """One host clock: the only true offsets are the injected ones. Aligning on the gloo:* ends leaves their natural
    skew between the ranks that share a group (rank 3 of the mesh shares none with rank 0: it is aligned through 1 or 2)."""
    clock = truth_of(case)["clock"]
    got = job(case).clock["offsets_us"]
    assert got["0"] == 0.0
    for r in ranks_of(case):
        if r:
            assert got[str(r)] == pytest.approx(clock["expected_offsets_us"][str(r)], abs=clock["tolerance_us"][str(r)]), r


def test_the_job_reports_show_each_groups_role():
    from traceflops.report.html import render_job_html
    from traceflops.report.jobreport import render_json

    j = job("fsdp2_tp")
    d = json.loads(render_json(j))
    roles = {(c["pg"], c["role"], c["pg_desc"], c["group_size"], tuple(c["group_ranks"])) for c in d["collectives"]}
    assert roles == {("1", "dp", "mesh_dp", 2, (0, 2)), ("2", "dp", "mesh_dp", 2, (1, 3)),
                     ("3", "tp", "mesh_tp", 2, (0, 1)), ("4", "tp", "mesh_tp", 2, (2, 3))}
    assert "<th>role</th>" in render_job_html(j).replace(' class="l"', "")
