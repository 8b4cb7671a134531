"""Across ranks: per-rank summaries that merge into one job view.

A `RankSummary` holds the small tables the job view needs (steps with their
partition and FLOPs, collectives, idle reasons), so ranks can be summarised
anywhere and merged later with the same result as analysing them together.
Ranks' clocks differ: they are aligned on the ends of matched collectives
(a collective completes on all ranks of its group together), never compared raw.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from traceflops.core import fmt
from traceflops.core.contract import BUDGET_PREFIX, PATH_PREFIX
from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis, Job, ModelOptions, RankSummary
from traceflops.core.sections import Clock, JobTotals, RankAdvice
from traceflops.core.vocab import OVERLAYS, PARTITION, PHASES
from traceflops.metrics import utilization as metrics
from traceflops.stages.critical_path import KINDS
from traceflops.views import p2p
from traceflops.views.clocks import clock_offsets, collective_table, comm_split, group_warnings, matched
from traceflops.views.collectives import across_ranks
from traceflops.views.experts import experts
from traceflops.views.job_advice import job_advice
from traceflops.views.ranks import assign_ranks, missing_ranks, rank_of
from traceflops.views.stragglers import held_by_late_ranks, stragglers

_RANK_RE = re.compile(r"rank[_\-]?(\d+)", re.I)


STEP_COLUMNS = [
    "step",
    "name",
    "ts",
    "dur",
    "start",
    "window",
    "window_source",
    "last",
    "model_flops",
    "flops_executed",
    "mfu",
    "mfu_no_attention",
    "hfu",
    *[f"flops_{p}" for p in PHASES],
    *[f"count_{p}" for p in PHASES],
    *[f"time_{c}" for c in (*PARTITION, *OVERLAYS)],
    "launch_kernels",
    "launch_median_kernel_us",
    "launch_median_delay_us",
    *[f"{PATH_PREFIX}{k}" for k in KINDS],
]


def rank_from_path(path: str) -> int | None:
    m = _RANK_RE.search(Path(path).name)
    return int(m.group(1)) if m else None


def with_budget_columns(steps: pl.DataFrame) -> pl.DataFrame:
    """The per-step loss budget (a dict column) as `budget_<term>` float columns: a summary is stored as parquet."""
    if "loss_budget" not in steps.columns:
        return steps
    rows = steps["loss_budget"].to_list()
    terms = list(dict.fromkeys(t for r in rows if isinstance(r, dict) for t in r))
    cols = {
        f"{BUDGET_PREFIX}{t}": pl.Series([r.get(t) if isinstance(r, dict) else None for r in rows], dtype=pl.Float64)
        for t in terms
    }
    return steps.drop("loss_budget").with_columns(**cols)


def summarize(a: Analysis) -> RankSummary:
    steps = with_budget_columns(a.steps.select([c for c in [*STEP_COLUMNS, "loss_budget"] if c in a.steps.columns]))
    if a.idle_gaps is not None and a.idle_gaps.height:
        idle = a.idle_gaps.group_by("step", "reason").agg(pl.col("dur").sum())
    else:
        idle = pl.DataFrame(schema={"step": pl.Int64, "reason": pl.Utf8, "dur": pl.Float64})
    rank = a.meta.get("rank")
    if rank is None:
        rank = rank_from_path(a.meta.get("path") or "")
    assert (
        a.collectives is not None
    )  # the pipeline gives every analysis its collectives (a cached report is not summarised)
    return RankSummary(
        rank=rank,
        world_size=a.meta.get("world_size"),
        path=path_text(a.meta.get("path")),
        hardware=a.hardware,
        model=a.model,
        steps=steps,
        collectives=a.collectives,
        idle=idle,
        totals=a.totals,
        warnings=list(a.warnings),
        path_comm=None
        if a.critical_path is None
        else a.critical_path.filter(pl.col("kind") == "communication").select("step", "start", "end"),
        advice=[
            RankAdvice(kind=x.kind, title=x.title, share=x.share, recoverable=x.recoverable, term=x.term)
            for x in a.advice[:ADVICE_PER_RANK]
        ],
        communication=a.communication,
    )


ADVICE_PER_RANK = 3  # headlines a rank summary keeps for the job's "what to try"


# --- the job ----------------------------------------------------------------


def per_rank_table(summaries: list[RankSummary]) -> pl.DataFrame:
    rows = []
    for s in summaries:
        t = s.totals
        row = {
            "rank": s.rank,
            "path": s.path,
            "wall_us": t.wall_us,
            "device_mfu": t.mfu,
            "hfu": t.hfu,
            "executed_flops": t.flops["executed"],
            "recompute_flops": t.flops["recompute"],
        }
        row.update({f"time_{c}": (t.time_us or {}).get(c) for c in PARTITION})
        rows.append(row)
    return pl.DataFrame(rows)


def job_steps(
    summaries: list[RankSummary], world: int, peak: float | None, global_model: dict[int, float] | None
) -> pl.DataFrame:
    """Per step: the slowest rank's window is the job's step time."""
    frames = [s.steps.with_columns(rank=pl.lit(s.rank, pl.Int64)) for s in summaries]
    allst = pl.concat(frames, how="diagonal_relaxed")
    per = (
        allst.group_by("step")
        .agg(
            pl.col("window").max().alias("step_us"),
            pl.col("rank").sort_by("window").last().alias("slowest_rank"),
            pl.col("rank").n_unique().alias("ranks"),
            pl.col("model_flops").cast(pl.Float64).sum().alias("model_flops_sum"),
            pl.col("model_flops").null_count().alias("model_unknown"),
            pl.col("flops_executed")
            .cast(pl.Float64)
            .sum()
            .alias("executed_flops"),  # in floats: many ranks' int64 counts can wrap
            (pl.col("hfu").is_not_null().any() if "hfu" in allst.columns else pl.lit(True)).alias("_hfu_known"),
            *[
                pl.col(c).sort_by("window").last() for c in allst.columns if c.startswith(PATH_PREFIX)
            ],  # the slowest rank's path
        )
        .sort("step")
    )
    model: pl.Expr = pl.when(pl.col("model_unknown") == 0).then(pl.col("model_flops_sum"))
    if global_model is not None:
        model = pl.col("step").replace_strict(global_model, default=None, return_dtype=pl.Float64)
    secs = pl.col("step_us") * 1e-6
    pk = pl.lit(peak, pl.Float64)
    return (
        per.with_columns(model_flops=model)
        .with_columns(
            mfu=pl.col("model_flops") / (secs * pk * world),
            hfu=pl.when(pl.col("_hfu_known")).then(
                pl.col("executed_flops") / (secs * pk * world)
            ),  # no rank knows: unknown, not 0
        )
        .drop("model_flops_sum", "model_unknown", "_hfu_known")
    )


def without_unbounded_last(
    summaries: list[RankSummary], steps: pl.DataFrame, exclude_steps
) -> tuple[tuple[int, ...], list[str]]:
    """A step that is any rank's unbounded last (it ends at that rank's last device activity) is left out of the job's
    totals when other steps remain, as each rank's own totals leave it out (`stages.steps.leave_out_unbounded_last`)."""
    last = sorted(
        {st for s in summaries if "last" in s.steps.columns for st in s.steps.filter(pl.col("last"))["step"].to_list()}
    )
    counted = [st for st in steps["step"].to_list() if st not in exclude_steps]
    left = [st for st in last if st in counted]
    if not left or len(counted) <= len(left):
        return tuple(exclude_steps), []
    return tuple(sorted({*exclude_steps, *left})), [
        f"step {', '.join(map(str, left))}: some rank's last, ending at its last device activity without the time up "
        "to a "
        "next step: shown, left out of the job's totals"
    ]


