"""Advice a user can act on, from what the trace shows, ranked by the share of peak × step time it would give back.

`advise(a)` reads an `Analysis` and returns a list of items, largest first:

    {"kind", "title", "recoverable", "share", "unit", "term", "recoverable_us", "mfu_after",
     "step_time_after_us", "bound", "evidence": [str, ...], "remedies": [str, ...], "data": {...}}

and, on a loss-budget entry, also "findings" (the rules' items folded into it),
"cause_known" and "record" (what to record next time when the trace cannot
tell the cause; those lines are also the first remedies).

The headline `recoverable` (= `share`) is a fraction of peak × step time (the
summed windows of the steps counted, on the devices the trace drives), the
unit of the loss budget (`unit` says it in words). Every time term of the
budget is its time over the window, so for the rules below the same number is
the share of step time the item's waste costs. `step_time_after_us` and
`mfu_after` are the mean counted step and the MFU (model FLOPs unchanged) if
the item's time went away, bounded by what its budget term can save
(`views.counterfactual`: e.g. exposed communication only as far as it is on
the critical path; recompute by the recompute kernels' own time); `bound`
says why in one line. Items can overlap (an
unfused attention's softmax is memory-bound too): their recoverable values
are not additive.

Loss-budget entries: every budget term (non_matmul, idle, matmul_below_peak,
communication_exposed, recompute, memcpy_exposed, matmul_flops_unknown,
extra_executed) of at least BUDGET_MIN_SHARE (5%) is an entry whose headline
is the term's value, exactly (the budget is added up here as the totals add
theirs), with the rules' items that explain part of it folded in (`TERM_OF`):
non_matmul names the kernels (on a CPU trace the aten ops) that take it, the
fusion candidates (runs of short kernels back to back), the memory-bound and
unfused-attention items; idle splits by gap reason with the host-bound, sync
and data-loader items; matmul_below_peak names GEMM shapes (convolutions as
implicit GEMMs), dtypes, wave quantization and small tiles, with the fp32 item
and, for an fp32 / TF32 run, its MFU against the tensor-core peak; where
convolutions are at least CONV_DOMINATES (half) of the matmul time, its
remedies and the fusion remedies speak of convolutions (autocast,
channels_last, cudnn.benchmark, channel counts, BatchNorm/ReLU fusion); communication and recompute
are their rules' items headed by the budget's number. Rules' items of smaller
terms stand alone from MIN_SHARE. Remedies and what to record are worded for
PyTorch (Kineto) or JAX (XLA profiles).

Rules, each raising an item only when its evidence is in the trace and worth
at least MIN_SHARE (1%) of the step time:

  host_bound      idle gaps the host caused (reason host_bound: the next kernel
                  was launched after the gap began) plus bubbles between queued
                  kernels (launch_gap); recoverable = their time.
  memory_bound    kernels under the roofline ridge (roofline bound 'memory'):
                  their time above the HBM floor (bytes / bandwidth), capped at
                  the time they occupy the device.
  attention       attention computed as matmul → softmax → matmul (shapes
                  checked: the first matmul's output is the softmax's input,
                  which the second matmul takes), by hand or by SDPA's math
                  fallback; recoverable = the kernels of that chain that are
                  not matmuls (scale, mask, softmax, dropout, softmax
                  backward): what a fused kernel folds in. A lower bound.
  fp32_matmul     matmul-class ops with fp32 inputs on fp32 (non-TF32) kernels,
                  on a device with a faster TF32 (else the faster of bf16 and
                  fp16: fp16 on Volta / Turing) tensor peak, when
                  the analysis precision is not TF32 already; recoverable =
                  their time × (1 - fp32 peak / TF32 peak): the same fraction
                  of a faster peak. Mixed precision (autocast) is its first
                  remedy, TF32 the second.
  communication   the partition's communication_exposed.
  recompute       headed by the budget's recompute term (the recomputed
                  FLOPs at peak); the recompute overlay (time with a recompute
                  kernel running) is evidence, as time, and the headline when
                  no peak is known (then `unit` says so).
  input_pipeline  idle gaps with reason input_pipeline (a DataLoader op over
                  the gap).
  sync            idle gaps with reason sync (a synchronizing runtime call over
                  the gap).

The package, one job a module: `context` (the `Ctx` every rule reads, and the thresholds), `items` (an item's
shape), `wording` (shared remedy and record texts), `rules_idle`, `rules_compute` and `rules_comm_recompute` (the
rules), `entries_compute` and `entries` (the loss-budget entries); `advise` here runs them.
"""

from __future__ import annotations

from traceflops.core.results import Analysis
from traceflops.core.sections import AdviceItem
from traceflops.views import counterfactual
from traceflops.views.advice.context import BUDGET_MIN_SHARE, MIN_SHARE, build_context
from traceflops.views.advice.entries import ENTRIES, budget_entry
from traceflops.views.advice.entries_compute import short_runs
from traceflops.views.advice.rules_comm_recompute import communication, recompute
from traceflops.views.advice.rules_compute import attention, fp32_matmul, memory_bound
from traceflops.views.advice.rules_idle import host_bound, input_pipeline, sync

__all__ = ["BUDGET_MIN_SHARE", "ENTRIES", "MIN_SHARE", "RULES", "advise", "short_runs"]

RULES = (host_bound, memory_bound, attention, fp32_matmul, communication, recompute, input_pipeline, sync)


def advise(
    a: Analysis,
    exclude_steps=None,
    min_share: float = MIN_SHARE,
    term_share: float = BUDGET_MIN_SHARE,
    bounds: counterfactual.Counterfactuals | None = None,
) -> list[AdviceItem]:
    """Items of advice the trace supports, largest share of peak × step time first.

    Every loss-budget term of at least `term_share` is an entry headed by the term's value, the rules' items that
    explain it folded in (`findings`); the rules' items of smaller terms stand alone when they reach `min_share`.
    `exclude_steps`: steps left out; by default those the analysis' totals left out (asked, cut, the unbounded last).
    `bounds`: the same steps' counterfactuals when the caller has them (the pipeline computes them once for the
    advice and `what_if`).
    """
    if exclude_steps is None:
        exclude_steps = tuple(a.totals.step_count.excluded)
    ctx = build_context(a, exclude_steps)
    if ctx is None:
        return []
    found = [it for rule in RULES if (it := rule(ctx)) is not None and it.recoverable >= min_share]
    budget = ctx.budget or {}
    big = {t: v for t in ENTRIES if (v := budget.get(t)) is not None and v >= term_share}
    entries = [
        budget_entry(ctx, t, v, sorted((f for f in found if f.term == t), key=lambda f: -f.recoverable))
        for t, v in big.items()
    ]
    alone = [f for f in found if f.term not in big]
    ranked = sorted(entries + alone, key=lambda it: (-it.recoverable, it.kind))
    cf = bounds if bounds is not None else counterfactual.counterfactuals(ctx.steps, counterfactual.program_peak(a))
    return ranked if cf is None else cf.bound(ranked)
