"""Expert parallelism across ranks: each rank's expert FLOPs and all-to-all bytes, and how unevenly its EP group shares
them.

A rank's expert FLOPs are the matmuls its grouped-GEMM and fused-MoE ops ran
(`metrics.utilization.expert_flops`, in its totals); its all-to-all bytes are
the payloads of the all-to-alls of its `ep` group (a DeviceMesh `ep`
dimension, a Megatron expert group, or `--group-role`). An EP group's ranks
run the same layers on different tokens, so a rank far above its group's
mean is the one the group's all-to-alls wait for.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.contract import EXPERT_COLUMNS
from traceflops.core.results import RankSummary

IMBALANCED = 1.25  # a rank this far above its EP group's mean expert FLOPs is named in the advice


def _ep_traffic(s: RankSummary) -> tuple[str | None, float | None]:
    """The rank's EP group (its ranks, as text) and its all-to-all bytes over the steps it counted."""
    c = s.collectives
    if c.height == 0 or "role" not in c.columns:
        return None, None
    counted = s.steps["step"].to_list() if s.steps.height else []
    excluded = set(s.totals.step_count.excluded)
    a2a = c.filter(
        (pl.col("role") == "ep")
        & (pl.col("kind") == "all_to_all")
        & pl.col("step").is_in(counted)
        & ~pl.col("step").is_in(list(excluded))
    )
    if a2a.height == 0:
        return None, None
    group = a2a["group_ranks"].drop_nulls().mode().to_list() if "group_ranks" in a2a.columns else []
    known = a2a["bytes"].null_count() == 0
    return (group[0] if group else None), (float(a2a["bytes"].sum()) if known else None)


def experts(summaries: list[RankSummary]) -> pl.DataFrame | None:
    """Per rank: its EP group, expert FLOPs and all-to-all bytes per counted step, each against its group's mean
    (1.0 = even); None when no rank runs experts or EP all-to-alls."""
    rows = []
    for s in summaries:
        ef = s.totals.expert_flops
        group, nbytes = _ep_traffic(s)
        if ef is None and group is None:
            continue
        steps = s.totals.step_count.counted
        flops = ef.get("executed") if ef else None
        rows.append(
            {
                "rank": s.rank,
                "ep_group": group,
                "steps": int(steps),
                "expert_flops_per_step": float(flops) / steps if flops is not None and steps else None,
                "a2a_bytes_per_step": nbytes / steps if nbytes is not None and steps else None,
            }
        )
    if not rows:
        return None
    t = pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int64,
            "ep_group": pl.Utf8,
            "steps": pl.Int64,
            "expert_flops_per_step": pl.Float64,
            "a2a_bytes_per_step": pl.Float64,
        },
    )
    by = pl.col("ep_group").fill_null("?")
    return (
        t.with_columns(
            flops_vs_group_mean=pl.col("expert_flops_per_step") / pl.col("expert_flops_per_step").mean().over(by),
            bytes_vs_group_mean=pl.col("a2a_bytes_per_step") / pl.col("a2a_bytes_per_step").mean().over(by),
        )
        .sort("ep_group", "rank", nulls_last=True)
        .select(EXPERT_COLUMNS)
    )


def imbalance_advice(t: pl.DataFrame | None) -> dict[str, Any] | None:
    """ "Experts are imbalanced" when a rank runs IMBALANCED× or more of its EP group's mean expert FLOPs."""
    if t is None or t.height < 2 or t["flops_vs_group_mean"].drop_nulls().len() == 0:
        return None
    worst = t.sort("flops_vs_group_mean", descending=True, nulls_last=True).row(0, named=True)
    ratio = worst["flops_vs_group_mean"]
    if ratio is None or ratio < IMBALANCED:
        return None
    group = t.filter(pl.col("ep_group").fill_null("?") == (worst["ep_group"] or "?"))
    ev = [
        f"rank {worst['rank']} runs {ratio:.2f}× the mean expert FLOPs of its EP group {worst['ep_group'] or '?'} "
        f"({fmt.si(worst['expert_flops_per_step'], 'FLOP')} per step); the group's all-to-alls wait for it"
    ]
    ev += [
        f"rank {r['rank']}: {fmt.si(r['expert_flops_per_step'], 'FLOP')} per step ({r['flops_vs_group_mean']:.2f}× the "
        "mean), "
        f"all-to-all {fmt.nbytes(r['a2a_bytes_per_step'])} per step"
        for r in group.iter_rows(named=True)
        if r["expert_flops_per_step"] is not None and r["a2a_bytes_per_step"] is not None
    ]
    share = 1.0 - 1.0 / ratio  # of the busiest rank's expert time, what an even split would save
    return {
        "kind": "expert_imbalance",
        "term": "communication_exposed",
        "title": "Experts are imbalanced: the busiest EP rank sets the pace",
        "share": share,
        "recoverable": share,
        "unit": "of the busiest rank's expert time",
        "evidence": ev,
        "remedies": [
            "Balance the router's load: an auxiliary load-balancing loss (or aux-loss-free bias updates), "
            "a capacity factor that drops or reroutes overflow tokens",
            "Place experts by measured load (replicate the hot experts, as EPLB does) so each EP rank "
            "runs about the same tokens",
        ],
        "data": {"rank": worst["rank"], "ep_group": worst["ep_group"], "flops_vs_group_mean": ratio},
    }
