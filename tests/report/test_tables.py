"""Tables as parquet and CSV: every file written, row counts equal to the frames', nested values as JSON text."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.builders import CPU, rank_traces, scenario_trace
from traceflops.core.results import ModelOptions
from traceflops.report.tables import (
    flat,
    frames,
    job_frames,
    write_job_tables,
    write_tables,
)
from traceflops.run.load import analyze
from traceflops.views.job import job_view, summarize


def check(written: dict, named: dict):
    assert set(written) == set(named)
    for name, df in named.items():
        w = written[name]
        assert Path(w["parquet"]).is_file() and Path(w["csv"]).is_file()
        assert w["rows"] == df.height
        assert pl.read_parquet(w["parquet"]).height == df.height
        assert pl.read_csv(w["csv"], infer_schema_length=0).height == df.height


def test_cpu_tables(tmp_path):
    a = analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), ModelOptions(peak_tflops=1))
    named = frames(a)
    assert {"kernels", "ops", "steps", "partition"} <= set(named)
    written = write_tables(a, tmp_path / "t")
    check(written, named)
    steps = pl.read_csv(written["steps"]["csv"])
    budgets = [json.loads(x) for x in steps["loss_budget"]]
    assert budgets[0] == pytest.approx(a.steps["loss_budget"][0])
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]  # no temp files


def test_gpu_tables_with_rollups_and_collectives(tmp_path):
    a = analyze(scenario_trace(tmp_path, "linking"))
    named = frames(a)
    assert {"kernels", "ops", "steps", "partition", "idle_gaps", "collectives", "roofline", "by_kernel", "by_module"} <= set(named)
    assert named["collectives"].height == 1
    written = write_tables(a, tmp_path / "t")
    check(written, named)
    # nested columns survive in parquet and are JSON text in CSV
    bk = pl.read_parquet(written["by_kernel"]["parquet"])
    assert isinstance(bk.schema["phases"], pl.List)
    csv = pl.read_csv(written["by_kernel"]["csv"])
    assert all(isinstance(json.loads(x), list) for x in csv["phases"])


def test_job_tables(tmp_path):
    job = job_view([summarize(analyze(p)) for p in rank_traces(tmp_path)])
    named = job_frames(job)
    assert {"ranks", "job_steps", "rank_steps", "collectives", "stragglers"} <= set(named)
    check(write_job_tables(job, tmp_path / "j"), named)


def test_flat_serializes_objects_and_nulls():
    df = pl.DataFrame({"o": pl.Series([{"a": 1}, None], dtype=pl.Object), "n": [None, None], "l": [[1, 2], []]})
    out = flat(df, nested=False)
    assert out["o"].to_list() == ['{"a":1}', None]
    assert out["l"].to_list() == ["[1,2]", "[]"]
    assert out.schema["n"] == pl.Utf8
    assert isinstance(flat(df, nested=True).schema["l"], pl.List)


def test_write_extras(tmp_path):
    from traceflops.cli.reports import write_extras

    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"), ModelOptions(peak_tflops=1))
    write_extras(a, html=str(tmp_path / "r.html"), tables=str(tmp_path / "tables"))
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "tables" / "steps.parquet").is_file()
