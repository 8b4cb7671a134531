"""A hand-edited `.tfsum`: a value of the wrong kind is a clean format error (exit 3); a number out of the range a
trace may give (rank, world size, totals) is left unknown with a warning, never reaching the job's numbers."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from tests.builders import FIXTURES
from traceflops.cli.main import main
from traceflops.core.errors import EXIT_FORMAT
from traceflops.core.sections import Hardware, ModelSection, RankAdvice, Totals, encode
from traceflops.storage.bundle import read_bundle, write_bundle
from traceflops.storage.summary import read_summary, write_summary

DDP = FIXTURES / "dist" / "ddp"


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    d = tmp_path_factory.mktemp("sums")
    for r in (0, 1):
        res = CliRunner().invoke(main, ["summarize", str(DDP / f"rank{r}.json.gz"), "-o", str(d / f"r{r}.tfsum"), "--no-cache"])
        assert res.exit_code == 0, res.stderr
    return d


def edited(sums, tmp_path, meta=None, tables=None):
    t, m = read_bundle(sums / "r0.tfsum", max_bytes=1 << 30, max_rows=1 << 24)
    if meta:
        meta(m)
    if tables:
        tables(t)
    out = tmp_path / "e.tfsum"
    write_bundle(out, t, m)
    return CliRunner().invoke(main, ["merge", str(out), str(sums / "r1.tfsum"), "--format", "json"])


@pytest.mark.parametrize("key,value", [("world_size", 1 << 40), ("world_size", -8), ("rank", -1)])
def test_ranks_and_worlds_out_of_range_are_left_unknown(sums, tmp_path, key, value):
    r = edited(sums, tmp_path, meta=lambda m: m.update({key: value}))
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["totals"]["world_size"] == 2
    assert any(f"summary's {key} {value}" in w and "ignored" in w for w in d["warnings"]), d["warnings"]


def test_a_negative_total_is_left_unknown(sums, tmp_path):
    r = edited(sums, tmp_path, meta=lambda m: m["totals"].update(mfu=-3.0))
    assert r.exit_code == 0, r.stderr
    assert any("totals' mfu -3.0" in w for w in json.loads(r.stdout)["warnings"])


CASES = {
    "flops_text": (lambda m: m["totals"].update(flops="lots"), None, "totals' flops"),
    "wall_text": (lambda m: m["totals"].update(wall_us="x"), None, "totals' wall_us"),
    "time_list": (lambda m: m["totals"].update(time_us=[1]), None, "totals' time_us"),
    "peak_text": (lambda m: m.update(hardware={"name": "h100", "peak_flops": "fast"}), None, "hardware's peak_flops"),
    "model_number": (lambda m: m.update(model={**(m["model"] or {}), "source": 1}), None, "its model section"),
    "no_step_count": (lambda m: m["totals"].pop("step_count"), None, "its totals section"),
    "hardware_devices": (lambda m: m.update(hardware={**(m["hardware"] or {}), "devices": "two"}), None, "its hardware section"),
    "idle_text": (None, lambda t: t.update(idle=pl.DataFrame({"step": [0], "reason": ["sync"], "dur": ["long"]})), "idle table's dur"),
    "window_text": (None, lambda t: t.update(steps=t["steps"].with_columns(pl.col("window").cast(pl.String))), "steps table's window"),
    "path_text": (None, lambda t: t.update(path_comm=pl.DataFrame({"step": ["a"], "start": [1.0], "end": [2.0]})), "path_comm table's step"),
    "pg_number": (None, lambda t: t.update(collectives=pl.DataFrame({"pg": [1], "seq": [0], "kind": ["allreduce"], "ts": [0.0],
                                                                       "end": [1.0], "step": [0]})), "collectives table's pg"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_values_of_the_wrong_kind_are_a_format_error(sums, tmp_path, case):
    meta, tables, needle = CASES[case]
    r = edited(sums, tmp_path, meta, tables)
    assert r.exit_code == EXIT_FORMAT, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_an_empty_table_of_any_shape_is_empty(sums, tmp_path):
    r = edited(sums, tmp_path, tables=lambda t: t.update(collectives=pl.DataFrame({"x": []})))
    assert r.exit_code == 0, r.stderr


def test_a_summary_reads_back_typed(sums, tmp_path):
    s = read_summary(sums / "r0.tfsum")
    assert isinstance(s.totals, Totals) and (s.model is None or isinstance(s.model, ModelSection))
    assert s.hardware is None or isinstance(s.hardware, Hardware)
    assert s.advice and all(isinstance(x, RankAdvice) for x in s.advice)
    out = tmp_path / "again.tfsum"
    write_summary(s, out)
    again = read_summary(out)
    assert encode([again.hardware, again.model, again.totals, again.advice]) == encode([s.hardware, s.model, s.totals, s.advice])


def test_advice_entries_that_are_not_ones_are_left_out(sums, tmp_path):
    def edit(m):
        m["advice"] = [{"title": 3}, "text", *m["advice"]]

    r = edited(sums, tmp_path, meta=edit)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["advice"] is not None
