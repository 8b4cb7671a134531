"""Communication by dimension (the group's role) and phase, on the gloo jobs of `fixtures/generate_dist.py`.

Truth: every collective each rank issued, with its process group's description, from c10d's flight recorder
(`fixtures/dist/truth.json`); the roles are read off the mesh the program built (`init_device_mesh(("dp", "tp"))`).
"""

from __future__ import annotations

import collections
import json

import polars as pl
import pytest
from click.testing import CliRunner

from tests.builders import FIXTURES
from traceflops import api
from traceflops.cli.main import main as cli
from traceflops.storage.summary import read_summary, write_summary
from traceflops.views.job import summarize

DIST = FIXTURES / "dist"
# the program's mesh dimensions by the description c10d gives their groups; the 1-D tp job's mesh is the world group
ROLE_OF = {"mesh_dp": "dp", "mesh_tp": "tp", "default_pg": "world"}


def truth(case):
    p = DIST / "truth.json"
    if not p.exists() or not (DIST / case).is_dir():
        pytest.skip(f"{DIST / case} absent: run `python fixtures/generate_dist.py --only {case}`")
    return json.loads(p.read_text())[case]


def issued(t, rank) -> collections.Counter:
    """(role, kind) of every collective the rank issued in its profiled steps, from the flight recorder."""
    return collections.Counter((ROLE_OF[c["pg_desc"]], c["api_kind"]) for s in t["ranks"][str(rank)]["steps"] for c in s["collectives"])


@pytest.mark.parametrize("rank", range(4))
def test_fsdp2_tp_calls_per_dimension_equal_the_issued_calls(rank):
    t = truth("fsdp2_tp")
    a = api.analyze(DIST / "fsdp2_tp" / f"rank{rank}.json.gz")
    c = a.communication
    assert a.totals["step_count"]["excluded"] == []  # every profiled step counted: the truth's steps
    got = collections.Counter()
    for r in c.filter(pl.col("calls") > 0).iter_rows(named=True):
        got[(r["role"], r["kind"])] += r["calls"]
    assert got == issued(t, rank)
    assert {"dp", "tp"} <= set(c["role"].to_list())
    assert set(c["phase"].to_list()) <= {"forward", "backward", "optimizer", "other"}
    # the rows cut the time partition's communication among them: nothing left out, nothing counted twice
    tu = a.totals["time_us"]
    assert c["exposed_us"].sum() == pytest.approx(tu["communication_exposed"], rel=1e-9, abs=1e-6)
    assert c["overlapped_us"].sum() == pytest.approx(a.totals["overlay_us"]["communication_overlapped"], rel=1e-9, abs=1e-6)


def test_fsdp2_tp_all_formats_split_dp_and_tp():
    files = [str(DIST / "fsdp2_tp" / f"rank{r}.json.gz") for r in range(4)]
    truth("fsdp2_tp")
    run = CliRunner().invoke(cli, ["analyze", *files, "--no-cache", "--format", "json"])
    assert run.exit_code == 0, run.output
    d = json.loads(run.stdout)
    roles = {r["role"] for r in d["communication"]}
    assert {"dp", "tp"} <= roles
    assert {r["rank"] for r in d["communication_by_rank"]} == {0, 1, 2, 3}
    # the job's row is the ranks' rows summed
    tp_fwd = [r for r in d["communication"] if (r["role"], r["phase"], r["kind"]) == ("tp", "forward", "allreduce")][0]
    per = [r for r in d["communication_by_rank"] if (r["role"], r["phase"], r["kind"]) == ("tp", "forward", "allreduce")]
    assert tp_fwd["calls"] == sum(r["calls"] for r in per) and tp_fwd["ranks"] == len(per) == 4
    assert tp_fwd["exposed_us"] == pytest.approx(sum(r["exposed_us"] for r in per))
    term = CliRunner().invoke(cli, ["analyze", *files, "--no-cache"])
    assert "Communication by dimension and phase" in term.output and "│ TP" in term.output and "│ DP" in term.output
    one = CliRunner().invoke(cli, ["analyze", files[0], "--no-cache", "--format", "json"])
    assert {r["role"] for r in json.loads(one.stdout)["communication"]} >= {"dp", "tp"}


def test_fsdp2_tp_html_has_the_section(tmp_path):
    truth("fsdp2_tp")
    out = tmp_path / "r.html"
    run = CliRunner().invoke(cli, ["analyze", str(DIST / "fsdp2_tp"), "--no-cache", "--html", str(out)])
    assert run.exit_code == 0, run.output
    html = out.read_text()
    assert 'class="communication"' in html and ">tp<" in html and ">dp<" in html


def test_advice_names_the_most_exposed_dimension():
    truth("fsdp2_tp")
    a = api.analyze(DIST / "fsdp2_tp" / "rank1.json.gz")
    item = next(x for x in a.advice if x["kind"] == "communication")
    top = a.communication.filter(pl.col("exposed_us") > 0).row(0, named=True)
    assert f"{top['role'].upper()} {top['kind']} in {top['phase']}" in item["title"]
    assert item["data"]["by_dimension"][0]["role"] == top["role"]


def test_a_group_role_given_by_hand():
    t = truth("tp")
    a = api.analyze(DIST / "tp" / "rank0.json.gz", group_roles=("default_pg=tp",))
    assert set(a.communication["role"].to_list()) == {"tp"}
    assert a.communication["calls"].sum() == sum(issued(t, 0).values())
    assert set(api.analyze(DIST / "tp" / "rank0.json.gz").communication["role"].to_list()) == {"world"}
    bad = CliRunner().invoke(cli, ["analyze", str(DIST / "tp" / "rank0.json.gz"), "--no-cache", "--group-role", "default_pg"])
    assert bad.exit_code == 2 and "GROUP=ROLE" in bad.output


def test_summary_keeps_the_table_and_refuses_a_tampered_one(tmp_path):
    truth("fsdp2_tp")
    s = summarize(api.analyze(DIST / "fsdp2_tp" / "rank0.json.gz"))
    write_summary(s, tmp_path / "r0.tfsum")
    back = read_summary(tmp_path / "r0.tfsum")
    assert back.communication.equals(s.communication)
    from traceflops.core.errors import FormatError
    from traceflops.storage.bundle import read_bundle, write_bundle

    tables, meta = read_bundle(tmp_path / "r0.tfsum")
    tables["communication"] = tables["communication"].with_columns(pl.col("calls").cast(pl.Utf8))
    write_bundle(tmp_path / "bad.tfsum", tables, meta)
    with pytest.raises(FormatError, match="communication table"):
        read_summary(tmp_path / "bad.tfsum")


def test_no_communication_no_section():
    a = api.analyze(FIXTURES / "cpu" / next(p.name for p in (FIXTURES / "cpu").glob("*.json.gz")))
    assert a.communication is None
