"""The report's sections (core.sections): frozen typed values, encoded for the report without their unset fields, read as
mappings where unset is absent, decoded back to equal values, and kept by the report cache unchanged."""

from __future__ import annotations

import json

import msgspec
import pytest
from click.testing import CliRunner

from tests.builders import CPU
from traceflops.cli.main import main
from traceflops.core.results import ModelOptions
from traceflops.core.sections import (
    UNSET,
    ModelSection,
    PathSummary,
    StepCount,
    StepStats,
    Totals,
    UnknownKernel,
    WarmupStep,
    decode,
    encode,
    replace,
)
from traceflops.run.load import analyze
from traceflops.run.options import model_options
from traceflops.storage import report_cache

NAME = "ns_eager_sdpa"
TRACE = CPU / f"{NAME}.json.gz"
MODEL = json.loads((CPU / "truth.json").read_text())[NAME]["model"]  # the model the trace was recorded from
DESCRIBED = {"params": MODEL["params_matmul"], "layers": MODEL["layers"], "heads": MODEL["heads"],
             "head_dim": MODEL["head_dim"], "seq_len": MODEL["seq_len"], "tokens_per_step": MODEL["tokens_per_step"]}
CAVEAT = "bands are rules of thumb"


@pytest.fixture(scope="module")
def from_trace():
    """Model FLOPs from the trace (no description): the model section leaves the description's fields unset."""
    return analyze(str(TRACE), ModelOptions(peak_tflops=1.0))


@pytest.fixture(scope="module")
def described():
    """Model FLOPs from a description (PaLM's 6N + 12·L·H·Q·T): the model section has them all."""
    return analyze(str(TRACE), model_options(**DESCRIBED, peak_tflops=1.0))


# --- frozen --------------------------------------------------------------------------------------------------------


def test_a_section_cannot_be_changed_in_place(from_trace):
    w = WarmupStep(step=10, window_us=300.0, ratio=3.0)
    with pytest.raises(AttributeError):
        w.ratio = 4.0
    t = from_trace.totals
    mfu = t.mfu
    with pytest.raises(AttributeError):
        t.mfu = 0.5
    with pytest.raises(AttributeError):
        t.step_count.counted = 0  # a section inside another is frozen too
    with pytest.raises(TypeError):
        t["mfu"] = 0.5  # the mapping view is read-only
    assert t.mfu == mfu and w.ratio == 3.0


def test_replace_makes_a_new_section_and_leaves_the_old_one(from_trace):
    t = from_trace.totals
    before = encode(t)
    u = replace(t, mfu=0.5)
    assert u is not t and isinstance(u, Totals)
    assert u.mfu == 0.5 and encode(t) == before
    assert encode(u) == {**before, "mfu": 0.5}


def test_a_section_is_built_by_keyword_with_every_required_field():
    with pytest.raises(TypeError):
        WarmupStep(10, 300.0, 3.0)  # positional: not a section's way
    with pytest.raises(TypeError):
        WarmupStep(step=10, window_us=300.0)  # ratio has no default


# --- encode: UNSET left out, None kept -----------------------------------------------------------------------------


def test_encode_leaves_unset_fields_out_and_keeps_none_fields():
    p = PathSummary(available=False, why="no device activity")
    assert encode(p) == {"available": False, "why": "no device activity"}
    m = ModelSection(source="trace", mode="inference", flops_per_step=None, flops_per_step_no_attention=None, band=None,
                     band_caveat="c")
    assert encode(m) == {"source": "trace", "mode": "inference", "flops_per_step": None, "flops_per_step_no_attention": None,
                         "band": None, "band_caveat": "c"}
    # a field that may be unset, set to None, is kept (null in the report)
    assert encode(replace(m, tokens_per_step=None)) == {**encode(m), "tokens_per_step": None}
    assert list(encode(replace(m, tokens_per_step=None))) == ["source", "mode", "tokens_per_step", "flops_per_step",
                                                              "flops_per_step_no_attention", "band", "band_caveat"]  # field order


def test_encode_gives_plain_values_all_the_way_down():
    s = StepStats(count=2, mean_us=200.0, median_us=200.0, std_us=None, cv=None, mad_us=0.0, outliers=[],
                  warmup=[WarmupStep(step=10, window_us=300.0, ratio=3.0)])
    got = encode(s)
    assert got == {"count": 2, "mean_us": 200.0, "median_us": 200.0, "std_us": None, "cv": None, "mad_us": 0.0, "outliers": [],
                   "warmup": [{"step": 10, "window_us": 300.0, "ratio": 3.0}]}
    assert type(got["warmup"][0]) is dict
    assert json.loads(json.dumps(got)) == got


def test_a_real_sections_unset_fields_are_not_in_its_encoding(from_trace, described):
    m = encode(from_trace.model)
    assert m["source"] == "trace" and m["band"] == from_trace.model.band and "band_caveat" in m
    for f in ("seq_len", "tokens_per_step", "flops_per_token", "params_matmul", "by_part"):
        assert getattr(from_trace.model, f) is UNSET and f not in m
    d = encode(described.model)
    assert d["seq_len"] == MODEL["seq_len"] and d["tokens_per_step"] == MODEL["tokens_per_step"]
    assert d["params_matmul"] == MODEL["params_matmul"]
    assert "note" not in d and described.model.note is UNSET
    assert "by_part" in d and d["by_part"] is None  # set to None: kept
    assert list(d) == [f for f in ModelSection.__struct_fields__ if getattr(described.model, f) is not UNSET]


