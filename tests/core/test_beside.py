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
    monkeypatch.setattr(bs.pl, "thread_pool_size", lambda: request.param)  # what `threaded` reads
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


def _same_either_way(path: str, monkeypatch) -> dict:
    """The analysis of `path` with the part on the caller's thread and beside it: asserted equal, report and frames."""
    got = {}
    for on in (False, True):
        monkeypatch.setattr(bs, "threaded", lambda on=on: on)
        a = analyze_trace(load(path), ModelOptions())
        got[on] = {"report": to_dict(a), "path": a.critical_path, "modules": a.by_module, "kernels": a.by_kernel}
    assert got[False]["report"] == got[True]["report"]
    for frame in ("path", "modules", "kernels"):
        assert got[False][frame].equals(got[True][frame]), frame
    return got[False]


@pytest.mark.parametrize("name", ["modules", "roofline", "linking"])
def test_an_analysis_is_the_same_with_its_parts_beside_or_not(tmp_path, monkeypatch, name):
    """The critical path reads only what is final where it starts: the same report, frames and all, whether it ran
    beside the rest or after it."""
    got = _same_either_way(scenario_trace(tmp_path, name), monkeypatch)
    assert got["path"].height and got["modules"].height  # the parts have work to do


def test_a_shared_trace_is_the_same_with_its_parts_beside_or_not(shared, monkeypatch):
    got = _same_either_way(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"), monkeypatch)
    assert got["path"].height > 100 and got["modules"].height
