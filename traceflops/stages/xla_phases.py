"""Phases of XLA ops from the JAX name stack (`ops.scope`).

Rules, in this order:

1. Recompute candidates: a name stack with a ``rematted_computation`` component
   (``jax.checkpoint``'s recomputed forward: ``…/transpose(jvp(f))/jvp(f)/
   checkpoint/rematted_computation/…``; such names also begin with
   ``transpose(jvp(…))``, so this rule wins), and XLA's own rematerialization
   copies (HLO op names with a ``.remat`` suffix).
2. ``transpose(…)`` in the name stack (the transposed JVP of ``jax.grad``) is backward, also inside other
   wrappers: ``vmap(transpose(jvp()))`` (per-example gradients, ``jax.vmap(jax.grad(f))``).
3. Else forward; except that in a program (the name stack's root, ``jit(f)``)
   that has backward ops, ops outside every ``jvp``/``transpose`` (the parameter
   update after ``jax.grad``) are optimizer.

Then the executions-per-step correction. After XLA's CSE a rematerialized copy
can stand in for its forward twin: the forward op is gone and the copy, still
named ``rematted_computation``, computes the value the forward needs. Only
copies beyond what the no-remat program runs are recompute. Per step, per
logical op (the name stack with the remat markers and the ``transpose(…)``
component before them removed, plus the operand shapes and types: names repeat):
if the step runs any op of that logical op that is not a candidate, every
candidate is recompute (the program has its forward already); if it runs only
candidates, the earliest-running candidate instruction is the forward twin
(all its executions in the step: under ``scan`` that is once per iteration)
and any other candidate instruction is recompute. Where the parser read the
HLO's dataflow (`feeds_forward_hint`: a copy whose result a forward op reads
is the forward, its twin merged into it), that decides copy by copy within the
group instead: CSE may merge some copies of same-named, same-shaped ops and not others.
"""

from __future__ import annotations

import re

import polars as pl

from traceflops.core.vocab import JAX_BACKWARD_SCOPE_RE, JAX_REMAT_SCOPE_RE

REMAT = "rematted_computation"
_JAX_REMAT = JAX_REMAT_SCOPE_RE
_XLA_REMAT = r"\.remat\d*(\.|$)"
_BACKWARD = JAX_BACKWARD_SCOPE_RE
# An autodiff wrapper opening a component, or inside other wrappers (`vmap(jvp())`: per-example gradients).
_AUTODIFF = r"(^|/)([A-Za-z_][\w.\-]*\()*(jvp|transpose|vjp|linearize)\("
_AUTODIFF_WRAPPERS = ("jvp", "transpose", "vjp", "linearize")
_WRAPPED = re.compile(r"^([A-Za-z_][\w.\-]*)\((.*)\)$")
# Components that wrap a computation without naming it: the checkpoint markers, and the `closed_call` that
# `jax.checkpoint` leaves around its forward (`jvp()/closed_call/while/body/…` for a checkpoint around a
# `lax.scan`), which the recomputed copy's name lacks (`…/rematted_computation/while/body/…`).
_DROP = frozenset({REMAT, "checkpoint", "remat", "closed_call", "core_call"})


def _unwrap(part: str, every: bool = True) -> str:
    """A name-stack component without its wrappers: 'transpose(jvp(x))' → 'x', 'jvp()' → '',
    'vmap(transpose(jvp(vmap(jvp()))))' → '' (a checkpoint under `vmap(grad)`: its copy and forward differ in
    how often `vmap` wraps them). `every=False`: the autodiff wrappers only ('jit(f)' stays, the program's name).
    """
    for _ in range(16):
        m = _WRAPPED.match(part)
        if m is None or not (every or m.group(1) in _AUTODIFF_WRAPPERS):
            return part
        part = m.group(2)
    return part


def _is_transpose(part: str) -> bool:
    """A component that is the transposed JVP, possibly inside other wrappers ('vmap(transpose(jvp(b)))')."""
    m = _WRAPPED.match(part)
    while m is not None and m.group(1) != "transpose":
        m = _WRAPPED.match(m.group(2))
    return m is not None


def logical_name(scope: str) -> str:
    """The name stack an op shares with its forward twin, whatever autodiff wrapped it.

    'jit(f)/transpose(jvp(b))/jvp(b)/checkpoint/rematted_computation/mlp/dot_general'
    → 'jit(f)/b/mlp/dot_general', as 'jit(f)/jvp(b)/mlp/dot_general' (its forward twin).
    jax versions differ in how they wrap (`jvp()` components, einsum names inside `jvp(...)`),
    and transforms add wrappers of their own (`vmap(…)`, `closed_call`), so every component but the
    program's is unwrapped. Backward ops map to the same names: callers compare
    candidates with forward ops only.
    """
    parts = scope.split("/")
    if REMAT in parts:
        cut = parts.index(REMAT)
        # The transpose(...) component that encloses the recomputed forward is not part of it when the
        # forward's own jvp(...) repeats it ('transpose(jvp(b))/jvp(b)/checkpoint/…'); inside a scan body
        # there is no inner jvp ('transpose(jvp(M))/while/body/…'): then it names the module, as jvp(M) does.
        for j in range(cut - 1, -1, -1):
            if _is_transpose(parts[j]):
                if j + 1 < cut and _unwrap(parts[j + 1]) == _unwrap(parts[j]):
                    del parts[j]
                break
    keep = [p for p in parts if p not in _DROP]
    return "/".join(u for u in [_unwrap(keep[0], every=False)] + [_unwrap(p) for p in keep[1:]] if u)


