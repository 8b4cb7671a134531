"""JAX programs on 4 XLA:CPU devices (fixtures/jax/multi_device/, made by fixtures/generate_flax.py with
XLA_FLAGS=--xla_force_host_platform_device_count=4) against the truth the generator took from the compiled HLO
(truth_flax.json): the devices, MFU and HFU against every device's peak, FLOPs per step and per device, the
collectives of each opcode, booked as communication, each device's time partition (recomputed here from its ops),
and single-device profiles left as they were.

Committed files only; jax is not needed (only the generator needs it).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.builders import FIXTURES, union_us
from traceflops.core.results import ModelOptions
from traceflops.parsers.xla import parse_xplane
from traceflops.run.load import analyze
from traceflops.stages.cpu_activities import cpu_activities

JAX = FIXTURES / "jax"
TRUTH_PATH = JAX / "truth_flax.json"
CASES = ("dp_mlp", "mesh2x2_mlp", "shard_map_mlp")
PEAK_TFLOPS = 1.0
PHASES = ("forward", "backward", "recompute", "optimizer", "other")
SINGLE = sorted(JAX.glob("*.xplane.pb*"))  # every other JAX fixture: one device


def _truth() -> dict:
    if not TRUTH_PATH.exists():
        pytest.skip("fixtures/jax/truth_flax.json is absent: run python fixtures/generate_flax.py")
    return json.loads(TRUTH_PATH.read_text())


def _case(case: str) -> dict:
    return _truth()["variants"][case]


def _path(case: str):
    p = JAX / _case(case)["file"]
    if not p.exists():
        pytest.skip(f"{p} is absent: run python fixtures/generate_flax.py --only {case}")
    return p


_RUNS: dict = {}


def _analysis(case: str):
    if case not in _RUNS:
        _RUNS[case] = analyze(str(_path(case)), ModelOptions(peak_tflops=PEAK_TFLOPS))
    return _RUNS[case]


def _counted(a) -> pl.DataFrame:
    """The steps the totals count (the unbounded last step and any cut one left out)."""
    out = set(a.totals["step_count"]["excluded"])
    return a.steps.filter(~pl.col("step").is_in(list(out))).sort("ts")




# -- the truth itself --------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_truth_is_consistent(case):
    """One device's dots meet the hand formula of its shard; the step's are the 4 devices' together."""
    v = _case(case)
    d, n, one, t = v["dims"], v["devices"], v["per_device"], v["per_step"]
    assert n == 4
    b = d["B"] // (2 if v["model"] == "mesh2x2" else n)  # the batch shard of one device
    f = d["F"] // (2 if v["model"] == "mesh2x2" else 1)  # mesh2x2: w1's columns and w2's rows over model (2)
    fwd = 2 * b * (d["I"] * d["D"] + 2 * d["D"] * f + d["D"] * d["C"])
    assert (one["forward"], one["backward"], one["recompute"]) == (fwd, 2 * fwd - 2 * b * d["I"] * d["D"], 0)
    assert t == {k: x * n for k, x in one.items()}
    assert t["executed"] == sum(t[p] for p in PHASES)
    assert v["collectives"] and _path(case).stat().st_size < 2 << 20


# -- devices, MFU and HFU ------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_four_devices(case):
    a, v = _analysis(case), _case(case)
    assert a.hardware["devices"] == v["devices"] == 4
    assert sorted(a.partition["device"].unique().to_list()) == [0, 1, 2, 3]
    xla = a.ops.filter(pl.col("cat") == "xla_op")
    per = xla.filter(pl.col("step") >= 0).group_by("step", "device").len()
    assert per.height == 4 * a.steps.height and per["len"].n_unique() == 1  # the same program on every device


