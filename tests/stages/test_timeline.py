"""Time partition, overlays, idle gaps and launch statistics, against answers worked out by hand.

Each synthetic frame is written out in the test with the numbers it should
give; the random conservation tests compare with a per-microsecond
rasterization written here, independent of the sweep in the code under test.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.builders import kernels, launches, ops, steps
from traceflops.core.vocab import OVERLAYS, PARTITION
from traceflops.stages.idle import idle_gaps, is_sync_call, launch_stats
from traceflops.stages.timeline import partition


def row(p: pl.DataFrame, step: int = 0, device: int | None = 0) -> dict:
    q = p.filter(pl.col("step") == step)
    q = q.filter(pl.col("device").is_null()) if device is None else q.filter(pl.col("device") == device)
    assert q.height == 1
    return q.row(0, named=True)


def assert_parts(r: dict, **expected: float) -> None:
    """The named columns equal their expected values; every other partition class is 0."""
    for c in PARTITION + OVERLAYS:
        want = expected.get(c, 0.0)
        assert r[c] == pytest.approx(want, abs=1e-9), c


# ---------------------------------------------------------------- partition


def test_communication_half_covered_by_gemm_on_another_stream():
    # GEMM on stream 7 over [10, 30); all-reduce on stream 9 over [20, 40):
    # [20, 30) is under the GEMM, [30, 40) is exposed.
    k = kernels(
        {"ts": 10, "dur": 20, "cls": "matmul", "stream": "7"},
        {"ts": 20, "dur": 20, "cls": "communication", "stream": "9"},
        linked=True,
    )
    r = row(partition(k, steps((0, 100))))
    assert_parts(r, matmul=20, communication_exposed=10, idle=70, communication_overlapped=10,
                 communication_total=20, matmul_known=20)


def test_kernel_spanning_two_steps_splits_its_time():
    k = kernels({"ts": 80, "dur": 50, "cls": "other_compute"}, linked=True)
    p = partition(k, steps((0, 100), (100, 100)))
    assert_parts(row(p, 0), other_compute=20, idle=80)
    assert_parts(row(p, 1), other_compute=30, idle=70)


def test_memcpy_and_memset_only_count_where_no_compute_runs():
    # compute [0, 50); memcpy [40, 60) → exposed [50, 60); memset [55, 70) → [60, 70);
    # communication [65, 80) → exposed [70, 80), its [65, 70) is under memset (neither exposed nor overlapped).
    k = kernels(
        {"ts": 0, "dur": 50, "cls": "other_compute", "stream": "7"},
        {"ts": 40, "dur": 20, "cls": "memcpy", "stream": "8"},
        {"ts": 55, "dur": 15, "cls": "memset", "stream": "9"},
        {"ts": 65, "dur": 15, "cls": "communication", "stream": "10"},
        linked=True,
    )
    r = row(partition(k, steps((0, 100))))
    assert_parts(r, other_compute=50, memcpy=20, communication_exposed=10, idle=20, communication_total=15)


def test_one_class_on_two_streams_counts_once():
    k = kernels(
        {"ts": 0, "dur": 30, "cls": "matmul", "stream": "7"},
        {"ts": 20, "dur": 30, "cls": "matmul", "stream": "8"},
        {"ts": 10, "dur": 50, "cls": "other_compute", "stream": "9"},  # only [50, 60) is its own
        linked=True,
    )
    r = row(partition(k, steps((0, 100))))
    assert_parts(r, matmul=50, other_compute=10, idle=40, matmul_known=50)


def test_matmul_known_unknown_split_and_recompute_overlay():
    # known [0, 10); unknown [10, 30); known [25, 35) overlapping the unknown one:
    # [25, 30) has one of each and is shared 2.5 / 2.5.
    # known = 10 + 2.5 + 5 = 17.5; unknown = 15 + 2.5 = 17.5.
    # recompute-phase kernels: the unknown matmul [10, 30) and an elementwise [40, 50):
    # recompute overlay = 20 + 10; a recompute memset [50, 55) is not compute.
    k = kernels(
        {"ts": 0, "dur": 10, "cls": "matmul"},
        {"ts": 10, "dur": 20, "cls": "matmul", "flops": None, "phase": "recompute"},
        {"ts": 25, "dur": 10, "cls": "matmul", "stream": "8"},
        {"ts": 40, "dur": 10, "cls": "other_compute", "phase": "recompute"},
        {"ts": 50, "dur": 5, "cls": "memset", "phase": "recompute"},
        linked=True,
    )
    r = row(partition(k, steps((0, 100))))
    assert_parts(r, matmul=35, other_compute=10, memcpy=5, idle=50, recompute=30,
                 matmul_known=17.5, matmul_unknown=17.5)


def test_step_without_kernels_is_all_idle_and_devices_are_separate():
    k = kernels(
        {"ts": 0, "dur": 40, "cls": "matmul", "device": 0},
        {"ts": 10, "dur": 10, "cls": "communication", "device": 1},
        linked=True,
    )
    p = partition(k, steps((0, 100), (100, 50)))
    assert p.height == 4  # 2 devices × 2 steps
    assert_parts(row(p, 0, 0), matmul=40, idle=60, matmul_known=40)
    assert_parts(row(p, 0, 1), communication_exposed=10, idle=90, communication_total=10)
    assert_parts(row(p, 1, 0), idle=50)
    assert_parts(row(p, 1, 1), idle=50)


def test_trace_without_device_work_gives_one_idle_row_per_step():
    p = partition(kernels(linked=True), steps((0, 100), (100, 30)))
    assert p.height == 2 and p["device"].null_count() == 2
    assert_parts(row(p, 1, None), idle=30)


def test_kernels_outside_every_window_are_ignored_and_zero_length_ones_harmless():
    k = kernels(
        {"ts": -50, "dur": 40, "cls": "matmul"},
        {"ts": 150, "dur": 10, "cls": "matmul"},
        {"ts": 20, "dur": 0, "cls": "communication"},
        {"ts": 30, "dur": 10, "cls": "other_compute", "step": -1},  # launched outside: its time still counts
        linked=True,
    )
    assert_parts(row(partition(k, steps((0, 100)))), other_compute=10, idle=90)


# ---------------------------------------------------------------- conservation on random intervals

CLASSES = ["matmul", "other_compute", "memcpy", "memset", "communication"]


def random_kernels(rng: np.random.Generator, n: int, horizon: int, origin: float) -> pl.DataFrame:
    ts = rng.integers(-20, horizon, n)
    dur = rng.integers(0, 60, n)
    cls = rng.choice(CLASSES, n)
    return pl.DataFrame(
        {
            "device": rng.integers(0, 2, n),
            "stream": rng.choice(["7", "8", "9", "20"], n),
            "ts": (ts + origin).astype(float),
            "dur": dur.astype(float),
            "cls": cls,
            "phase": rng.choice(["forward", "backward", "recompute"], n),
            "step": np.zeros(n, np.int64),
            "flops": np.where((cls == "matmul") & (rng.random(n) < 0.7), 1e9, np.nan),
            "name": ["k"] * n,
            "launch_ts": (ts + origin - 5).astype(float),
        }
    ).with_columns(pl.col("flops").fill_nan(None))


def rasterize(k: pl.DataFrame, device: int, start: float, window: float, origin: float) -> dict[str, float]:
    """Brute force on integer times: classify every microsecond of the window."""
    t = np.arange(int(start - origin), int(start - origin + window))
    active = {c: np.zeros(len(t), bool) for c in ("matmul", "other_compute", "memcpy", "communication")}
    n_known = np.zeros(len(t))
    n_unknown = np.zeros(len(t))
    rec = np.zeros(len(t), bool)
    for r in k.filter(pl.col("device") == device).iter_rows(named=True):
        on = (t >= r["ts"] - origin) & (t < r["ts"] - origin + r["dur"])
        c = "memcpy" if r["cls"] == "memset" else r["cls"]
        active[c] |= on
        if r["cls"] == "matmul":
            if r["flops"] is None:
                n_unknown += on
            else:
                n_known += on
        if r["cls"] in ("matmul", "other_compute") and r["phase"] == "recompute":
            rec |= on
    mm = active["matmul"]
    oc = active["other_compute"] & ~mm
    cp = active["memcpy"] & ~mm & ~active["other_compute"]
    compute = active["matmul"] | active["other_compute"]
    cm = active["communication"] & ~compute & ~active["memcpy"]
    share = np.where(mm, n_known / np.maximum(n_known + n_unknown, 1), 0.0)
    return {
        "matmul": mm.sum(),
        "other_compute": oc.sum(),
        "memcpy": cp.sum(),
        "communication_exposed": cm.sum(),
        "idle": (~(compute | active["memcpy"] | active["communication"])).sum(),
        "communication_overlapped": (active["communication"] & compute).sum(),
        "communication_total": active["communication"].sum(),
        "recompute": rec.sum(),
        "matmul_known": share.sum(),
        "matmul_unknown": (mm.sum() - share.sum()),
    }


@pytest.mark.parametrize("seed,origin", [(0, 0.0), (1, 3_743_411_222_894.0), (2, 1_000_000.0)])
def test_partition_matches_rasterization_and_sums_to_each_window(seed, origin):
    rng = np.random.default_rng(seed)
    k = random_kernels(rng, 300, 1000, origin)
    # consecutive windows, plus a host window that overlaps two of them (a step
    # without device work keeps its host span)
    w = [(0, 250), (250, 350), (600, 400), (500, 180)]
    st = steps(*[(s + origin, d) for s, d in w])
    p = partition(k, st)
    assert p.height == 2 * len(w)
    for r in p.iter_rows(named=True):
        want = rasterize(k, r["device"], r["start"], r["window"], origin)
        for c, v in want.items():
            assert r[c] == pytest.approx(v, abs=1e-6), (seed, r["step"], r["device"], c)
        assert sum(r[c] for c in PARTITION) == pytest.approx(r["window"], rel=1e-12)


# ---------------------------------------------------------------- idle gaps


def gap_fixture():
    """Four gaps in one step [0, 120) and an empty step [200, 300):

    [10, 20): a cudaDeviceSynchronize over [12, 18) on the host → sync
              (the kernel after it was launched late, at 19, too: sync comes first);
    [30, 45): a DataLoader op over [32, 40) → input_pipeline (its next kernel was launched late, at 41);
    [60, 70): the next kernel was launched at 65, after the gap began → host_bound;
    [100, 103): the next kernel was launched at 50, long before → launch_gap;
    [200, 300): nothing ends the gap → unknown.
    """
    k = kernels(
        {"ts": 0, "dur": 10, "cls": "matmul", "launch_ts": -5},
        {"ts": 20, "dur": 10, "cls": "other_compute", "launch_ts": 19},
        {"ts": 45, "dur": 15, "cls": "other_compute", "launch_ts": 41},
        {"ts": 70, "dur": 30, "cls": "memcpy", "launch_ts": 65},
        {"ts": 103, "dur": 17, "cls": "matmul", "launch_ts": 50},
        {"ts": 103, "dur": 5, "cls": "memset", "launch_ts": 102, "stream": "9"},  # starts together; launched later
        linked=True,
    )
    host_calls = launches(
        ("cudaLaunchKernel", "1", 19.0, 2.0, 2),
        ("cudaDeviceSynchronize", "1", 12.0, 6.0, 3),
        ("cudaMemcpyAsync", "1", 61.0, 5.0, 4),  # the async memcpy over [61, 66) must not count as sync
    )
    host_ops = ops(
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "1", 32.0, 8.0, None),
        ("aten::mm", "1", 60.0, 10.0, None),
    )
    return k, host_calls, host_ops, steps((0, 120), (200, 100))


def test_idle_gaps_and_their_reasons():
    k, host_calls, host_ops, st = gap_fixture()
    g = idle_gaps(k, host_calls, host_ops, st).sort("start")
    assert g.select("step", "start", "dur", "reason").rows() == [
        (0, 10.0, 10.0, "sync"),
        (0, 30.0, 15.0, "input_pipeline"),
        (0, 60.0, 10.0, "host_bound"),
        (0, 100.0, 3.0, "launch_gap"),
        (1, 200.0, 100.0, "unknown"),
    ]
    assert g["next_launch_ts"].to_list() == [19.0, 41.0, 65.0, 50.0, None]
    assert g["device"].to_list() == [0] * 5


def test_idle_gaps_sum_to_the_partitions_idle():
    k, host_calls, host_ops, st = gap_fixture()
    g = idle_gaps(k, host_calls, host_ops, st)
    p = partition(k, st)
    per = g.group_by("step").agg(pl.col("dur").sum()).sort("step")
    assert per["dur"].to_list() == pytest.approx(p.sort("step")["idle"].to_list())


def test_a_queued_kernel_makes_a_launch_gap_even_under_a_sync():
    # the host sits in cudaStreamSynchronize over [5, 40) and a DataLoader op over [5, 40),
    # but the kernel after the gap [10, 20) was launched at 2: it was queued, so neither caused the gap
    k = kernels(
        {"ts": 0, "dur": 10, "cls": "matmul", "launch_ts": 1},
        {"ts": 20, "dur": 10, "cls": "matmul", "launch_ts": 2},
        linked=True,
    )
    sync = launches(("cudaStreamSynchronize", "1", 5.0, 35.0))
    loader = ops(("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "1", 5.0, 35.0, None))
    g = idle_gaps(k, sync, loader, steps((0, 30)))
    assert g.select("start", "dur", "reason").rows() == [(10.0, 10.0, "launch_gap")]


def test_a_gap_across_a_step_boundary_is_cut_in_two():
    k = kernels(
        {"ts": 0, "dur": 80, "cls": "other_compute", "launch_ts": 0},
        {"ts": 130, "dur": 70, "cls": "other_compute", "launch_ts": 129},
        linked=True,
    )
    g = idle_gaps(k, None, None, steps((0, 100), (100, 100))).sort("start")
    # both parts end at the same kernel, launched at 129 after both began
    assert g.select("step", "start", "dur", "reason").rows() == [(0, 80.0, 20.0, "host_bound"), (1, 100.0, 30.0, "host_bound")]


def test_rounding_of_absolute_timestamps_makes_no_gaps():
    # 300 back-to-back kernels at ~3.7e12 µs with nanosecond timestamps, parsed as a JSON
    # reader does (decimal text → nearest double): their ends and the next starts differ by
    # up to ~5e-4 µs of rounding, which is no gap; the partition keeps it as idle slivers.
    from decimal import Decimal

    rng = np.random.default_rng(3)
    durs_ns = rng.integers(1, 5000, 300)
    starts_ns = 3_743_411_222_894_405 + np.r_[0, np.cumsum(durs_ns)[:-1]]
    k = kernels(*[{"ts": float(Decimal(int(s)) / 1000), "dur": float(Decimal(int(d)) / 1000), "cls": "other_compute",
                   "launch_ts": 0.0} for s, d in zip(starts_ns, durs_ns)], linked=True)
    st = steps((k["ts"][0], float(Decimal(int(durs_ns.sum())) / 1000)))
    assert idle_gaps(k, None, None, st).height == 0
    assert row(partition(k, st))["idle"] < 0.05


def test_sync_calls():
    names = pl.Series(["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                       "hipMemcpyWithStream", "hipDeviceSynchronize", "cuCtxSynchronize", "cudaMemcpyAsync",
                       "hipMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent", "cudaEventRecord"])
    got = pl.DataFrame({"name": names}).select(is_sync_call(pl.col("name")))["name"].to_list()
    assert got == [True] * 7 + [False] * 5


# ---------------------------------------------------------------- launch statistics


def test_launch_stats_per_step():
    k = kernels(
        {"ts": 10, "dur": 4, "cls": "matmul", "launch_ts": 9, "step": 0},
        {"ts": 20, "dur": 6, "cls": "matmul", "launch_ts": 12, "step": 0},
        {"ts": 30, "dur": 100, "cls": "matmul", "launch_ts": 0, "step": 0},
        {"ts": 150, "dur": 2, "cls": "other_compute", "launch_ts": 149, "step": 1},
        {"ts": -10, "dur": 3, "cls": "memcpy", "step": -1},
        linked=True,
    )
    s = launch_stats(k, steps((0, 140), (140, 100), (240, 10)))
    assert s.select("step", "kernels", "median_dur", "median_launch_delay").rows() == [
        (0, 3, 6.0, 8.0),  # durations 4, 6, 100; delays 1, 8, 30
        (1, 1, 2.0, 1.0),
        (2, 0, None, None),
        (-1, 1, 3.0, None),  # launched before the trace's first step, no launch recorded
    ]


# ---------------------------------------------------------------- a real trace against TraceLens


def test_mi300_partition_matches_tracelens(shared):
    """TraceLens' GPU timeline for the MI300 checkpointed ResNet, reproduced.

    TraceLens' window is our three step windows end to end (56.518 ms: from
    step 15's first device activity to step 17's last). Its `is_recompute=False`
    block leaves recompute kernels out altogether and memset out of memcpy, and
    gives communication priority over memcpy (exposed memcpy = memcpy under
    neither compute nor communication). Feeding `partition` those kernels with
    the communication and memcpy labels swapped gives exactly its numbers:
    our 'memcpy' column is then its exposed communication, and our
    'communication_exposed' column its exposed memcpy. Its `is_recompute=True`
    block is the recompute compute kernels alone, over their own span.
    TraceLens rounds times to whole nanoseconds: 0.1 µs tolerance.
    """
    import csv

    from traceflops.run.load import analyze

    a = analyze(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"))
    ref: dict[tuple[str, bool], float] = {}
    with open(shared / "reference" / "mi300_resnet_act_checkpoint.tracelens_gpu_timeline.csv") as f:
        for r in csv.DictReader(f):
            ref[(r["type"], r["is_recompute"] == "True")] = float(r["time ms"]) * 1000.0
    tol = 0.1
    k = a.kernels
    st = a.steps
    one = pl.DataFrame({"step": [0], "name": ["all"], "start": [st["start"].min()], "window": [st["window"].sum()]})
    assert one["window"][0] == pytest.approx(ref[("total_time", False)], abs=tol)

    # our own partition over the same window, the DESIGN priorities, all kernels
    ours = partition(k, st).select(PARTITION).sum().row(0, named=True)
    assert ours["matmul"] + ours["other_compute"] == pytest.approx(ref[("computation_time", False)] + ref[("computation_time", True)], abs=tol)
    assert partition(k, st)["communication_total"].sum() == pytest.approx(ref[("total_comm_time", False)], abs=tol)

    swap = {"communication": "memcpy", "memcpy": "communication"}
    tl_view = k.filter((pl.col("phase") != "recompute") & (pl.col("cls") != "memset")).with_columns(cls=pl.col("cls").replace(swap))
    r = partition(tl_view, one).row(0, named=True)
    assert r["matmul"] + r["other_compute"] == pytest.approx(ref[("computation_time", False)], abs=tol)
    assert r["memcpy"] == pytest.approx(ref[("exposed_comm_time", False)], abs=tol)
    assert r["communication_exposed"] == pytest.approx(ref[("exposed_memcpy_time", False)], abs=tol)
    assert r["idle"] == pytest.approx(ref[("idle_time", False)], abs=tol)
    assert r["communication_total"] == pytest.approx(ref[("total_memcpy_time", False)], abs=tol)  # swapped: memcpy

    # every idle gap of this trace sits between queued kernels (launches run ~25 ms ahead),
    # although a 37.8 ms hipDeviceSynchronize overlaps many of them
    g = idle_gaps(k, a.trace.launches, a.ops, st)
    assert set(g["reason"]) == {"launch_gap"}
    assert g["dur"].sum() == pytest.approx(ours["idle"], abs=0.01)

    rec = k.filter((pl.col("phase") == "recompute") & pl.col("cls").is_in(["matmul", "other_compute"]))
    span = pl.DataFrame({"step": [0], "name": ["recompute"], "start": [rec["ts"].min()],
                         "window": [(rec["ts"] + rec["dur"]).max() - rec["ts"].min()]})
    r = partition(rec, span).row(0, named=True)
    assert r["window"] == pytest.approx(ref[("total_time", True)], abs=tol)
    assert r["matmul"] + r["other_compute"] == pytest.approx(ref[("computation_time", True)], abs=tol)
    assert r["idle"] == pytest.approx(ref[("idle_time", True)], abs=tol)
