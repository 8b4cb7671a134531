"""flax / optax / plain-JAX (XLA:CPU) profiles of fixtures/jax/ against the truth the generator
took from the compiled HLO (fixtures/generate_flax.py, fixtures/jax/README.md, truth_flax.json).

Committed files only; jax and flax are not needed (only the generator needs them). Per case,
three checks: per-step FLOPs of every phase, per-step matmul counts of every phase (the truth
counts dot / convolution instructions, each execution once), and that no matmul FLOPs vanish
(the steps' executed FLOPs plus `outside_steps` equal the truth's executed FLOPs of the profiled
steps). Every case is exact.
"""

import json

import pytest

from tests.builders import ROOT

JAX = ROOT / "fixtures" / "jax"
TRUTH_PATH = JAX / "truth_flax.json"
PHASES = ("forward", "backward", "recompute", "optimizer", "other")

CASES = (
    "flax_remat_default",
    "flax_remat_checkpoint_dots",
    "flax_remat_dots_no_batch",
    "flax_remat_nothing_saveable",
    "flax_scan_remat",
    "jax_scan_named",
    "mlp_pairs",
    "conv_remat_1jit",
    "conv_remat_2jit",
    "flax_async",
    "ckpt_around_scan",
    "ckpt_scan_nested",
    "vmap_grad",
    "vmap_grad_remat",
    "async_loss_read",
)

def _truth() -> dict:
    if not TRUTH_PATH.exists():
        pytest.skip(f"{TRUTH_PATH.relative_to(ROOT)} is absent: run python fixtures/generate_flax.py")
    return json.loads(TRUTH_PATH.read_text())


def _path(case: str):
    p = JAX / f"{case}.xplane.pb.gz"
    if not p.exists():
        pytest.skip(f"{p.relative_to(ROOT)} is absent: run python fixtures/generate_flax.py --only {case}")
    return p


_RUNS: dict = {}


def _analysis(case: str):
    if case not in _RUNS:
        from traceflops.run.load import analyze

        _RUNS[case] = analyze(str(_path(case)))
    return _RUNS[case]


def per_step(a, key):
    return a.steps.sort("ts")[key].to_list()


def _steps(truth) -> int:
    return truth["_meta"]["steps"]


