"""JAX name stacks as users' programs write them, on small frames: a checkpoint around a `lax.scan` (its forward
inside a `closed_call`), per-example gradients (`vmap(transpose(jvp()))`), and XLA:CPU executions dispatched
asynchronously (their run id, not their start, names the step). The names are those of the profiles in
fixtures/jax/ (README, cases 8-10); the end-to-end truth is tests/integration/test_flax_truth.py."""

import polars as pl

from traceflops.core.vocab import OUTSIDE
from traceflops.stages.steps import by_execution, by_run
from traceflops.stages.xla_phases import logical_name, tag

# jax.checkpoint(lambda x, ps: lax.scan(body, x, ps)): forward, backward, recomputed loop
FWD = "jit(step)/jvp()/closed_call/while/body/closed_call/dot_general"
BWD = "jit(step)/transpose(jvp(jvp()))/checkpoint/while/body/closed_call/dot_general"
REC = "jit(step)/transpose(jvp(jvp()))/checkpoint/rematted_computation/while/body/closed_call/dot_general"
# ... with the scan body checkpointed too: the inner recomputed copy inside the backward loop
FWD_NESTED = "jit(step)/jvp()/closed_call/while/body/closed_call/checkpoint/dot_general"
REC_INNER = "jit(step)/transpose(jvp(jvp()))/checkpoint/while/body/closed_call/checkpoint/rematted_computation/dot_general"


def _frame(rows):
    return pl.DataFrame(rows, schema={"name": pl.Utf8, "scope": pl.Utf8, "ts": pl.Float64, "dims": pl.Utf8,
                                      "types": pl.Utf8, "step": pl.Int64}, orient="row")


def test_checkpointed_scan_forward_and_its_recomputed_copy_share_a_logical_name():
    assert logical_name(FWD) == logical_name(REC) == logical_name(FWD_NESTED) == logical_name(REC_INNER)
    # a name without the wrapper is unchanged by it
    assert logical_name("jit(step)/jvp()/while/body/closed_call/dot_general") == logical_name(FWD)


def test_recomputed_loop_of_a_checkpointed_scan_is_recompute():
    # 3 iterations of the forward loop, 3 of the backward loop, 3 of the recomputed loop: same instruction shapes
    rows = [("dot.1", FWD, float(i), "[[4,8]]", None, 0) for i in range(3)]
    rows += [("dot.7", REC, 10.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    rows += [("dot.9", BWD, 20.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    assert tag(_frame(rows)).to_list() == ["forward"] * 3 + ["recompute"] * 3 + ["backward"] * 3
    rows = [("dot.1", FWD_NESTED, float(i), "[[4,8]]", None, 0) for i in range(3)]
    rows += [("dot.7", REC, 10.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    rows += [("dot.8", REC_INNER, 20.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    assert tag(_frame(rows)).to_list() == ["forward"] * 3 + ["recompute"] * 6


def test_per_example_gradients_are_backward():
    rows = [
        ("dot.1", "jit(dp_step)/vmap(jvp())/dot_general", 1.0, "[[6,10,40]]", None, 0),
        ("dot.2", "jit(dp_step)/vmap(transpose(jvp()))/dot_general", 2.0, "[[6,10,56]]", None, 0),
        ("dot.3", "jit(dp_step)/vmap(transpose(jvp()))/transpose", 3.0, "[[6,10,56]]", None, 0),
        ("mul.4", "jit(dp_step)/mul", 4.0, None, None, 0),  # the update after the gradients: optimizer
        ("dot.5", "jit(step)/pmap(transpose(jvp(mlp)))/dot_general", 5.0, "[[6,10,56]]", None, 0),
    ]
    assert tag(_frame(rows)).to_list() == ["forward", "backward", "backward", "optimizer", "backward"]


def test_per_example_recompute_pairs_with_its_vmapped_forward():
    # jax.vmap(jax.grad(f)) with jax.checkpoint inside f: the copy is wrapped in vmap twice, its forward once
    rec = "jit(dp_step)/vmap(transpose(jvp(vmap(jvp()))))/checkpoint/rematted_computation/dot_general"
    fwd = "jit(dp_step)/vmap(jvp())/dot_general"
    assert logical_name(rec) == logical_name(fwd) == "jit(dp_step)/dot_general"
    rows = [("dot.1", fwd, 1.0, "[[10,56]]", None, 0), ("dot.2", rec, 2.0, "[[10,56]]", None, 0),
            ("dot.3", "jit(dp_step)/vmap(transpose(jvp(vmap(jvp()))))/checkpoint/dot_general", 3.0, "[[10,56]]", None, 0)]
    assert tag(_frame(rows)).to_list() == ["forward", "recompute", "backward"]


def _ops(runs):
    """XLA ops (run id, start): two ops per run."""
    return pl.DataFrame({"cat": ["xla_op"] * (2 * len(runs)), "name": ["dot.1", "add.2"] * len(runs),
                         "ts": [t + d for _, t in runs for d in (0.0, 1.0)],
                         "ext_id": [r for r, _ in runs for _ in (0, 1)]}, schema_overrides={"ext_id": pl.Int64})


HOST = pl.DataFrame({"step": [10, 11, 12], "ts": [0.0, 100.0, 200.0], "dur": [90.0, 90.0, 90.0]})


def _by_start(ops):
    from traceflops.stages.steps import assign

    return assign(ops, "ts", HOST)


def test_each_execution_goes_to_the_step_that_dispatched_it():
    # each step reads the previous loss: execution k runs inside step k+1's span; the last after every span
    ops = _ops([(7, 50.0), (8, 150.0), (9, 310.0)])
    ops = ops.with_columns(ts=pl.Series([95.0, 105.0, 150.0, 205.0, 310.0, 311.0]))
    assert _by_start(ops).to_list() == [OUTSIDE, 11, 11, 12, OUTSIDE, OUTSIDE]
    assert by_run(ops, _by_start(ops), HOST).to_list() == [10, 10, 11, 11, 12, 12]
    assert by_execution(ops, _by_start(ops), HOST).to_list() == [10, 10, 11, 11, 12, 12]


def test_runs_of_two_programs_are_ordered_each_on_its_own():
    # two programs a step (grads, update), run ids of unrelated bases; ordered by run id within each program
    grads = _ops([(-5, 110.0), (-4, 210.0), (-6, 10.0)])
    update = _ops([(900, 120.0), (901, 220.0), (899, 20.0)]).with_columns(name=pl.lit("sub.3"))
    ops = pl.concat([grads, update]).with_columns(ts=pl.col("ts") + 75.0)  # each runs 75 µs late
    got = by_run(ops, _by_start(ops), HOST).to_list()
    assert got == [11, 11, 12, 12, 10, 10] * 2


def test_runs_that_do_not_fit_the_steps_keep_their_step():
    # 4 runs for 3 steps (one dispatched before the first span): nothing to tell; and a run that would start before
    # the span of the step it would be given (an execution never runs before its dispatch)
    ops = _ops([(1, 5.0), (2, 105.0), (3, 205.0), (4, 250.0)])
    assert by_run(ops, _by_start(ops), HOST).to_list() == _by_start(ops).to_list()
    ops = _ops([(1, 5.0), (2, 95.0), (3, 205.0)])
    assert by_run(ops, _by_start(ops), HOST).to_list() == _by_start(ops).to_list()
    # ops without a run id (Kineto, GPU, TPU) are left alone
    ops = _ops([(1, 50.0)]).with_columns(ext_id=pl.lit(None, pl.Int64))
    assert by_run(ops, _by_start(ops), HOST).to_list() == _by_start(ops).to_list()
