"""Each collective's share of the exposed and hidden communication time, against hand counts and a brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tests.builders import kernels, steps
from traceflops.stages.comm_exposure import comm_exposure
from traceflops.stages.timeline import partition


def test_two_overlapping_collectives_share_what_they_expose_together():
    # compute [0, 10); all-gather A [5, 20); reduce-scatter B [15, 25); window [0, 30).
    # A: hidden [5, 10) = 5; alone and exposed [10, 15) = 5; with B [15, 20) = 2.5 -> exposed 7.5.
    # B: with A [15, 20) = 2.5; alone [20, 25) = 5 -> exposed 7.5, hidden 0.
    k = kernels(
        {"ts": 0, "dur": 10, "cls": "other_compute", "stream": "7"},
        {"ts": 5, "dur": 15, "cls": "communication", "stream": "9"},
        {"ts": 15, "dur": 10, "cls": "communication", "stream": "11"},
        linked=True,
    )
    e = comm_exposure(k, steps((0, 30))).sort("row")
    assert e["row"].to_list() == [1, 2]
    assert e["exposed"].to_list() == pytest.approx([7.5, 7.5])
    assert e["overlapped"].to_list() == pytest.approx([5.0, 0.0])
    assert e["total"].to_list() == pytest.approx([12.5, 7.5])  # communication_total (20) cut the same way


def test_a_wait_keeps_only_what_no_collective_in_flight_takes():
    # a thread blocked in wait_tensor [0, 20) while the collective runs [5, 15) on the backend's thread:
    # the collective takes [5, 15) whole (10), the wait keeps [0, 5) and [15, 20) (10)
    k = kernels(
        {"ts": 0, "dur": 20, "cls": "communication", "stream": "1", "name": "_c10d_functional::wait_tensor"},
        {"ts": 5, "dur": 10, "cls": "communication", "stream": "2", "name": "gloo:all_reduce"},
        linked=True,
    )
    e = comm_exposure(k, steps((0, 40))).sort("row")
    assert e["exposed"].to_list() == pytest.approx([10.0, 10.0])


def test_no_communication_gives_no_rows():
    k = kernels({"ts": 0, "dur": 10, "cls": "matmul"}, linked=True)
    assert comm_exposure(k, steps((0, 30))).height == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_match_a_brute_force_and_add_up_to_the_partition(seed):
    rng = np.random.default_rng(seed)
    n = 120
    ts = rng.integers(0, 900, n).astype(float)
    dur = rng.integers(1, 80, n).astype(float)
    cls = rng.choice(["matmul", "other_compute", "memcpy", "communication"], n)
    k = kernels(*[{"ts": t, "dur": d, "cls": c, "stream": str(rng.integers(0, 4)), "device": int(rng.integers(0, 2))}
                  for t, d, c in zip(ts, dur, cls)], linked=True)
    w = steps((0, 400), (400, 600))
    e = comm_exposure(k, w)
    # brute force on integer microseconds: every instant's exposed (or hidden) time split among the collectives active
    want_exp, want_hid = np.zeros(n), np.zeros(n)
    for dev in (0, 1):
        mine = np.flatnonzero(k["device"].to_numpy() == dev)
        for t in range(0, 1000):
            on = [i for i in mine if ts[i] <= t < ts[i] + dur[i]]
            comm = [i for i in on if cls[i] == "communication"]
            if not comm:
                continue
            compute = any(cls[i] in ("matmul", "other_compute") for i in on)
            memcpy = any(cls[i] == "memcpy" for i in on)
            for i in comm:
                if compute:
                    want_hid[i] += 1 / len(comm)
                elif not memcpy:
                    want_exp[i] += 1 / len(comm)
    got = dict(zip(e["row"].to_list(), zip(e["exposed"].to_list(), e["overlapped"].to_list())))
    for i in np.flatnonzero(cls == "communication"):
        assert got.get(i, (0.0, 0.0)) == pytest.approx((want_exp[i], want_hid[i]), abs=1e-6)
    p = partition(k, w)
    assert e["exposed"].sum() == pytest.approx(p["communication_exposed"].sum())
    assert e["overlapped"].sum() == pytest.approx(p["communication_overlapped"].sum())
