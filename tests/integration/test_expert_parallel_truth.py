"""Expert parallelism over all_to_all, against the generator's truth (`fixtures/generate_dist.py --only ep`).

4 gloo ranks on a 2x2 `init_device_mesh(("dp", "ep"))`; a top-1 mixture of 4 experts (2 per EP rank) run as
`torch._grouped_mm`, tokens dispatched and combined by autograd all-to-alls, a router biased so experts 0-1
get most tokens. Truth: the tokens each local expert ran (logged by the program), the experts' FLOPs counted
by hand from them (FlopCounterMode has no `_grouped_mm` formula in torch 2.13), and every collective the rank
issued with its group and sizes, from c10d's flight recorder.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from tests.builders import FIXTURES
from traceflops import api
from traceflops.cli.main import main as cli
from traceflops.views.experts import imbalance_advice
from traceflops.views.job_advice import FLOOR

EP = FIXTURES / "dist" / "ep"


def truth():
    p = FIXTURES / "dist" / "truth.json"
    if not (EP / "rank0.json.gz").exists() or not p.exists():
        pytest.skip(f"{EP} absent: run `python fixtures/generate_dist.py --only ep`")
    return json.loads(p.read_text())["ep"]


@pytest.mark.parametrize("rank", range(4))
def test_expert_flops_per_rank_equal_the_hand_count(rank):
    t = truth()["ranks"][str(rank)]
    a = api.analyze(EP / f"rank{rank}.json.gz")
    assert a.totals["step_count"]["excluded"] == []
    want = {p: sum(s["flops"]["experts"][p] for s in t["steps"]) for p in ("forward", "backward")}
    got = a.totals["expert_flops"]
    assert (got["forward"], got["backward"], got["recompute"]) == (want["forward"], want["backward"], 0)
    # and every matmul of the step: experts, router and projection
    every = {p: sum(v[p] for s in t["steps"] for k, v in s["flops"].items() if isinstance(v, dict)) for p in ("forward", "backward")}
    assert (a.totals["flops"]["forward"], a.totals["flops"]["backward"]) == (every["forward"], every["backward"])


@pytest.mark.parametrize("rank", range(4))
def test_all_to_alls_are_the_ep_groups_with_the_recorded_payloads(rank):
    t = truth()["ranks"][str(rank)]
    a = api.analyze(EP / f"rank{rank}.json.gz")
    c = a.collectives.filter(pl.col("kind") == "all_to_all")
    issued = [x for s in t["steps"] for x in s["collectives"] if "all_to_all" in x["name"]]
    assert c.height == len(issued)
    assert set(c["role"].to_list()) == {"ep"}
    assert set(c["group_ranks"].to_list()) == {json.dumps(t["groups"]["ep"], separators=(",", ":"))}
    # the payload the flight recorder gives: the larger of what goes in and what comes out, float32 tokens or int64 counts
    size = {"float32": 4, "int64": 8}
    want = sorted(max(x["in_nelems"], x["out_nelems"]) * size[x["dtype"]] for x in issued)
    assert sorted(c["bytes"].to_list()) == want


def test_job_names_the_busiest_expert_rank():
    t = truth()
    files = [str(EP / f"rank{r}.json.gz") for r in range(4)]
    run = CliRunner().invoke(cli, ["analyze", *files, "--no-cache", "--format", "json"])
    assert run.exit_code == 0, run.output
    d = json.loads(run.stdout)
    rows = {r["rank"]: r for r in d["experts"]}
    steps = {r: len(v["steps"]) for r, v in t["ranks"].items()}
    per_step = {int(r): sum(s["flops"]["experts"]["forward"] + s["flops"]["experts"]["backward"] for s in v["steps"]) / steps[r]
                for r, v in t["ranks"].items()}
    for r, want in per_step.items():
        group = t["ranks"][str(r)]["groups"]["ep"]
        mean = sum(per_step[g] for g in group) / len(group)
        assert rows[r]["expert_flops_per_step"] == pytest.approx(want)
        assert rows[r]["flops_vs_group_mean"] == pytest.approx(want / mean)
    busiest = max(per_step, key=lambda r: per_step[r] / (sum(per_step[g] for g in t["ranks"][str(r)]["groups"]["ep"]) / 2))
    item = imbalance_advice(pl.DataFrame(d["experts"]))
    assert item is not None and item["data"]["rank"] == busiest
    # On the job's denominator (the step time summed over ranks) the imbalance is an entry only from the floor: here
    # the busiest rank's extra expert matmuls take about 0.2% of it, so the job's advice leaves it out.
    shown = [x for x in d["advice"] if x["kind"] == "expert_imbalance"]
    assert all(x["scope"] == "job" and x["share"] >= FLOOR and x["data"]["rank"] == busiest for x in shown)
    term = CliRunner().invoke(cli, ["analyze", *files, "--no-cache"])
    assert "Experts per rank" in term.output


def test_no_experts_no_section():
    tp = FIXTURES / "dist" / "tp"
    if not tp.is_dir():
        pytest.skip(f"{tp} absent")
    job = api.analyze_job(tp)
    assert job.experts is None
    assert api.analyze(tp / "rank0.json.gz").totals["expert_flops"] is None
