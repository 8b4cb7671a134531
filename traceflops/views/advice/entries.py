"""The loss-budget entries (`ENTRIES`, one per loss term) and `budget_entry`, which makes a term's entry.

Every loss-budget term of at least BUDGET_MIN_SHARE gets an entry whose headline is the term itself; the rules'
items that explain part of a term are folded into its entry (`findings`), so the largest losses always say what
to do next, and a cause the trace cannot tell is said with what to record next time. The compute entries
(non_matmul, matmul_below_peak) are in `entries_compute`; the rest are here.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt, sections
from traceflops.core.sections import AdviceItem
from traceflops.core.vocab import GAP_REASONS
from traceflops.views.advice.context import MIN_SHARE, UNIT, Ctx, activities, is_jax
from traceflops.views.advice.entries_compute import matmul_below_peak, non_matmul
from traceflops.views.advice.items import folded, item, remedies_of, top_names, unique
from traceflops.views.advice.wording import say, to_record

ENTRY_KIND = {"communication_exposed": "communication"}  # a term whose entry keeps its rule's kind (else: the term)


def _idle(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    ev = [
        (
            f"{'the device did nothing' if ctx.kernels.height else 'no work ran'} for "
            f"{fmt.pct(value, keep_small=False)} {UNIT} "
            f"({fmt.duration(value * ctx.window)})"
        )
    ]
    data: dict[str, Any] = {}
    record: list[str] = []
    remedies = remedies_of(findings)
    if ctx.gaps is not None and ctx.gaps.height:
        got = dict(ctx.gaps.group_by("reason").agg(pl.col("dur").sum()).iter_rows())
        by = {r: float(got.get(r, 0.0)) for r in GAP_REASONS}
        data["by_reason_us"] = by
        ev.append(
            "by reason: "
            + ", ".join(
                f"{r} {fmt.pct(ctx.share(t), keep_small=False)}"
                for r, t in sorted(by.items(), key=lambda x: -x[1])
                if t > 0
            )
        )
        ev += folded(findings, ctx)
        unknown = by["unknown"]
        if ctx.share(unknown) >= MIN_SHARE:
            ev.append(
                f"{fmt.pct(ctx.share(unknown), keep_small=False)} of step time is idle with no cause in the trace "
                "(no launch, synchronising call or data-loader op over the gap): it cannot be told what the host did"
            )
            record = to_record(ctx, "stack")
    elif ctx.kernels.height == 0 and not is_jax(ctx):
        ev.append(
            "a CPU trace: idle is time when no op ran (Python between ops, waits outside ops); why cannot be told "
            "from a CPU trace"
        )
        record = to_record(ctx, "stack", "device")
    elif ctx.kernels.height == 0:
        ev.append(
            "an XLA:CPU profile: idle is time when no XLA op ran (dispatch between programs, Python); why cannot "
            "be told from it"
        )
        record = to_record(ctx, "stack", "device")
    else:
        ev.append("no idle gap inside the steps holds a cause: it cannot be told what the host did")
        record = to_record(ctx, "stack")
    if not remedies:
        remedies = say(
            ctx,
            [
                "Find what the host runs over the longest gaps (with_stack=True) and move it out of the step or "
                "overlap it",
                "torch.compile / CUDA graphs where the host launches many small kernels",
            ],
            [
                "Find what the host runs over the longest gaps (the Python tracer) and move it out of the step",
                "Put the whole step under one jax.jit, and keep the host ahead: no jax.device_get / float(x) inside "
                "the loop",
            ],
        )
    return "The device sits idle: keep it fed", ev, remedies, data, record, not record


def _from_finding(kind: str, title: str, what: str):
    """An entry that is one rule's item (communication, recompute), with the budget's number as its headline."""

    def entry(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
        own = [f for f in findings if f.kind == kind]
        rest = [f for f in findings if f.kind != kind]
        if own:
            it = own[0]
            head = (
                []
                if any(UNIT in e for e in it.evidence)
                else [f"{what} takes {fmt.pct(value, keep_small=False)} {UNIT}"]
            )
            return (
                it.title,
                head + it.evidence + folded(rest, ctx),
                it.remedies + remedies_of(rest),
                it.data,
                [],
                True,
            )
        return (
            title,
            [f"{fmt.pct(value, keep_small=False)} {UNIT}: the trace holds no detail of it"],
            [],
            {},
            to_record(ctx, "stack"),
            False,
        )

    return entry


def _memcpy_exposed(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    mc = ctx.kernels.filter(pl.col("cls").is_in(["memcpy", "memset"])) if ctx.kernels.height else ctx.kernels
    ev = [f"copies and memsets with no compute beside them take {fmt.pct(value, keep_small=False)} {UNIT}"]
    ev += top_names(mc, ctx, 3)
    data: dict[str, Any] = {}
    if mc.height and "bytes" in mc.columns and mc["bytes"].null_count() < mc.height:
        b = float(mc["bytes"].sum())
        t = float(mc["dur"].sum())
        data = {"bytes": b, "time_us": t}
        ev.append(
            f"{fmt.nbytes(b)} moved in {fmt.duration(t)} ({b / (t * 1e-6) / 1e9:.1f} GB/s)"
            if t
            else f"{fmt.nbytes(b)} moved"
        )
    remedies = say(
        ctx,
        [
            "Host-to-device copies: pin_memory=True in the DataLoader and .to(device, non_blocking=True), so the copy "
            "overlaps compute",
            "Device-to-host copies (.cpu(), .item(), .tolist()) once per step at most, or on a side stream",
            "Copies inside the model (.contiguous(), dtype casts, torch.cat): fuse them away (torch.compile) or keep "
            "one layout",
        ],
        [
            "Prefetch the next batch to the device (jax.device_put, or a prefetching iterator) while this step runs",
            (
                "Keep arrays on the device between steps: no jax.device_get / np.asarray inside the loop; donate "
                "buffers "
                "(jax.jit(..., donate_argnums=...)) so XLA does not copy them"
            ),
        ],
    )
    record = [] if mc.height else to_record(ctx, "device")
    return "Memory copies stall compute: overlap or drop them", ev, remedies, data, record, mc.height > 0


def _matmul_flops_unknown(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    acts = activities(ctx)
    mm = acts.filter((pl.col("cls") == "matmul") & pl.col("flops").is_null()) if acts.height else acts
    ev = [
        (
            f"matmul time whose FLOPs are unknown takes {fmt.pct(value, keep_small=False)} {UNIT}: how far below peak "
            "it "
            "ran cannot be told"
        )
    ]
    ev += top_names(mm, ctx, 3)
    if ctx.a.ops.height == 0:
        ev.append("the trace holds device activity only: no op gives these kernels' shapes")
        record = to_record(ctx, "device", "shapes")
    else:
        record = to_record(ctx, "shapes")
    remedies = ["Once their FLOPs are known, the matmul_below_peak entry says which shapes and dtypes to change"]
    return (
        "Matmul time of unknown FLOPs: record shapes to judge it",
        ev,
        remedies,
        {"kernels": mm.height},
        record,
        False,
    )


def _extra_executed(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    model = float(ctx.steps["model_flops"].sum())
    executed = float(ctx.steps["flops_executed"].fill_null(0).sum()) if "flops_executed" in ctx.steps.columns else 0.0
    recompute = (
        float(ctx.steps["flops_recompute"].fill_null(0).sum()) if "flops_recompute" in ctx.steps.columns else 0.0
    )
    ev = [
        (
            f"matmuls did {fmt.pct(value, keep_small=False)} {UNIT} of work the model's FLOP count does not hold: "
            f"{executed / 1e9:.1f} GFLOP executed, {recompute / 1e9:.1f} of them recompute, {model / 1e9:.1f} GFLOP of "
            "model"
        )
    ]
    remedies = say(
        ctx,
        [
            (
                "Check the model description (--model, sequence length, vocabulary, layers): the executed matmuls may "
                "be right and the "
                "model FLOPs low"
            ),
            "Padding: pack sequences or bucket by length, so the matmuls do not work on padding tokens",
            "Work outside the model's formula (an extra head, a loss projection, a second forward): drop what is not "
            "needed",
        ],
        [
            (
                "Check the model description (--model, sequence length, vocabulary, layers): the executed dots may be "
                "right and the "
                "model FLOPs low"
            ),
            "Padding: pack sequences or bucket by length, so the dots do not work on padding tokens",
        ],
    )
    return (
        "Matmuls do more work than the model needs",
        ev,
        remedies,
        {"model_flops": model, "executed_flops": executed},
        [],
        True,
    )


# One entry per loss term of the budget, in this order when two are equal (mfu is no loss; the mask credit is never
# positive).
ENTRIES = {
    "non_matmul": non_matmul,
    "idle": _idle,
    "matmul_below_peak": matmul_below_peak,
    "communication_exposed": _from_finding(
        "communication", "Communication is exposed: overlap it with compute", "communication with no compute beside it"
    ),
    "recompute": _from_finding("recompute", "Recompute costs time: checkpoint selectively", "recomputed work"),
    "memcpy_exposed": _memcpy_exposed,
    "matmul_flops_unknown": _matmul_flops_unknown,
    "extra_executed": _extra_executed,
}


def budget_entry(ctx: Ctx, term: str, value: float, findings: list[AdviceItem]) -> AdviceItem:
    """The entry of one budget term: its value as the headline, the items that explain it folded in."""
    title, ev, remedies, data, record, known = ENTRIES[term](ctx, value, findings)
    kind = ENTRY_KIND.get(term, term)
    it = item(
        ctx,
        kind,
        title,
        value * ctx.window,
        ev,
        unique(remedies + record if known else record + remedies),
        data,
        share=value,
    )
    return sections.replace(
        it, term=term, findings=[f for f in findings if f.kind != kind], cause_known=bool(known), record=record
    )