@pytest.mark.parametrize("case", CASES)
def test_truth_is_consistent(case):
    """The generator's truth adds up, and its no-remat baseline meets the hand formula from the dims."""
    v = _truth()["variants"][case]
    t, d = v["per_step"], v["dims"]
    assert t["executed"] == sum(t[p] for p in PHASES)
    assert t["executed_dots"] == sum(t[f"{p}_dots"] for p in PHASES)
    assert t["recompute"] >= 0 and t["optimizer"] == 0 and t["other"] == 0
    m = v["model"]
    if m in ("decoder", "decoder_scan", "named_scan", "ckpt_scan"):
        B, T, D, H, F, V, L = (d[k] for k in "BTDHFVL")
        fwd = L * (2 * B * T * (4 * D * D + 2 * D * F) + 4 * B * H * T * T * (D // H)) + 2 * B * T * D * V
        bwd = 2 * fwd  # the embedding lookup is a gather: its input needs no gradient
    elif m == "per_example":  # per-example gradients: the batch's dots, with the batch as a dot batch dimension
        first = 2 * d["B"] * d["S"] * d["I"] * d["D"]
        fwd = first + d["P"] * 4 * d["B"] * d["S"] * d["D"] * d["F"] + 2 * d["B"] * d["S"] * d["D"] * d["C"]
        bwd = 2 * fwd - first  # the input needs no gradient
    elif m == "mlp":
        first = 2 * d["B"] * d["I"] * d["D"]
        fwd = first + d["P"] * 4 * d["B"] * d["D"] * d["F"] + 2 * d["B"] * d["D"] * d["C"]
        bwd = 2 * fwd - first  # the input needs no gradient
    else:
        B, H, W = d["B"], d["Hh"], d["W"]
        k1, k2 = d["K1"][0] * d["K1"][1], d["K2"][0] * d["K2"][1]
        c1 = 2 * B * H * W * k1 * d["C0"] * d["C1"]
        fwd = (c1 + 2 * B * H * W * k1 * d["C1"] * d["C2"] + 2 * B * (H // 2) * (W // 2) * k2 * (d["C2"] * d["C3"] + d["C3"] * d["C4"])
               + 2 * B * d["C4"] * d["N"])
        bwd = 2 * fwd - c1  # SAME padding, stride 1: each data gradient costs its forward; the image needs none
    assert (t["forward"], t["backward"]) == (fwd, bwd)
    assert _path(case).stat().st_size < 2 << 20


@pytest.mark.parametrize("case", CASES)
def test_phase_flops_equal_the_truth(case):
    a, truth = _analysis(case), _truth()
    t, n = truth["variants"][case]["per_step"], _steps(truth)
    got = {p: per_step(a, f"flops_{p}") for p in PHASES}
    assert got == {p: [t[p]] * n for p in PHASES}


@pytest.mark.parametrize("case", CASES)
def test_phase_matmul_counts_equal_the_truth(case):
    a, truth = _analysis(case), _truth()
    t, n = truth["variants"][case]["per_step"], _steps(truth)
    got = {p: per_step(a, f"count_{p}") for p in PHASES}
    assert got == {p: [t[f"{p}_dots"]] * n for p in PHASES}


@pytest.mark.parametrize("case", CASES)
def test_no_matmul_flops_vanish(case):
    """Whatever the phases and steps: every executed dot/convolution of the profiled steps is counted once."""
    a, truth = _analysis(case), _truth()
    t, n = truth["variants"][case]["per_step"], _steps(truth)
    outside = sum(((a.outside_steps or {}).get("flops") or {}).values())
    assert sum(per_step(a, "flops_executed")) + outside == n * t["executed"]


def test_fixture_facts():
    """What fixtures/jax/README.md says of the profiles themselves (parser level, not the analysis)."""
    import polars as pl

    from traceflops.parsers.xla import parse_xplane

    truth = _truth()

    def outside_every_span(t):
        o = t.ops.filter(pl.col("cat") == "xla_op")
        inside = pl.lit(False)
        for ts, dur in t.steps.select("ts", "dur").iter_rows():
            inside = inside | ((pl.col("ts") >= ts) & (pl.col("ts") <= ts + dur))
        return o, o.filter(~inside)

    # async dispatch: most of the three executions start after the last step span ended
    t = parse_xplane(str(_path("flax_async")))
    ops, out = outside_every_span(t)
    assert t.steps.height == 3 and out.height > ops.height // 2
    assert out.filter(pl.col("matmul_hint")).height > 0
    # every synchronous case: no XLA op outside the step spans
    for case in ("flax_remat_default", "conv_remat_2jit", "flax_scan_remat"):
        assert outside_every_span(parse_xplane(str(_path(case))))[1].height == 0
    # conv_remat_2jit: matmul ops without op_name (scope null), as many as the truth's unnamed convolutions
    t = parse_xplane(str(_path("conv_remat_2jit")))
    unnamed = t.ops.filter(pl.col("matmul_hint") & pl.col("scope").is_null())
    assert unnamed.height == _steps(truth) * truth["variants"]["conv_remat_2jit"]["per_step"]["unnamed_as_backward"] > 0
    # ... and the one-jit program names them all
    t = parse_xplane(str(_path("conv_remat_1jit")))
    assert t.ops.filter(pl.col("matmul_hint") & pl.col("scope").is_null()).height == 0


def test_unnamed_weight_gradients_are_backward_and_said():
    """conv_remat_2jit: XLA dropped op_name from the grads program's weight-gradient convolutions; they run after
    the step's backward began, so they are backward, and a warning counts them (never a silent forward)."""
    from traceflops.run.load import analyze

    truth = _truth()
    t = truth["variants"]["conv_remat_2jit"]
    a = analyze(str(_path("conv_remat_2jit")))
    unnamed = a.ops.filter((a.ops["cat"] == "xla_op") & a.ops["scope"].is_null() & a.ops["matmul"] & a.ops["ran"])
    assert unnamed.height and set(unnamed["phase"]) == {"backward"}
    assert per_step(a, "flops_backward") == [t["per_step"]["backward"]] * _steps(truth)
    assert any("carry no op_name" in w for w in a.warnings)


def _names(case):
    """The distinct name stacks (`scope`) of the case's matmul ops."""
    import polars as pl

    from traceflops.parsers.xla import parse_xplane

    ops = parse_xplane(str(_path(case))).ops.filter(pl.col("matmul_hint"))
    return sorted(set(ops["scope"].drop_nulls().to_list()))


def test_checkpoint_around_scan_names_its_forward_inside_a_closed_call():
    """What makes the checkpoint-around-scan cases hard: the forward loop's name stack has a `closed_call` component
    that the recomputed loop's lacks (fixtures/jax/README.md, case 8), so names alone do not pair them."""
    for case in ("ckpt_around_scan", "ckpt_scan_nested"):
        names = _names(case)
        fwd = [n for n in names if "/jvp()/closed_call/while/body/" in n]
        rec = [n for n in names if "/checkpoint/rematted_computation/while/body/closed_call/" in n]
        assert fwd and rec, names
    nested = _names("ckpt_scan_nested")
    assert any("/while/body/closed_call/checkpoint/rematted_computation/" in n for n in nested), nested


def test_per_example_gradients_are_named_inside_vmap():
    """jax.vmap(jax.value_and_grad(f)): the backward's name stack is `vmap(transpose(jvp()))`, the forward's `vmap(jvp())`:
    no component starts with `transpose(`."""
    names = _names("vmap_grad")
    assert {n.split("/")[1] for n in names} == {"vmap(jvp())", "vmap(transpose(jvp()))"}, names
    # checkpointed under vmap: the recomputed copy is wrapped in vmap twice, its forward once
    names = _names("vmap_grad_remat")
    assert "jit(dp_step)/vmap(transpose(jvp(vmap(jvp()))))/checkpoint/rematted_computation/dot_general" in names
    assert "jit(dp_step)/vmap(jvp())/dot_general" in names


def test_each_async_execution_runs_in_the_next_step_span():
    """async_loss_read: a step dispatches its execution, then reads the previous step's loss; so most of each execution's
    ops start inside the next step's span (their start names the wrong step; step 0 holds none of its execution), and
    every XLA op carries its execution's run id (`ext_id`): one run per step, in step order."""
    import polars as pl

    from traceflops.parsers.xla import parse_xplane

    t = parse_xplane(str(_path("async_loss_read")))
    spans = t.steps.sort("ts")
    ops = t.ops.filter(pl.col("cat") == "xla_op")
    assert ops["ext_id"].null_count() == 0
    runs = ops.group_by("ext_id").agg(t0=pl.col("ts").min(), n=pl.len()).sort("ext_id")
    assert runs.height == spans.height == _steps(_truth())
    starts, ends = spans["ts"].to_list(), (spans["ts"] + spans["dur"]).to_list()
    for k, run in enumerate(runs["ext_id"].to_list()):
        mine = ops.filter(pl.col("ext_id") == run)
        assert mine["ts"].min() >= starts[k]  # dispatched by step k
        late = mine.filter(pl.col("ts") >= ends[k]).height
        if k < runs.height - 1:  # the last step reads the loss before it: its own execution may run inside it
            assert late > mine.height // 2, (k, late, mine.height)
    first = ops.filter(pl.col("ext_id") == runs["ext_id"][0])
    assert first.filter((pl.col("ts") >= starts[0]) & (pl.col("ts") < ends[0]) & pl.col("matmul_hint")).height == 0