def pipeline_bubbles(summaries: list[RankSummary], stages: int | None, microbatches: int | None) -> pl.DataFrame | None:
    """Per stage (rank) and step: P2P matched across ranks and the bubble it waited, against the ideal
    (p−1)/(m+p−1); p and m inferred from the P2P pattern unless given (`views.p2p.pipeline`)."""
    return p2p.pipeline(summaries, stages, microbatches)


def nvlink_per_direction(summaries: list[RankSummary]) -> float | None:
    """The device's NVLink bandwidth per direction (datasheets quote both directions together)."""
    from traceflops.core import hardware as hw

    name = next((s.hardware.name for s in summaries if s.hardware), None)
    h = hw.lookup(name) if name else None
    bw = (h.links or {}).get("nvlink") if h else None
    return bw / 2 if bw else None


def job_view(
    summaries: list[RankSummary],
    *,
    world_size: int | None = None,
    tokens_model_flops: dict[int, float] | None = None,
    pipeline_stages: int | None = None,
    microbatches: int | None = None,
    exclude_steps: tuple[int, ...] = (),
    input_warnings: tuple[str, ...] | list[str] = (),
    keep_last_step: bool = False,
) -> Job:
    warnings: list[str] = list(input_warnings)  # what the inputs' folders left out
    summaries = assign_ranks(summaries, warnings)
    ranks = [rank_of(s) for s in summaries]
    world = world_size or next((s.world_size for s in summaries if s.world_size), None) or len(summaries)
    missing = missing_ranks(world, ranks)
    if missing:
        warnings.append(
            f"{missing[0]} ranks missing from the inputs: {missing[1]}{' ...' if missing[0] > len(missing[1]) else ''} "
            f"(world size {world})"
        )
    peaks = {s.hardware.peak_flops if s.hardware else None for s in summaries}
    peak = next(iter(peaks)) if len(peaks) == 1 else None
    if len(peaks) > 1:
        warnings.append("ranks report different peaks; job MFU is not computed")
    m = matched(summaries)
    offsets, residual = clock_offsets(m, ranks)
    warnings += group_warnings(summaries, m, ranks)
    summaries = comm_split(summaries, m, offsets)
    coll = collective_table(m, offsets, nvlink_per_direction(summaries))
    steps = job_steps(summaries, world, peak, tokens_model_flops)
    if not keep_last_step:
        exclude_steps, note = without_unbounded_last(summaries, steps, exclude_steps)
        warnings += note
    use = steps.filter(~pl.col("step").is_in(list(exclude_steps)))
    wall = float(use["step_us"].sum())
    model_total = None if use["model_flops"].null_count() else float(use["model_flops"].sum())
    executed = float(use["executed_flops"].sum())
    secs = wall * 1e-6
    model = next((s.model for s in summaries if s.model), None)
    totals = JobTotals(
        wall_us=wall,
        world_size=world,
        mfu=metrics.utilization(model_total, secs, peak, world),
        hfu=metrics.utilization(executed, secs, peak, world)
        if any(s.totals.hfu is not None for s in summaries)
        else None,
        collectives_matched=int(coll.height),
        arrival_skew_us=float(coll["arrival_skew_us"].sum()) if coll.height else 0.0,
        transfer_us=float(coll["transfer_us"].sum()) if coll.height else 0.0,
        model_source=model.source if model else None,
    )
    warnings += metrics.suspect(totals.mfu, totals.hfu)
    clock = Clock(
        reference_rank=min(ranks) if ranks else None,
        offsets_us={str(r): o for r, o in offsets.items()},
        residual_skew_us=residual,
    )
    if coll.height and coll["bytes"].null_count():
        warnings.append(
            f"{coll['bytes'].null_count()} matched collectives record no message size: their bandwidth is null "
            "(a recent PyTorch records it; an older one records the call's input shape with record_shapes=True)"
        )
    if m.height == 0 and len(summaries) > 1:
        warnings.append("no collective matched across ranks: clocks not aligned, arrival skew unknown")
    groups = warning_groups(warnings, summaries)
    for s in summaries:
        warnings += [f"rank {s.rank}: {w}" for w in s.warnings]
    late = stragglers(coll, summaries)
    pipe = pipeline_bubbles(summaries, pipeline_stages, microbatches)
    comm, comm_by_rank = across_ranks({s.rank: s.communication for s in summaries})
    ep = experts(summaries)
    return Job(
        per_rank_table(summaries),
        steps,
        coll,
        late,
        pipe,
        clock,
        totals,
        warnings,
        summaries,
        advice=job_advice(
            summaries, late, coll, exclude_steps, pipe, ep, steps, held_by_late_ranks(m, offsets), totals.mfu
        ),
        warning_groups=groups,
        communication=comm,
        communication_by_rank=comm_by_rank,
        experts=ep,
    )


