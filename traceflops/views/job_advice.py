"""What to try for the job: the ranks' wait for a late rank, the pipeline bubble, expert imbalance, then each rank's own
top items."""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import RankSummary
from traceflops.core.sections import JobAdviceItem
from traceflops.views import p2p
from traceflops.views.experts import imbalance_advice
from traceflops.views.ranks import rank_of

UNIT = "of step time, over all ranks"


def job_advice(
    summaries: list[RankSummary],
    late: pl.DataFrame,
    coll: pl.DataFrame,
    exclude_steps=(),
    pipe: pl.DataFrame | None = None,
    experts: pl.DataFrame | None = None,
) -> list[JobAdviceItem]:
    """What to try for the job: time the ranks' critical paths spent waiting for a late rank, then the ranks' own top
    items.

    Shares are of the step time summed over ranks (each rank's windows), the unit of a rank's own budget.
    Where pipeline stages' blocked receives make most of the exposed communication, the bubble replaces the
    ranks' own "overlap communication" (overlap cannot shorten a wait for a neighbour's micro-batch).
    """
    items: list[dict[str, Any]] = []
    frames = [s.steps.filter(~pl.col("step").is_in(list(exclude_steps))) for s in summaries]
    window = sum(float(f["window"].sum()) for f in frames if "window" in f.columns)
    waiting = sum(
        float(f["path_communication_waiting"].fill_null(0).sum())
        for f in frames
        if "path_communication_waiting" in f.columns
    )
    if window > 0 and waiting > 0:
        ev = [
            f"{fmt.duration(waiting)} of the ranks' critical paths ({waiting / window:.1%} of step time) waited in "
            "collectives "
            "for the last rank to arrive"
        ]
        if late.height:
            by = late.group_by("rank").agg(
                pl.len().alias("steps"), pl.col("wait_us").sum(), pl.col("reason").mode().first()
            )
            for r in by.sort("wait_us", descending=True).head(3).iter_rows(named=True):
                ev.append(
                    f"rank {r['rank']} arrived last in {r['steps']} step(s), the others waiting "
                    f"{fmt.duration(r['wait_us'])}; "
                    f"why: {r['reason']}"
                )
        if coll.height:
            worst = coll.sort("arrival_skew_us", descending=True).row(0, named=True)
            ev.append(
                f"largest arrival skew: {fmt.duration(worst['arrival_skew_us'])} ({worst['kind']} #{worst['seq']} of "
                "group "
                f"{worst['pg']}, last rank {worst['last_rank']})"
            )
        items.append(
            {
                "kind": "late_rank",
                "term": "communication_exposed",
                "title": "Ranks wait for a late rank at collectives",
                "share": waiting / window,
                "recoverable": waiting / window,
                "unit": UNIT,
                "evidence": ev,
                "remedies": [
                    "Balance the work per rank: even shards and sequence lengths per batch (pack or bucket by length)",
                    "Look at the late rank's own report: what it ran instead (its compute, idle or input pipeline)",
                    "Keep host work off the step on every rank (logging, checkpoint writes, data loading)",
                ],
                "data": {"waiting_us": waiting, "window_us": window},
            }
        )
    # Each rank's top items, a title once with the ranks it tops (the ranks' shares kept for the renderers).
    by_title: dict[str, list[tuple[int, dict]]] = {}
    for s in summaries:
        for x in s.advice:
            by_title.setdefault(x["title"], []).append((rank_of(s), x))
    per_rank: list[dict[str, Any]] = []
    for title, got in by_title.items():
        share = {r: x["share"] for r, x in got}
        known = [v for v in share.values() if v is not None]
        top = max(known) if known else None
        said = (
            f"{fmt.ranks(share)}: {fmt.pct(min(known))} to {fmt.pct(top)} of their step time at peak"
            if known
            else f"{fmt.ranks(share)}"
        ) + " (details in each rank's own report)"
        per_rank.append(
            {
                "kind": got[0][1].get("kind"),
                "term": got[0][1].get("term"),
                "title": title,
                "share": top,
                "recoverable": top,
                "unit": "of step time at peak, on the rank where it is largest",
                "evidence": [said],
                "remedies": [],
                "data": {
                    "ranks": sorted(r for r in share if r is not None),
                    "shares": {str(r): v for r, v in share.items()},
                },
            }
        )
    bubble = p2p.bubble_advice(pipe, summaries, exclude_steps, UNIT)
    if bubble is not None:  # the bubble, not overlap, is what the stages' exposed communication is
        items.append(bubble)
        per_rank = [x for x in per_rank if x["kind"] != "communication"]
    uneven = imbalance_advice(experts)
    if uneven is not None:
        items.append(uneven)
    return [JobAdviceItem(**x) for x in items + sorted(per_rank, key=lambda x: -(x["share"] or 0.0))]
