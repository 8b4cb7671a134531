"""What to try for the job, in two ranked sections: the job's own findings (the ranks' wait for a late rank, with what
the job would gain at the median rank's pace; the pipeline bubble; expert imbalance), then the worst ranks' own top
items."""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import RankSummary
from traceflops.core.sections import JobAdviceItem
from traceflops.views import p2p
from traceflops.views.advice.context import BUDGET_MIN_SHARE
from traceflops.views.experts import imbalance_advice
from traceflops.views.ranks import rank_of

JOB_UNIT = "of the step time summed over ranks"  # the job section's one denominator: each rank's windows, added
RANK_UNIT = "of that rank's step time at peak"  # the ranks' section's: the rank's own budget unit
FLOOR = BUDGET_MIN_SHARE  # an entry below this share is left out of either section, as from a rank's own advice
BOUND = (
    "an upper bound: it removes only the wait behind ranks that arrived after the median rank at each collective; "
    "the transfers remain, and a rank late elsewhere would still hold the step"
)


def job_advice(
    summaries: list[RankSummary],
    late: pl.DataFrame,
    coll: pl.DataFrame,
    exclude_steps=(),
    pipe: pl.DataFrame | None = None,
    experts: pl.DataFrame | None = None,
    steps: pl.DataFrame | None = None,
    held: dict[int, float] | None = None,
    mfu: float | None = None,
) -> list[JobAdviceItem]:
    """What to try for the job: its own findings (scope "job"), then the worst ranks' own top items (scope "rank").

    Job entries are shares of the step time summed over ranks (each rank's counted windows); rank entries are shares
    of that rank's step time, each title on the rank where it is largest. Each section is biggest first and leaves
    out what is below FLOOR. Where pipeline stages' blocked receives make most of the exposed communication, the
    bubble replaces the ranks' own "overlap communication" (overlap cannot shorten a wait for a neighbour's
    micro-batch). `steps` (the job's, per step), `held` (per step, `stragglers.held_by_late_ranks`) and `mfu` (the
    job's) give the late-rank entry its counterfactual: the job at the median rank's pace.
    """
    frames = [s.steps.filter(~pl.col("step").is_in(list(exclude_steps))) for s in summaries]
    window = sum(float(f["window"].sum()) for f in frames if "window" in f.columns)
    own: list[dict[str, Any]] = []
    waited = late_rank(frames, window, late, coll)
    if waited is not None:
        waited.update(median_pace(steps, held or {}, exclude_steps, mfu))
        own.append(waited)
    per_rank = rank_items(summaries)
    bubble = p2p.bubble_advice(pipe, summaries, exclude_steps, JOB_UNIT)
    if bubble is not None:  # the bubble, not overlap, is what the stages' exposed communication is
        own.append(bubble)
        per_rank = [x for x in per_rank if x["kind"] != "communication"]
    uneven = imbalance_advice(experts)
    if uneven is not None:
        own.append(on_job_time(uneven, summaries, experts, window))
    return [JobAdviceItem(scope="job", rank=None, **x) for x in ranked(own)] + [
        JobAdviceItem(scope="rank", **x) for x in ranked(per_rank)
    ]


