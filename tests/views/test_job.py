"""Across ranks, on synthetic traces with known clock skew, a known straggler and known bubbles."""

import pytest

from tests.builders import RANKS, rank_traces
from traceflops.run.load import analyze
from traceflops.views.job import job_view, summarize

WORLD, OFFSET, SLOW = RANKS.WORLD, RANKS.OFFSET, RANKS.SLOW
MM = 2 * RANKS.M * RANKS.N * RANKS.K


@pytest.fixture
def job(tmp_path):
    return job_view([summarize(analyze(p)) for p in rank_traces(tmp_path)])


def test_clocks_are_aligned_on_collective_ends(job):
    for r in range(WORLD):
        assert job.clock["offsets_us"][str(r)] == pytest.approx(OFFSET[0] - OFFSET[r], abs=1e-6)
    assert job.clock["residual_skew_us"] == pytest.approx(0.0, abs=1e-6)


def test_arrival_skew_is_separated_from_transfer(job):
    c = job.collectives
    assert c.height == 2  # one all-reduce per step, matched on all four ranks
    assert c["ranks"].to_list() == [WORLD, WORLD]
    assert c["arrival_skew_us"].to_list() == pytest.approx([300.0, 300.0])
    # transfer: from the last arrival (the slow rank) to the common end
    assert c["transfer_us"].to_list() == pytest.approx([900 - (50 + 700 + 10)] * 2)
    assert c["last_rank"].to_list() == [SLOW, SLOW]
    payload = (1 << 20) * 2
    assert c["bytes"].to_list() == [payload, payload]
    assert c["busbw_gbps"][0] == pytest.approx(payload / 140e-6 * 2 * 3 / 4 / 1e9)


def test_straggler_and_its_reason(job):
    s = job.stragglers
    assert s["rank"].to_list() == [SLOW, SLOW]
    assert set(s["reason"]) == {"compute"}
    assert s["excess_compute_us"].to_list() == pytest.approx([300.0, 300.0])


def test_job_mfu_uses_the_slowest_rank_and_world_size(job):
    # each rank: one mm per step; trace-derived model FLOPs = forward matmul FLOPs, summed over ranks
    st = job.steps
    assert st["model_flops"].to_list() == [WORLD * MM] * 2
    peak = 989.4e12
    # step time is each rank's device window; the last step ends at its last activity
    first = st.row(0, named=True)
    assert first["mfu"] == pytest.approx(WORLD * MM / (first["step_us"] * 1e-6 * peak * WORLD), rel=1e-6)
    assert job.totals["world_size"] == WORLD


def test_missing_rank_is_a_warning(tmp_path):
    j = job_view([summarize(analyze(p)) for p in rank_traces(tmp_path, ranks=(0, 1, 3))])
    assert any("ranks missing" in w and "[2]" in w for w in j.warnings)


def test_pipeline_bubble_against_the_ideal(tmp_path):
    j = job_view([summarize(analyze(p)) for p in rank_traces(tmp_path, p2p_us=50.0)],
                 pipeline_stages=4, microbatches=8)
    p = j.pipeline
    assert p.height == WORLD * 2
    assert p["ideal_bubble"][0] == pytest.approx(3 / 11)
    assert p["p2p_us"].to_list() == pytest.approx([50.0] * (WORLD * 2))


