"""One advice item's shape (`item`, and `TERM_OF`: the budget term a rule's item explains part of) and the evidence
and remedy lines that rules and entries build alike (folded items, top names, by phase).

Shared by the rules and the loss-budget entries, so every item has the same keys and every folded line reads the same.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.sections import AdviceItem
from traceflops.views.advice.context import TOP, UNIT, Ctx, is_jax
from traceflops.views.advice.wording import JAX_REMEDIES

TERM_OF = {  # the budget term a rule's item explains part of
    "host_bound": "idle",
    "input_pipeline": "idle",
    "sync": "idle",
    "memory_bound": "non_matmul",
    "attention": "non_matmul",
    "fp32_matmul": "matmul_below_peak",
    "communication": "communication_exposed",
    "recompute": "recompute",
}


def item(
    ctx: Ctx,
    kind: str,
    title: str,
    recoverable_us: float,
    evidence: list[str],
    remedies: list[str],
    data: dict[str, Any] | None = None,
    share: float | None = None,
    unit: str = UNIT,
) -> AdviceItem:
    """One item; `share` (default: recoverable_us over the window) is its headline, taken as given so that a
    budget term's value is printed exactly. What it would buy (`mfu_after`, `step_time_after_us`, `bound`) is left
    for `advise` to bound (`views.counterfactual`)."""
    if is_jax(ctx) and kind in JAX_REMEDIES:
        remedies = JAX_REMEDIES[kind]
    rec = ctx.share(recoverable_us) if share is None else float(share)
    return AdviceItem(
        kind=kind,
        title=title,
        recoverable=rec,
        share=rec,
        unit=unit,
        term=TERM_OF.get(kind, kind),
        recoverable_us=float(recoverable_us),
        mfu_after=None,  # the counterfactual's, bounded by the item's term: `advise` fills these three
        step_time_after_us=None,
        bound=None,
        evidence=evidence,
        remedies=remedies,
        data=data or {},
    )


def folded(findings: list[AdviceItem], ctx: Ctx) -> list[str]:
    """One line per folded item: its headline share and its first piece of evidence."""
    return [
        f"{it.title}: {fmt.pct(it.recoverable, keep_small=False)} {UNIT}"
        + (f" ({it.evidence[0]})" if it.evidence else "")
        for it in findings
    ]


def remedies_of(findings: list[AdviceItem]) -> list[str]:
    out = []
    for it in findings:
        out += it.remedies[:2]
    return out


def unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def time_by(frame: pl.DataFrame, key: str | list[str], *more: pl.Expr, of: str = "dur") -> pl.DataFrame:
    """Per `key`: `n` rows and `t` (their `of` summed), and `more`; most time first, equal times by key (a
    group_by's order is not fixed: the same trace must give the same advice text)."""
    keys = [key] if isinstance(key, str) else key
    return (
        frame.group_by(keys)
        .agg(pl.len().alias("n"), pl.col(of).sum().alias("t"), *more)
        .sort(["t", *keys], descending=[True, *[False] * len(keys)], nulls_last=True)
    )


def top_names(frame: pl.DataFrame, ctx: Ctx, n: int = TOP) -> list[str]:
    """The names that took the most time, with their count, time and share of step time (as time)."""
    if frame.height == 0:
        return []
    top = time_by(frame, "name", pl.col("dur").median().alias("med")).head(n)
    return [
        f"{fmt.named(r['name'], 70, '?')}: {r['n']}×, {fmt.duration(r['t'])} "
        f"({fmt.pct(ctx.share(r['t']), keep_small=False)} "
        f"of step time, as time), median {fmt.duration(r['med'])}"
        for r in top.iter_rows(named=True)
    ]


def by_phase(frame: pl.DataFrame, ctx: Ctx) -> str | None:
    if frame.height == 0 or "phase" not in frame.columns:
        return None
    by = time_by(frame, "phase")
    total = float(by["t"].sum())
    if not total:
        return None
    return "by phase (as time): " + ", ".join(
        f"{p} {fmt.pct(t / total, keep_small=False)}" for p, t in by.select("phase", "t").iter_rows()
    )