def warning_groups(own: list[str], summaries: list[RankSummary]) -> list[tuple[str, tuple[int, ...], int]]:
    """The job's own warnings, then each rank warning once for all the ranks that gave it, with its most repeats in one
    rank."""
    ranks_of: dict[str, list[int]] = {}
    repeats: dict[str, int] = {}
    for s in summaries:
        for w, n in fmt.counted(s.warnings):
            ranks_of.setdefault(w, []).append(rank_of(s))
            repeats[w] = max(repeats.get(w, 0), n)
    return [(w, (), n) for w, n in fmt.counted(own)] + [(w, tuple(rs), repeats[w]) for w, rs in ranks_of.items()]


def job_with_options(
    summaries: list[RankSummary],
    opts: ModelOptions,
    pipeline_stages: int | None = None,
    microbatches: int | None = None,
    input_warnings: tuple[str, ...] | list[str] = (),
) -> Job:
    """`job_view` with the user's options, as the command line and `traceflops.analyze_job` both build it."""
    return job_view(
        summaries,
        world_size=opts.world_size,
        tokens_model_flops=global_model_flops(summaries),
        pipeline_stages=pipeline_stages,
        microbatches=microbatches,
        exclude_steps=opts.exclude_steps,
        input_warnings=input_warnings,
        keep_last_step=opts.keep_last_step,
    )


def global_model_flops(summaries: list[RankSummary]) -> dict[int, float] | None:
    """With a model description, the job's model FLOPs per step are global (not a sum of rank shares)."""
    for s in summaries:
        m = s.model
        if m is not None and m.source in ("flags", "config") and m.flops_per_step is not None:
            steps = set()
            for x in summaries:
                steps |= set(x.steps["step"].to_list())
            return {st: float(m.flops_per_step) for st in steps}
    return None
