"""In a notebook: an Analysis and a Job show as a short summary, the API is visible to completion, tables come named."""

from __future__ import annotations

import pytest

import traceflops
from tests.builders import CPU, rank_traces

TRACE = CPU / "ns_ckpt_nonreentrant.json.gz"


@pytest.fixture(scope="module")
def analysis():
    return traceflops.analyze(TRACE, peak_tflops=0.2)


def test_dir_offers_the_notebook_api():
    names = dir(traceflops)
    for n in ("analyze", "analyze_job", "diff", "to_html", "to_pandas", "to_polars", "Frames"):
        assert n in names
    assert callable(traceflops.diff) and callable(traceflops.analyze_job)


def test_an_analysis_shows_as_one_short_line(analysis):
    text = repr(analysis)
    assert len(text) < 400, len(text)
    assert "ns_ckpt_nonreentrant.json.gz" in text
    assert "2 of 2 steps counted" in text
    assert "MFU 2.0%" in text and "HFU 2.5%" in text
    assert "non_matmul 52.6%" in text  # the largest loss-budget term


def test_an_analysis_shows_as_a_small_html_card(analysis):
    page = analysis._repr_html_()
    assert len(page) < 5000
    assert "MFU 2.0%" in page and "non_matmul" in page
    assert analysis.advice and analysis.advice[0]["title"].split(":")[0] in page
    assert "<script" not in page


def test_the_html_card_escapes_what_the_trace_names(analysis):
    from dataclasses import replace

    from traceflops.core import sections

    item = sections.replace(analysis.advice[0], title="<script>alert(1)</script>", share=0.5, unit="x")
    hostile = replace(analysis, advice=[item])
    page = hostile._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_a_job_shows_as_one_short_line(tmp_path):
    job = traceflops.analyze_job(rank_traces(tmp_path))
    text = repr(job)
    assert len(text) < 400 and text.startswith("<traceflops.Job 4 ranks")
    assert "mean over ranks" in text
    assert "loss budget" in job._repr_html_()


def test_diff_from_the_package(analysis):
    d = traceflops.diff(analysis, TRACE, peak_tflops=0.2)
    assert d["schema"] == "traceflops.diff/1"
    assert d["headline"]["mfu"]["delta"] == pytest.approx(0.0, abs=1e-12)


def test_tables_come_as_named_frames(analysis):
    frames = traceflops.to_polars(analysis)
    assert isinstance(frames, traceflops.Frames) and isinstance(frames, dict)
    assert frames.steps is frames["steps"]
    assert "steps" in dir(frames) and "steps (2 rows)" in repr(frames)
    with pytest.raises(AttributeError, match="the tables"):
        _ = frames.nonsense


def test_to_pandas_gives_named_frames(analysis):
    pytest.importorskip("pandas")
    frames = analysis.to_pandas()
    assert isinstance(frames, traceflops.Frames)
    assert len(frames.steps) == 2