@pytest.mark.parametrize("case", CASES)
def test_hfu_and_mfu_against_four_peaks(case):
    """HFU = executed FLOPs / (window × peak × 4), the FLOPs from the truth; MFU likewise with forward + backward
    (no model given: the trace's own, as on one device)."""
    a, t = _analysis(case), _case(case)["per_step"]
    peak = PEAK_TFLOPS * 1e12 * 4
    steps = _counted(a)
    assert steps.height >= 2
    for s in steps.iter_rows(named=True):
        assert s["hfu"] == pytest.approx(t["executed"] / (s["window"] * 1e-6 * peak), rel=1e-9)
        assert s["mfu"] == pytest.approx((t["forward"] + t["backward"]) / (s["window"] * 1e-6 * peak), rel=1e-9)
    window = float(steps["window"].sum()) * 1e-6
    assert a.totals["hfu"] == pytest.approx(steps.height * t["executed"] / (window * peak), rel=1e-9)
    assert a.totals["mfu"] == pytest.approx(steps.height * (t["forward"] + t["backward"]) / (window * peak), rel=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_flops_per_step_and_per_device(case):
    a, v = _analysis(case), _case(case)
    t, one = v["per_step"], v["per_device"]
    for p in PHASES:
        assert a.steps[f"flops_{p}"].to_list() == [t[p]] * a.steps.height, p
        assert a.steps[f"count_{p}"].to_list() == [t[f"{p}_dots"]] * a.steps.height, p
    mm = a.ops.filter(pl.col("matmul") & pl.col("ran"))
    per = mm.group_by("step", "device").agg(pl.col("flops").sum(), pl.len())
    assert per.height == 4 * a.steps.height
    assert set(per["flops"].to_list()) == {one["executed"]} and set(per["len"].to_list()) == {one["executed_dots"]}


# -- collectives -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_collectives_of_each_opcode(case):
    """Every collective of the HLO, by opcode, on every device in every step (names like psum_invariant.7 or
    all_gather.13 say nothing, or spell it with underscores: the opcode decides)."""
    a, truth = _analysis(case), _case(case)["collectives"]
    coll = a.ops.filter(pl.col("collective").is_not_null())
    assert set(coll["collective"].unique().to_list()) == set(truth)
    for opcode, want in truth.items():
        ops = coll.filter(pl.col("collective") == opcode)
        assert sorted(ops["name"].unique().to_list()) == sorted(want["names"])
        per = ops.group_by("step", "device").len()
        assert per.height == 4 * a.steps.height and set(per["len"].to_list()) == {want["count"]}, opcode


@pytest.mark.parametrize("case", CASES)
def test_collectives_are_communication(case):
    a = _analysis(case)
    t = a.totals
    assert t["time_us"]["communication_exposed"] > 0 and t["overlay_us"]["communication_total"] > 0
    for dev in range(4):
        assert a.partition.filter(pl.col("device") == dev)["communication_total"].sum() > 0
    names = set(a.ops.filter(pl.col("collective").is_not_null())["name"].to_list())
    acts = cpu_activities(a.ops)
    assert set(acts.filter(pl.col("name").is_in(list(names)))["cls"].unique().to_list()) == {"communication"}
    assert not names & set(acts.filter(pl.col("cls") == "other_compute")["name"].to_list())
    # nor does the advice call a collective non-matmul work to fuse
    for item in a.advice:
        if item["kind"] == "non_matmul":
            assert not names & set(item["data"].get("top") or [])
            assert not any(n in line for n in names for line in item["evidence"])
    assert "communication" in [item["kind"] for item in a.advice]


@pytest.mark.parametrize("case", CASES)
def test_each_device_time_from_its_own_ops(case):
    """Each device's partition, recomputed here from its ops: idle = window − their union, matmul = the union of its
    matmul ops, communication_total = the union of its collectives."""
    a = _analysis(case)
    xla = a.ops.filter(pl.col("cat") == "xla_op")
    for s in a.steps.iter_rows(named=True):
        lo, hi = s["start"], s["start"] + s["window"]
        for dev in range(4):
            mine = xla.filter(pl.col("device") == dev)
            every = [(t, t + d) for t, d in mine.select("ts", "dur").iter_rows()]
            mm = [(t, t + d) for t, d in mine.filter(pl.col("matmul")).select("ts", "dur").iter_rows()]
            comm = [(t, t + d) for t, d in mine.filter(pl.col("collective").is_not_null()).select("ts", "dur").iter_rows()]
            r = a.partition.filter((pl.col("step") == s["step"]) & (pl.col("device") == dev)).row(0, named=True)
            assert r["idle"] == pytest.approx(s["window"] - union_us(every, lo, hi), abs=1e-6)
            assert r["matmul"] == pytest.approx(union_us(mm, lo, hi), abs=1e-6)
            assert r["communication_total"] == pytest.approx(union_us(comm, lo, hi), abs=1e-6)
        # the step's classes are the mean over the devices
        rows = a.partition.filter(pl.col("step") == s["step"])
        assert s["time_communication_exposed"] == pytest.approx(rows["communication_exposed"].mean(), rel=1e-9)


# -- one device: as before ---------------------------------------------------------------------


@pytest.mark.parametrize("path", SINGLE, ids=lambda p: p.name)
def test_single_device_profiles_have_no_device(path):
    """Every op of a one-device program ran for device_ordinal 0: no device column, no collective."""
    ops = parse_xplane(str(path)).ops
    assert ops.height and ops["device"].null_count() == ops.height and ops["collective"].null_count() == ops.height


def test_single_device_analysis_counts_one_peak():
    a = analyze(str(JAX / "mlp_pairs.xplane.pb.gz"), ModelOptions(peak_tflops=PEAK_TFLOPS))
    assert a.hardware["devices"] == 1 and a.partition["device"].null_count() == a.partition.height
    for s in _counted(a).iter_rows(named=True):
        assert s["hfu"] == pytest.approx(s["flops_executed"] / (s["window"] * 1e-6 * PEAK_TFLOPS * 1e12), rel=1e-9)
