"""`beside`: a part of an analysis worked out on a thread of its own where polars has more than one thread, at once
on the caller's thread where it has one; its value (or its error) is the same either way, and so is the analysis."""

import threading
from contextvars import ContextVar

import pytest

from traceflops.core import beside as bs
from traceflops.core.results import ModelOptions
from traceflops.pipeline import analyze_trace
from traceflops.report.jsonreport import to_dict
from traceflops.run.load import load
from tests.builders import scenario_trace

_SEEN: ContextVar[str] = ContextVar("seen", default="unset")


@pytest.fixture(params=[1, 2], ids=["one polars thread", "two polars threads"])
def threads(request, monkeypatch):
    monkeypatch.setattr(bs.pl, "thread_pool_size", lambda: request.param)
    return request.param


def test_the_value_the_thread_and_the_context(threads):
    """With two polars threads the part runs on another thread, with one on the caller's; either way it sees the
    caller's context and gives its value."""
    caller = threading.get_ident()
    token = _SEEN.set("the caller's")
    try:
        later = bs.beside(lambda a, b: (a + b, threading.get_ident(), _SEEN.get()), 2, 3)
        value, ran_on, seen = later.result()
    finally:
        _SEEN.reset(token)
    assert value == 5
    assert seen == "the caller's"
    assert (ran_on != caller) == (threads > 1)
    assert later.result()[0] == 5  # asked again: the same value


def test_an_error_is_raised_where_the_value_is_asked_for(threads):
    def fails():
        raise ZeroDivisionError("in the part")

    later = bs.beside(fails)  # nothing raised yet, on either thread
    with pytest.raises(ZeroDivisionError, match="in the part"):
        later.result()


def _report(path: str) -> dict:
    a = analyze_trace(load(path), ModelOptions())
    return {"report": to_dict(a), "path": a.critical_path, "modules": a.by_module, "kernels": a.by_kernel}


@pytest.mark.parametrize("name", ["modules", "roofline", "linking"])
def test_an_analysis_is_the_same_with_its_parts_beside_or_not(tmp_path, monkeypatch, name):
    """The critical path reads only what is final where it starts: the same report, frames and all, whether it ran
    beside the rest or after it."""
    path = scenario_trace(tmp_path, name)
    got = {}
    for n in (1, 2):
        monkeypatch.setattr(bs.pl, "thread_pool_size", lambda n=n: n)
        got[n] = _report(path)
    assert got[1]["path"].height and got[1]["modules"].height  # both parts have work to do
    assert got[1]["report"] == got[2]["report"]
    for frame in ("path", "modules", "kernels"):
        assert got[1][frame].equals(got[2][frame]), frame


def test_a_shared_trace_is_the_same_with_its_parts_beside_or_not(shared, monkeypatch):
    path = str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz")
    got = {}
    for n in (1, 2):
        monkeypatch.setattr(bs.pl, "thread_pool_size", lambda n=n: n)
        got[n] = _report(path)
    assert got[1]["path"].height > 100 and got[1]["modules"].height
    assert got[1]["report"] == got[2]["report"]
    for frame in ("path", "modules", "kernels"):
        assert got[1][frame].equals(got[2][frame]), frame
