"""Step statistics on hand-made step windows with a known outlier and a warm-up step."""

from __future__ import annotations

import statistics

import polars as pl
import pytest

from traceflops.core.sections import WarmupStep
from traceflops.metrics.stepstats import step_stats

# window = matmul 60 + other 20 + memcpy 5 + communication 5 + idle, except where noted
WINDOWS = [300, 100, 110, 98, 100, 101, 99, 130, 100, 100]


def frame(windows=WINDOWS):
    rows = []
    for i, w in enumerate(windows):
        mm, other, comm = 60.0, 20.0, 5.0
        if i == 2:
            other = 30.0  # the 110 µs step: more other compute
        if i == 7:
            comm = 35.0  # the 130 µs step: a slow collective
        rows.append({"step": 10 + i, "start": 1000.0 * i, "window": float(w), "last": i == len(windows) - 1,
                     "time_matmul": mm, "time_other_compute": other, "time_memcpy": 5.0,
                     "time_communication_exposed": comm, "time_idle": w - mm - other - 5.0 - comm})
    return pl.DataFrame(rows)


def test_moments():
    s = step_stats(frame())
    assert s["count"] == 10
    assert s["mean_us"] == pytest.approx(123.8)
    assert s["median_us"] == 100.0
    assert s["std_us"] == pytest.approx(statistics.stdev(WINDOWS))
    assert s["cv"] == pytest.approx(statistics.stdev(WINDOWS) / 123.8)
    # |w - 100| = 200 0 10 2 0 1 1 30 0 0 -> median 1
    assert s["mad_us"] == 1.0


def test_outliers_and_what_changed():
    s = step_stats(frame())
    out = {o["step"]: o for o in s["outliers"]}
    assert sorted(out) == [10, 12, 17]
    # 300: 200 µs over (> 3 MAD, > 20%); all of it idle (median idle 10)
    assert out[10]["rules"] == ["mad", "relative"]
    assert out[10]["term"] == "idle" and out[10]["term_delta_us"] == pytest.approx(200.0)
    assert out[10]["warmup"]
    # 110: 10 µs over: > 3·MAD and > 5% of the median, < 20%
    assert out[12]["rules"] == ["mad"]
    assert out[12]["term"] == "other_compute" and out[12]["term_delta_us"] == pytest.approx(10.0)
    # 130: the collective took 30 µs more than its median
    assert out[17]["rules"] == ["mad", "relative"]
    assert out[17]["term"] == "communication_exposed" and out[17]["term_delta_us"] == pytest.approx(30.0)
    assert out[17]["term_median_us"] == 5.0 and out[17]["deviation_frac"] == pytest.approx(0.3)
    assert not out[17]["warmup"]


def test_warmup_flagged_never_excluded():
    s = step_stats(frame())
    assert s.warmup == [WarmupStep(step=10, window_us=300.0, ratio=3.0)]
    assert s["count"] == 10 and s["mean_us"] == pytest.approx(sum(WINDOWS) / 10)
    # two slow steps in a row are both warm-up; a slow step later is not
    s = step_stats(frame([400, 200, 100, 100, 100, 100, 100, 300]))
    assert [w["step"] for w in s["warmup"]] == [10, 11]


def test_steady_steps_have_no_outliers():
    s = step_stats(frame([100, 100, 100, 101, 100, 100]))  # MAD 0: a 1 µs wobble is no outlier
    assert s["outliers"] == [] and s["warmup"] == []
    assert s["mad_us"] == 0.0


def test_order_follows_time_not_rows():
    f = frame([300, 100, 100, 100, 100]).reverse()
    assert [w["step"] for w in step_stats(f)["warmup"]] == [10]


def test_empty_and_single_step():
    s = step_stats(pl.DataFrame(schema={"step": pl.Int64, "window": pl.Float64}))
    assert s["count"] == 0 and s["outliers"] == [] and s["mean_us"] is None
    s = step_stats(frame([250]))
    assert s["count"] == 1 and s["std_us"] is None and s["cv"] is None and s["outliers"] == []
    # zero windows (a step without device work) are not steps to judge
    s = step_stats(pl.DataFrame({"step": [1, 2, 3], "window": [100.0, 0.0, None]}))
    assert s["count"] == 1
