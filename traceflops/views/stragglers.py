"""Per step, the rank the others waited for at collectives (the straggler), and what it was doing instead."""

from __future__ import annotations

import polars as pl

from traceflops.core.results import RankSummary
from traceflops.stages.sweep import merged


def stragglers(coll: pl.DataFrame, summaries: list[RankSummary]) -> pl.DataFrame:
    """Per step, the rank the others waited for, and what it was doing instead.

    The straggler arrives last at the step's collectives (weighted by how long
    the others waited). Its reason compares its own compute, idle and input
    pipeline time in the step with the median rank's.
    """
    if coll.height == 0:
        return pl.DataFrame()
    s = (
        coll.filter(pl.col("step") >= 0)
        .group_by("step", "last_rank")
        .agg(pl.col("arrival_skew_us").sum().alias("wait_us"))
    )
    top = s.sort("wait_us", descending=True).group_by("step", maintain_order=True).first().sort("step")
    steps = pl.concat([x.steps.with_columns(rank=pl.lit(x.rank, pl.Int64)) for x in summaries], how="diagonal_relaxed")
    idle = (
        pl.concat(
            [x.idle.with_columns(rank=pl.lit(x.rank, pl.Int64)) for x in summaries if x.idle.height],
            how="diagonal_relaxed",
        )
        if any(x.idle.height for x in summaries)
        else None
    )
    steps = steps.with_columns(compute_us=pl.col("time_matmul") + pl.col("time_other_compute"))
    if idle is not None:
        inp = (
            idle.filter(pl.col("reason") == "input_pipeline")
            .group_by("step", "rank")
            .agg(pl.col("dur").sum().alias("input_us"))
        )
        steps = steps.join(inp, on=["step", "rank"], how="left")
    else:
        steps = steps.with_columns(input_us=pl.lit(None, pl.Float64))
    steps = steps.with_columns(pl.col("input_us").fill_null(0.0))
    med = steps.group_by("step").agg(
        pl.col("compute_us").median().alias("med_compute"),
        pl.col("time_idle").median().alias("med_idle"),
        pl.col("input_us").median().alias("med_input"),
    )
    j = (
        top.rename({"last_rank": "rank"})
        .join(steps.select("step", "rank", "compute_us", "time_idle", "input_us"), on=["step", "rank"], how="left")
        .join(med, on="step", how="left")
    )
    excess = {
        "input_pipeline": pl.col("input_us") - pl.col("med_input"),
        "compute": pl.col("compute_us") - pl.col("med_compute"),
        "idle": pl.col("time_idle") - pl.col("med_idle"),
    }
    j = j.with_columns([e.alias(f"excess_{k}_us") for k, e in excess.items()])
    reason = pl.lit("unclear")
    cols = [f"excess_{k}_us" for k in excess]
    best = pl.concat_list(cols).list.arg_max()
    reason = (
        pl.when(pl.max_horizontal(cols) > 0)
        .then(pl.lit(list(excess), dtype=pl.List(pl.Utf8)).list.get(best))
        .otherwise(pl.lit("unclear"))
    )
    return j.with_columns(reason=reason).sort("step")


def held_by_late_ranks(m: pl.DataFrame, offsets: dict[int, float]) -> dict[int, float]:
    """Per step, how long ranks arriving after the median rank held the step's collectives (µs, aligned clocks).

    At each matched collective, from the median rank's arrival to the last rank's: the wait the collective would not
    have had if every rank had arrived at the median rank's pace. Overlapping collectives count their union once, so
    the step's time held is at most its window. A collective belongs to the earliest step its ranks put it in.
    """
    if m.height == 0:
        return {}
    a = m.with_columns(astart=pl.col("ts") + pl.col("rank").replace_strict(offsets, default=0.0))
    per = (
        a.group_by("pg", "seq")
        .agg(pl.col("step").min(), pl.col("astart").median().alias("lo"), pl.col("astart").max().alias("hi"))
        .filter((pl.col("step") >= 0) & (pl.col("hi") > pl.col("lo")))
    )
    out: dict[int, float] = {}
    for (step,), g in per.group_by("step"):
        ms, me = merged(g["lo"].to_numpy(), g["hi"].to_numpy())
        out[int(step)] = float((me - ms).sum())
    return out