# --- the mapping view ----------------------------------------------------------------------------------------------


def test_the_mapping_view_treats_unset_as_absent():
    p = PathSummary(available=False, why="no device activity")
    assert p.keys() == ["available", "why"] and list(p) == ["available", "why"] and len(p) == 2
    assert dict(p) == {"available": False, "why": "no device activity"}
    assert p.items() == [("available", False), ("why", "no device activity")] and p.values() == [False, "no device activity"]
    assert p["available"] is False and p["why"] == "no device activity"
    assert "why" in p and "us" not in p and "note" not in p
    assert p.get("us") is None and p.get("us", {}) == {} and p.get("why", "x") == "no device activity"
    with pytest.raises(KeyError):
        p["us"]  # a field, but unset
    with pytest.raises(KeyError):
        p["no_such_field"]
    assert "no_such_field" not in p and p.get("no_such_field", 7) == 7
    assert 3 not in p  # a key that is not text is simply absent


def test_the_mapping_view_keeps_none_fields():
    m = ModelSection(source="trace", mode="training", flops_per_step=None, flops_per_step_no_attention=None, band=None,
                     band_caveat="c")
    assert "band" in m and m["band"] is None and m.get("band", "default") is None
    assert "seq_len" not in m and m.get("seq_len", "default") == "default"
    assert dict(m) == encode(m)


def test_a_real_sections_mapping_view_is_its_encoding_at_the_top(from_trace, described):
    for s in (from_trace.totals, from_trace.model, described.model, from_trace.step_stats, from_trace.path_summary,
              from_trace.hardware):
        assert list(dict(s)) == list(encode(s))
        assert all(dict(s)[k] is getattr(s, k) for k in s)  # the values themselves (sections inside stay sections)
    assert isinstance(from_trace.totals["step_count"], StepCount)
    assert from_trace.totals["mfu"] == from_trace.totals.mfu and from_trace.totals.get("mfu") == from_trace.totals.mfu


# --- decode(encode(x)) == x ----------------------------------------------------------------------------------------


def _roundtrips(x):
    back = decode(encode(x), type(x))
    assert type(back) is type(x) and back == x
    through_json = decode(json.loads(json.dumps(encode(x))), type(x))  # as a stored report reads it
    assert through_json == x
    return back


def test_totals_round_trip(from_trace, described):
    for a in (from_trace, described):
        t = a.totals
        assert t.flops_known and t.mfu is not None  # a real analysis with FLOPs and a peak, not an empty section
        back = _roundtrips(t)
        assert isinstance(back.step_count, StepCount) and back.step_count == t.step_count
        assert all(isinstance(k, UnknownKernel) for k in back.unknown_matmul_kernels)


def test_a_model_section_round_trips_from_the_trace_and_from_a_description(from_trace, described):
    back = _roundtrips(from_trace.model)
    assert back.source == "trace" and back.seq_len is UNSET and back.tokens_per_step is UNSET
    back = _roundtrips(described.model)
    assert back.source == "flags" and back.seq_len == MODEL["seq_len"] and back.tokens_per_step == MODEL["tokens_per_step"]
    assert back.flops_per_step is not None and back.band_caveat == described.model.band_caveat
    assert CAVEAT in back.band_caveat


def test_the_other_sections_of_an_analysis_round_trip(described):
    for s in (described.hardware, described.step_stats, described.path_summary, *described.advice):
        assert s is not None
        _roundtrips(s)
    if described.outside_steps is not None:
        _roundtrips(described.outside_steps)


def test_decode_refuses_what_is_not_the_section():
    with pytest.raises(msgspec.ValidationError):
        decode({"step": 10, "window_us": 300.0}, WarmupStep)  # ratio missing
    with pytest.raises(msgspec.ValidationError):
        decode({"step": "ten", "window_us": 300.0, "ratio": 3.0}, WarmupStep)


# --- the report cache ----------------------------------------------------------------------------------------------


def test_the_report_cache_gives_back_equal_sections(described, tmp_path):
    opts = model_options(**DESCRIBED, peak_tflops=1.0)
    report_cache.store_report(str(TRACE), opts, described, tmp_path)
    kept = report_cache.load_report(str(TRACE), opts, tmp_path)
    assert kept is not None
    for f in ("hardware", "model", "totals", "outside_steps", "step_stats", "path_summary", "advice"):
        got, want = getattr(kept, f), getattr(described, f)
        assert got == want, f
        assert type(got) is type(want), f


def _cli(args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_second_run_from_the_report_cache_gives_the_same_json(tmp_path, monkeypatch):
    flags = [x for k, v in DESCRIBED.items() for x in (f"--{k.replace('_', '-')}", v)]
    args = ["analyze", TRACE, "--format", "json", "--quiet", "--peak-tflops", "1", "--cache-dir", tmp_path / "c", *flags]
    first = _cli(args)
    assert first["model"]["source"] == "flags" and first["model"]["seq_len"] == MODEL["seq_len"]
    assert len(list((tmp_path / "c").glob("*.tfreport"))) == 1

    def no_analysis(*a, **kw):
        raise AssertionError("analysed again: the kept report was not served")

    monkeypatch.setattr("traceflops.run.load.analyze", no_analysis)
    second = _cli(args)
    assert second == first