def ranked(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Biggest share first, those below FLOOR left out (an unknown share last)."""
    kept = [x for x in items if x["share"] is None or x["share"] >= FLOOR]
    return sorted(kept, key=lambda x: (x["share"] is None, -(x["share"] or 0.0)))


def late_rank(frames: list[pl.DataFrame], window: float, late: pl.DataFrame, coll: pl.DataFrame) -> dict | None:
    """Time the ranks' critical paths spent waiting in collectives for the last rank to arrive, over their windows."""
    waiting = sum(
        float(f["path_communication_waiting"].fill_null(0).sum())
        for f in frames
        if "path_communication_waiting" in f.columns
    )
    if window <= 0 or waiting <= 0:
        return None
    ev = [
        f"{fmt.duration(waiting)} of the ranks' critical paths ({waiting / window:.1%} of step time) waited in "
        "collectives for the last rank to arrive"
    ]
    if late.height:
        by = late.group_by("rank").agg(
            pl.len().alias("steps"), pl.col("wait_us").sum(), pl.col("reason").mode().first()
        )
        for r in by.sort("wait_us", descending=True).head(3).iter_rows(named=True):
            ev.append(
                f"rank {r['rank']} arrived last in {r['steps']} step(s), the others waiting "
                f"{fmt.duration(r['wait_us'])}; why: {r['reason']}"
            )
    if coll.height:
        worst = coll.sort("arrival_skew_us", descending=True).row(0, named=True)
        ev.append(
            f"largest arrival skew: {fmt.duration(worst['arrival_skew_us'])} ({worst['kind']} #{worst['seq']} of "
            f"group {worst['pg']}, last rank {worst['last_rank']})"
        )
    return {
        "kind": "late_rank",
        "term": "communication_exposed",
        "title": "Ranks wait for a late rank at collectives",
        "share": waiting / window,
        "recoverable": waiting / window,
        "unit": JOB_UNIT,
        "evidence": ev,
        "remedies": [
            "Balance the work per rank: even shards and sequence lengths per batch (pack or bucket by length)",
            "Look at the late rank's own report: what it ran instead (its compute, idle or input pipeline)",
            "Keep host work off the step on every rank (logging, checkpoint writes, data loading)",
        ],
        "data": {"waiting_us": waiting, "window_us": window},
    }


def median_pace(steps: pl.DataFrame | None, held: dict[int, float], exclude_steps, mfu: float | None) -> dict[str, Any]:
    """The job if every rank arrived at its collectives at the median rank's pace: its mean step time (the slowest
    rank's window) over the counted steps, now and then, and the job MFU then (the same model FLOPs in less time).

    Each counted step loses what late ranks held its collectives beyond the median rank's arrival (at most its
    window); the step time after is thus a lower bound and the MFU after an upper bound (`BOUND`)."""
    use = None if steps is None else steps.filter(~pl.col("step").is_in(list(exclude_steps)))
    if use is None or use.height == 0:
        return {}
    wall = float(use["step_us"].sum())
    saved = sum(min(held.get(st, 0.0), us) for st, us in use.select("step", "step_us").iter_rows() if us)
    after = wall - saved
    return {
        "step_time_us": wall / use.height,
        "step_time_after_us": after / use.height,
        "mfu_after": mfu * wall / after if mfu is not None and after > 0 else None,
        "bound": BOUND,
    }


def rank_items(summaries: list[RankSummary]) -> list[dict[str, Any]]:
    """Each rank's top items, a title once on the rank where its share is largest (the worst rank for it), the other
    ranks it tops named in its evidence; shares are of that rank's own step time."""
    by_title: dict[str, list[tuple[int, Any]]] = {}
    for s in summaries:
        for x in s.advice:
            by_title.setdefault(x.title, []).append((rank_of(s), x))
    out: list[dict[str, Any]] = []
    for title, got in by_title.items():
        known = [(r, x) for r, x in got if x.share is not None]
        if not known:
            continue
        rank, worst = max(known, key=lambda rx: rx[1].share)
        others = {r: x.share for r, x in got if r != rank}
        ev = []
        if others:
            vals = [v for v in others.values() if v is not None]
            ev.append(
                f"also on {fmt.ranks(others)}"
                + (f": {_span(vals)} of their step time" if vals else "")
                + " (details in each rank's own report)"
            )
        else:
            ev.append("on this rank only (details in its own report)")
        out.append(
            {
                "rank": rank,
                "kind": worst.kind,
                "term": worst.term,
                "title": title,
                "share": worst.share,
                "recoverable": worst.recoverable,
                "unit": RANK_UNIT,
                "evidence": ev,
                "remedies": [],
                "data": {
                    "ranks": sorted(r for r, _ in got if r is not None),
                    "shares": {str(r): x.share for r, x in got},
                },
            }
        )
    return out


def on_job_time(
    uneven: dict[str, Any], summaries: list[RankSummary], experts: pl.DataFrame | None, window: float
) -> dict[str, Any]:
    """The expert imbalance on the job's denominator: the busiest rank's expert time beyond its group's mean (its
    expert time estimated from its matmul time at its own matmul rate), which every rank of its EP group waits, over
    the step time summed over ranks. Its share of the busiest rank's expert time is kept in `data`."""
    d = uneven["data"]
    of_expert = uneven["share"]
    s = next((s for s in summaries if s.rank == d["rank"]), None)
    t = s.totals if s is not None else None
    expert = (t.expert_flops or {}).get("executed") if t is not None else None
    executed = t.flops.get("executed") if t is not None else None
    matmul_us = (t.time_us or {}).get("matmul") if t is not None else None
    group = (
        experts.filter(pl.col("ep_group").fill_null("?") == (d["ep_group"] or "?")).height if experts is not None else 1
    )
    share = None
    ev = list(uneven["evidence"])
    if expert and executed and matmul_us and window > 0:
        excess = matmul_us * expert / executed * of_expert
        share = excess * group / window
        ev.append(
            f"an even split saves {of_expert:.1%} of rank {d['rank']}'s expert time, about {fmt.duration(excess)} "
            f"(its expert time estimated from its matmul time at its own matmul rate), on each of its group's "
            f"{group} ranks"
        )
    return {
        **uneven,
        "share": share,
        "recoverable": share,
        "unit": JOB_UNIT,
        "evidence": ev,
        "data": {**d, "share_of_expert_time": of_expert},
    }


def _span(vals: list[float]) -> str:
    lo, hi = fmt.pct(min(vals)), fmt.pct(max(vals))
    return lo if lo == hi else f"{lo} to {hi}"
