"""A local job's ranks are shared between the command's own process and its workers, each taking the next rank as it
finishes one: every rank once, summaries in input order, and a rank's error stops the job wherever the rank ran.

The workers here run each rank in the thread that hands it over (the code under test only asks and waits); the worker
processes themselves run in tests/cli/test_stopped.py, tests/run/test_scale.py and tests/views/test_job.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from traceflops.core.errors import InputError
from traceflops.run import ranks


class _InThread:
    """A stand-in rank worker: the rank analysed in the thread that asks for it."""

    def summarize(self, work):
        return ranks.attempt_packed(work)


def _here() -> bool:
    return threading.current_thread() is threading.main_thread()


def test_every_rank_once_in_order_and_both_sides_take_ranks(monkeypatch):
    seen = []

    def attempt(w):
        time.sleep(0.005)  # long enough that neither side takes every rank
        seen.append((w, _here()))
        return f"summary of rank {w}"

    monkeypatch.setattr(ranks, "_attempt", attempt)
    progress = []
    got = ranks._shared(list(range(40)), [_InThread(), _InThread()], lambda n, total: progress.append((n, total)))
    assert got == [f"summary of rank {w}" for w in range(40)]
    assert sorted(w for w, _ in seen) == list(range(40))
    assert {here for _, here in seen} == {True, False}
    assert progress == [(n, 40) for n in range(1, 41)]  # each rank counted once, as its summary arrives


@pytest.mark.parametrize("failing_side", ["this process", "a worker"])
def test_a_ranks_error_stops_the_job_wherever_it_ran(monkeypatch, failing_side):
    attempted = []

    def attempt(w):
        attempted.append(w)
        if _here() == (failing_side == "this process") and len(attempted) > 4:
            raise InputError(f"rank{w}.json", "is broken", "fix it")
        time.sleep(0.005)
        return w

    monkeypatch.setattr(ranks, "_attempt", attempt)
    with pytest.raises(InputError, match="is broken"):
        ranks._shared(list(range(200)), [_InThread()], lambda n, total: None)
    n = len(attempted)
    time.sleep(0.1)  # room for twenty more ranks, were any still handed out
    assert len(attempted) <= n + 1  # only the one a worker was running, if any