def rule_phases(ops: pl.DataFrame) -> pl.DataFrame:
    """Columns cand (recompute candidate), base (phase by rules 2-3, of the forward twin for candidates)."""
    scope = pl.col("scope")
    jax_cand = scope.str.contains(_JAX_REMAT)
    xla_cand = pl.col("name").str.contains(_XLA_REMAT)
    bwd = scope.str.contains(_BACKWARD)
    root = scope.str.extract(r"^([^/]+)", 1)
    training = (bwd & ~jax_cand).any().over(root)
    outside = ~scope.str.contains(_AUTODIFF)
    base = (
        pl.when(jax_cand)
        .then(pl.lit("forward"))  # the forward twin of a recomputed op
        .when(bwd)
        .then(pl.lit("backward"))
        .when(training & outside)
        .then(pl.lit("optimizer"))
        .otherwise(pl.lit("forward"))
    )
    return ops.select(
        cand=(jax_cand | xla_cand).fill_null(False),
        base=pl.when(scope.is_not_null()).then(base),
    )


def tag(ops: pl.DataFrame, steps: pl.DataFrame | None = None) -> pl.Series:
    """Phase of each op that has a `scope` (null elsewhere), aligned with `ops` rows.

    Steps: the `step` column of `ops` if present, else `steps` (host spans, as in
    `Trace.steps`) by each op's ts (an XLA:CPU op by its execution's run id: `steps.by_run`),
    else the whole trace as one step.
    """
    if ops.height == 0:
        return pl.Series("phase", [], dtype=pl.Utf8)
    if "step" in ops.columns:
        step = ops["step"]
    elif steps is not None and steps.height:
        from traceflops.stages.steps import assign, by_run

        host = steps.select("step", "name", "ts", "dur")
        step = by_run(ops, assign(ops, "ts", host), host)  # an execution's ops in the step that dispatched it
    else:
        step = pl.Series("step", [0] * ops.height, dtype=pl.Int64)

    r = rule_phases(ops)
    df = pl.DataFrame(
        {
            "_i": pl.int_range(ops.height, eager=True),
            "_step": step.fill_null(-1).cast(pl.Int64),
            "name": ops["name"],
            "scope": ops["scope"],
            "ts": ops["ts"],
            "_shape": ops["dims"].fill_null("") + "|" + ops["types"].fill_null(""),
            "cand": r["cand"],
            "base": r["base"],
            "_ff": ops["feeds_forward_hint"]
            if "feeds_forward_hint" in ops.columns
            else pl.Series([None] * ops.height, dtype=pl.Boolean),
        }
    )
    if not df["cand"].any():
        return unnamed_matmuls(ops, df["_step"], df["base"].rename("phase"))

    scoped = df.filter(pl.col("scope").is_not_null())
    uniq = scoped["scope"].unique()
    mapping = dict(zip(uniq.to_list(), [logical_name(s) for s in uniq.to_list()]))
    scoped = scoped.with_columns(_key=pl.col("scope").replace_strict(mapping, return_dtype=pl.Utf8))
    group = ["_step", "_key", "_shape"]
    plain = scoped.group_by(group).agg(_plain=(~pl.col("cand") & (pl.col("base") == "forward")).sum())
    cands = scoped.filter("cand").join(plain, on=group, how="left")
    # Per group with no plain op: the candidate instruction that runs first stands in for the forward.
    first = (
        cands.group_by(group + ["name"])
        .agg(_first=pl.col("ts").min())
        .sort("_first")
        .group_by(group, maintain_order=True)
        .agg(_standin=pl.col("name").first())
    )
    # Where the HLO's dataflow tells which copies the forward reads, it decides, copy by copy.
    told = pl.col("_ff").fill_null(False)
    cands = cands.join(first, on=group, how="left").with_columns(
        phase=pl.when(told)
        .then(pl.col("base"))
        .when(told.any().over(group))
        .then(pl.lit("recompute"))
        .when((pl.col("_plain") == 0) & (pl.col("name") == pl.col("_standin")))
        .then(pl.col("base"))
        .otherwise(pl.lit("recompute"))
    )
    out = df.join(cands.select("_i", "phase"), on="_i", how="left").sort("_i")
    return unnamed_matmuls(ops, df["_step"], out.select(pl.coalesce("phase", "base").alias("phase"))["phase"])


def unnamed_matmuls(ops: pl.DataFrame, step: pl.Series, phase: pl.Series) -> pl.Series:
    """XLA matmul ops without a name stack (XLA dropped `op_name`, e.g. weight gradients in a jit of their own).

    Where the program's order tells: one that starts after its step's first backward
    op is backward (the gradient program runs its forward, then its backward).
    Otherwise nothing tells: 'other', never a silent forward (a warning counts them).
    """
    if not {"cat", "matmul_hint"} <= set(ops.columns):
        return phase
    unnamed = ops["scope"].is_null() & (ops["cat"] == "xla_op") & ops["matmul_hint"].fill_null(False)
    if not unnamed.any():
        return phase
    f = pl.DataFrame({"step": step, "ts": ops["ts"], "phase": phase, "unnamed": unnamed})
    first_bwd = f.filter(pl.col("phase") == "backward").group_by("step").agg(_bwd=pl.col("ts").min())
    f = f.join(first_bwd, on="step", how="left", maintain_order="left")
    return f.select(
        pl.when(~pl.col("unnamed"))
        .then(pl.col("phase"))
        .when(pl.col("_bwd").is_not_null() & (pl.col("ts") >= pl.col("_bwd")))
        .then(pl.lit("backward"))
        .otherwise(pl.lit("other"))
        .alias("phase")
    )["phase"]