def test_cli_job_view_from_a_directory(tmp_path):
    import json

    from click.testing import CliRunner

    from traceflops.cli.main import main

    d = tmp_path / "ranks"
    d.mkdir()
    rank_traces(d)
    out = CliRunner().invoke(main, ["analyze", str(d), "--format", "json", "--jobs", "2"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert [r["rank"] for r in rep["ranks"]] == list(range(WORLD))
    assert rep["totals"]["world_size"] == WORLD and rep["totals"]["collectives_matched"] == 2
    assert {s["rank"] for s in rep["steps"]} == set(range(WORLD))
    assert [s["rank"] for s in rep["stragglers"]] == [SLOW, SLOW]


def test_dlrm_eight_ranks(shared):
    """A real 8-rank job: all ranks present, collectives matched on all eight, clocks close (one host)."""
    files = sorted((shared / "kineto" / "dlrm_8rank").glob("rank*.json.gz"))
    j = job_view([summarize(analyze(str(f))) for f in files])
    assert j.ranks["rank"].to_list() == list(range(8))
    assert not any("ranks missing" in w for w in j.warnings)
    assert j.collectives.height > 0 and set(j.collectives["ranks"]) == {8}
    assert abs(j.clock["residual_skew_us"]) < 50
    assert j.steps["slowest_rank"][0] == j.ranks.sort("wall_us")["rank"][-1]


def test_dlrm_message_sizes_are_its_calls_inputs(shared):
    """DLRM's PyTorch recorded no `In msg nelems`: each collective's message is its `nccl:*` call's input tensor,
    counted here from the raw files (elements x bytes of the recorded type), the k-th call of every rank being the
    k-th collective of the group; bus bandwidth is nccl-tests' (algorithm bandwidth x 2(n-1)/n for an all-reduce,
    (n-1)/n for an all-to-all)."""
    import gzip
    import json
    import math

    files = sorted((shared / "kineto" / "dlrm_8rank").glob("rank*.json.gz"))
    size = {"float": 4, "int": 4, "long int": 8}
    by_seq: dict[int, int] = {}
    for f in files:
        calls = sorted((e["ts"], e["args"]) for e in json.load(gzip.open(f))["traceEvents"]
                       if str(e.get("name", "")).startswith("nccl:"))
        for seq, (_, args) in enumerate(calls):
            (dims,), (dtype,) = args["Input Dims"], args["Input type"]
            by_seq[seq] = max(by_seq.get(seq, 0), math.prod(dims) * size[dtype])
    j = job_view([summarize(analyze(str(f))) for f in files])
    c = j.collectives.sort("seq")
    assert dict(zip(c["seq"], c["bytes"])) == by_seq and len(by_seq) == 8
    assert not any("record no message size" in w for w in j.warnings)
    n = 8
    for kind, b, t, bus in c.select("kind", "bytes", "transfer_us", "busbw_gbps").iter_rows():
        factor = 2 * (n - 1) / n if kind == "allreduce" else (n - 1) / n
        assert bus == pytest.approx(b / (t * 1e-6) / 1e9 * factor)


def test_bus_bandwidth_against_nvlink(job):
    """H100 SXM: NVLink 900 GB/s both directions together, 450 GB/s each way (NVIDIA datasheet)."""
    c = job.collectives
    assert c["busbw_of_nvlink"][0] == pytest.approx(c["busbw_gbps"][0] * 1e9 / 450e9)


def test_dlrm_terminal_job_view(shared):
    """The job view a user reads: labelled trace-derived MFU, ranks, slowest rank per step,
    collectives with skew and bus bandwidth (sizes from the calls' input shapes: no size is missing)."""
    from click.testing import CliRunner

    from traceflops.cli.main import main

    r = CliRunner().invoke(main, ["analyze", str(shared / "kineto" / "dlrm_8rank"), "--no-cache"], terminal_width=200)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "model FLOPs from the trace" in out and "MFU" in out and "HFU" in out
    for title in ("Ranks", "Job steps", "slowest rank", "Collectives", "skew"):
        assert title in out, title
    assert "record no message size" not in out
    # the Collectives table's rows: group, #, kind, step, ranks, skew, transfer, last rank, busbw
    rows = [r for r in (line.split("│")[1:-1] for line in out.splitlines()) if len(r) == 9]
    rows = [r for r in rows if r[2].strip() in ("all_to_all", "allreduce")]
    assert len(rows) == 8 and all(float(r[-1]) >= 0 for r in rows)  # every busbw a number, none "—"
