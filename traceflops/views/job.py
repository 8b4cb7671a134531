"""Across ranks: per-rank summaries that merge into one job view.

A `RankSummary` holds the small tables the job view needs (steps with their
partition and FLOPs, collectives, idle reasons), so ranks can be summarised
anywhere and merged later with the same result as analysing them together.
Ranks' clocks differ: they are aligned on the ends of matched collectives
(a collective completes on all ranks of its group together), never compared raw.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core import fmt
from traceflops.core.contract import BUDGET_PREFIX, PATH_PREFIX
from traceflops.core.errors import InputError
from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis, Job, RankSummary
from traceflops.core.sections import Clock, JobAdviceItem, JobTotals
from traceflops.core.vocab import OVERLAYS, PARTITION, PHASES
from traceflops.metrics import utilization as metrics
from traceflops.stages.critical_path import KINDS
from traceflops.stages.timeline import union_measure
from traceflops.views import p2p
from traceflops.views.collectives import across_ranks
from traceflops.views.experts import experts, imbalance_advice

# Bus-bandwidth factors (NCCL tests' convention): bytes each rank moves over its links per byte of payload.
_BUS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "_allgather_base": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "_reduce_scatter_base": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "all_to_allv": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
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
            {"kind": x.kind, "title": x.title, "share": x.share, "recoverable": x.recoverable, "term": x.term}
            for x in a.advice[:ADVICE_PER_RANK]
        ],
        communication=a.communication,
    )


ADVICE_PER_RANK = 3  # headlines a rank summary keeps for the job's "what to try"


# --- the critical path across ranks -----------------------------------------


def comm_split(summaries: list[RankSummary], m: pl.DataFrame, offsets: dict[int, float]) -> list[RankSummary]:
    """Each rank's critical-path communication split into waiting for the last rank to arrive and the transfer itself.

    A matched collective waits on rank r from its own start until the last rank's
    start (aligned clocks); the path's communication segments are cut by that
    union of waiting intervals. Steps get `path_communication_waiting` and
    `path_communication_transfer` (µs); a rank without path segments keeps nulls.
    """
    if m.height == 0:
        return summaries
    a = m.with_columns(astart=pl.col("ts") + pl.col("rank").replace_strict(offsets, default=0.0))
    last = a.group_by("pg", "seq").agg(pl.col("astart").max().alias("last_astart"))
    a = a.join(last, on=["pg", "seq"])
    out = []
    for s in summaries:
        if s.path_comm is None or s.path_comm.height == 0 or s.rank is None:
            out.append(s)
            continue
        mine = a.filter(pl.col("rank") == s.rank)
        ws = mine["ts"].to_numpy()
        we = np.clip(mine["last_astart"].to_numpy() - offsets.get(s.rank, 0.0), ws, mine["end"].to_numpy())
        F = union_measure(ws, we)
        seg = s.path_comm
        wait = F(seg["end"].to_numpy()) - F(seg["start"].to_numpy())
        per = (
            seg.with_columns(_wait=pl.Series(wait), _dur=pl.col("end") - pl.col("start"))
            .group_by("step")
            .agg(
                path_communication_waiting=pl.col("_wait").sum(),
                path_communication_transfer=(pl.col("_dur") - pl.col("_wait")).sum(),
            )
        )
        steps = s.steps.drop(["path_communication_waiting", "path_communication_transfer"], strict=False)
        steps = steps.join(per, on="step", how="left", maintain_order="left").with_columns(
            pl.col("path_communication_waiting", "path_communication_transfer").fill_null(0.0)
        )
        out.append(replace(s, steps=steps))
    return out


# --- clocks -----------------------------------------------------------------


def matched(summaries: list[RankSummary]) -> pl.DataFrame:
    """Collectives present on more than one rank, keyed by (group, order within the group).

    Where a collective's group lists its ranks, only those ranks' copies match
    (a rank outside the group holds another group of the same name).
    """
    frames = [s.collectives.with_columns(rank=pl.lit(s.rank, pl.Int64)) for s in summaries if s.collectives.height]
    if not frames:
        return pl.DataFrame(schema={"pg": pl.Utf8, "seq": pl.Int64, "rank": pl.Int64})
    allc = pl.concat(frames, how="diagonal_relaxed")
    if "group_ranks" in allc.columns and allc["group_ranks"].is_not_null().any():
        listed = allc["group_ranks"].drop_nulls().unique().to_list()
        members = [_members(v) for v in listed]
        allc = allc.filter(
            pl.col("group_ranks").is_null()
            | pl.col("rank")
            .is_in(pl.col("group_ranks").replace_strict(listed, members, default=None, return_dtype=pl.List(pl.Int64)))
            .fill_null(True)
        )
    n = allc.group_by("pg", "seq").agg(pl.col("rank").n_unique().alias("n_ranks"))
    return allc.join(n.filter(pl.col("n_ranks") > 1), on=["pg", "seq"])


def _members(text: str) -> list[int] | None:
    try:
        ranks = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return ranks if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) else None


def clock_offsets(m: pl.DataFrame, ranks: list[int]) -> tuple[dict[int, float], float | None]:
    """Offset to add to each rank's clock so matched collectives end together; and the residual skew.

    The reference is the lowest rank. Each rank's offset is the median, over
    collectives it shares with the reference, of the difference in end times
    (a rank that shares none is aligned through ranks already aligned:
    `aligned_offsets`; one reached by no collective keeps 0); the residual is
    the median spread of aligned ends (what alignment could not remove).
    """
    if m.height == 0 or not ranks:
        return {r: 0.0 for r in ranks}, None
    offsets = {r: 0.0 for r in ranks}
    offsets.update(aligned_offsets(m, min(ranks)))
    aligned = m.with_columns(aend=pl.col("end") + pl.col("rank").replace_strict(offsets, default=0.0))
    spread = aligned.group_by("pg", "seq").agg((pl.col("aend").max() - pl.col("aend").min()).alias("spread"))
    # polars stubs type a column's median as any literal: this float column's is a float
    return offsets, float(spread["spread"].median()) if spread.height else None  # type: ignore[arg-type]


def aligned_offsets(m: pl.DataFrame, ref: int) -> dict[int, float]:
    """The offsets of the ranks that share collectives with the reference, or with a rank already aligned.

    First each rank that shares a group with the reference: the median of the
    reference's end minus its own. Then, round by round, each rank still
    unaligned that shares collectives with aligned ranks: the median, over
    those collectives, of the aligned ranks' (median) aligned end minus its
    own (a 2x2 mesh's rank 3 shares no group with rank 0). Ranks reached by no
    collective are left out.
    """
    known = {ref: 0.0}
    ends = m.select("pg", "seq", "rank", "end")
    while True:
        aligned = (
            ends.filter(pl.col("rank").is_in(list(known)))
            .group_by("pg", "seq")
            .agg((pl.col("end") + pl.col("rank").replace_strict(known, default=0.0)).median().alias("ref_end"))
        )
        off = (
            ends.filter(~pl.col("rank").is_in(list(known)))
            .join(aligned, on=["pg", "seq"])
            .group_by("rank")
            .agg((pl.col("ref_end") - pl.col("end")).median().alias("offset"))
        )
        if off.height == 0:
            return known
        known.update(dict(off.iter_rows()))


def collective_table(m: pl.DataFrame, offsets: dict[int, float], link_bw: float | None) -> pl.DataFrame:
    """Per matched collective: arrival skew (waiting for the last rank) apart from transfer time, and bandwidth."""
    if m.height == 0:
        return pl.DataFrame()
    a = m.with_columns(
        astart=pl.col("ts") + pl.col("rank").replace_strict(offsets, default=0.0),
        aend=pl.col("end") + pl.col("rank").replace_strict(offsets, default=0.0),
    )
    extra = [pl.col(c).drop_nulls().first() for c in ("pg_desc", "role", "group_ranks") if c in a.columns]
    per = a.group_by("pg", "seq").agg(
        pl.col("kind").first(),
        *extra,
        pl.col("step").min(),
        pl.col("bytes").max(),
        pl.col("group_size").max(),
        pl.col("rank").n_unique().alias("ranks"),
        (pl.col("astart").max() - pl.col("astart").min()).alias("arrival_skew_us"),
        pl.col("rank").sort_by("astart").last().alias("last_rank"),
        (pl.col("aend").median() - pl.col("astart").max()).clip(lower_bound=0).alias("transfer_us"),
    )
    n = pl.coalesce("group_size", "ranks").cast(pl.Float64)
    # One factor per (kind, group size): a handful of distinct pairs, not one per event.
    pairs = per.select("kind", n.alias("n")).unique()
    factor = {(k, x): (_BUS[k](x) if k in _BUS and x else None) for k, x in pairs.iter_rows()}
    factors = [factor[(k, x)] for k, x in per.select("kind", n.alias("n")).iter_rows()]
    per = (
        per.with_columns(bus_factor=pl.Series(factors, dtype=pl.Float64))
        .with_columns(
            algbw_gbps=pl.col("bytes") / pl.col("transfer_us") * 1e-3,
        )
        .with_columns(busbw_gbps=pl.col("algbw_gbps") * pl.col("bus_factor"))
    )
    if link_bw:
        # against intra-node NVLink: a collective that crosses nodes is bounded by the network instead
        per = per.with_columns(busbw_of_nvlink=pl.col("busbw_gbps") * 1e9 / link_bw)
    return per.sort("pg", "seq")


# --- the job ----------------------------------------------------------------


def _rank(s: RankSummary) -> int:
    """The rank of a summary that `assign_ranks` returned: each has one."""
    assert s.rank is not None, "a summary the job view reads has a rank (assign_ranks)"
    return s.rank


def assign_ranks(summaries: list[RankSummary], warnings: list[str]) -> list[RankSummary]:
    """The summaries by rank; one without a rank gets the lowest free one (a new summary, with a warning)."""
    used = {s.rank for s in summaries if s.rank is not None}
    nxt = 0
    ranked = []
    for s in summaries:
        if s.rank is None:
            while nxt in used:
                nxt += 1
            s = replace(s, rank=nxt)
            used.add(nxt)
            warnings.append(f"{s.path}: no rank in the trace or its name; assumed rank {nxt}")
        ranked.append(s)
    seen: dict[int, RankSummary] = {}
    for s in ranked:
        first = seen.setdefault(_rank(s), s)
        if first is s:
            continue
        if not same_numbers(first, s):
            raise InputError(
                s.path,
                f"rank {s.rank} is also given by {first.path}, with different numbers",
                "pass each rank's trace once",
            )
        warnings.append(f"{s.path}: the same rank {s.rank} trace as {first.path}; counted once")
    return sorted(seen.values(), key=_rank)


def same_numbers(a: RankSummary, b: RankSummary) -> bool:
    """Two summaries of one capture (a file given twice, or `rank0.json` beside `rank0.json.gz`)."""
    keys = ("flops", "wall_us", "time_us")
    return all(a.totals.get(k) == b.totals.get(k) for k in keys) and a.steps.equals(b.steps)


def per_rank_table(summaries: list[RankSummary]) -> pl.DataFrame:
    rows = []
    for s in summaries:
        t = s.totals
        row = {
            "rank": s.rank,
            "path": s.path,
            "wall_us": t.get("wall_us"),
            "device_mfu": t.get("mfu"),
            "hfu": t.get("hfu"),
            "executed_flops": t["flops"]["executed"],
            "recompute_flops": t["flops"]["recompute"],
        }
        row.update({f"time_{c}": (t.get("time_us") or {}).get(c) for c in PARTITION})
        rows.append(row)
    return pl.DataFrame(rows)


def missing_ranks(world: int, ranks: list[int], show: int = 20) -> tuple[int, list[int]] | None:
    """How many of ranks 0..world-1 are absent, and the first few: without building a set of the whole world."""
    present = {r for r in ranks if 0 <= r < world}
    count = world - len(present)
    if count <= 0:
        return None
    first: list[int] = []
    r = 0
    while len(first) < min(show, count):
        if r not in present:
            first.append(r)
        r += 1
    return count, first


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


def pipeline_bubbles(summaries: list[RankSummary], stages: int | None, microbatches: int | None) -> pl.DataFrame | None:
    """Per stage (rank) and step: P2P matched across ranks and the bubble it waited, against the ideal
    (p−1)/(m+p−1); p and m inferred from the P2P pattern unless given (`views.p2p.pipeline`)."""
    return p2p.pipeline(summaries, stages, microbatches)


def nvlink_per_direction(summaries: list[RankSummary]) -> float | None:
    """The device's NVLink bandwidth per direction (datasheets quote both directions together)."""
    from traceflops.core import hardware as hw

    name = next(((s.hardware or {}).get("name") for s in summaries if s.hardware), None)
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
    ranks = [_rank(s) for s in summaries]
    world = world_size or next((s.world_size for s in summaries if s.world_size), None) or len(summaries)
    missing = missing_ranks(world, ranks)
    if missing:
        warnings.append(
            f"{missing[0]} ranks missing from the inputs: {missing[1]}{' ...' if missing[0] > len(missing[1]) else ''} "
            f"(world size {world})"
        )
    peaks = {(s.hardware or {}).get("peak_flops") for s in summaries}
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
    model = next((s.model for s in summaries if s.model), None) or {}
    totals = JobTotals(
        wall_us=wall,
        world_size=world,
        mfu=metrics.utilization(model_total, secs, peak, world),
        hfu=metrics.utilization(executed, secs, peak, world)
        if any(s.totals.get("hfu") is not None for s in summaries)
        else None,
        collectives_matched=int(coll.height),
        arrival_skew_us=float(coll["arrival_skew_us"].sum()) if coll.height else 0.0,
        transfer_us=float(coll["transfer_us"].sum()) if coll.height else 0.0,
        model_source=model.get("source"),
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
            "(record_param_comms args appear with newer PyTorch)"
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
        advice=job_advice(summaries, late, coll, exclude_steps, pipe, ep),
        warning_groups=groups,
        communication=comm,
        communication_by_rank=comm_by_rank,
        experts=ep,
    )


def group_warnings(summaries: list[RankSummary], m: pl.DataFrame, ranks: list[int]) -> list[str]:
    """What the matching could not do: groups whose member ranks recorded different numbers of collectives (order
    pairs others past the first difference), and ranks no matched collective ties to the reference's clock."""
    out = []
    frames = [
        s.collectives.select("pg", "group_ranks").with_columns(rank=pl.lit(s.rank, pl.Int64))
        for s in summaries
        if s.collectives.height and "group_ranks" in s.collectives.columns
    ]
    if frames:
        counts = (
            pl.concat(frames)
            .filter(pl.col("group_ranks").is_not_null())
            .group_by("pg", "rank")
            .len()
            .sort("pg", "rank")
        )
        for (pg,), per in counts.group_by("pg", maintain_order=True):
            if per["len"].n_unique() > 1:
                got = ", ".join(f"rank {r}: {n}" for r, n in per.select("rank", "len").iter_rows())
                out.append(
                    f"group {pg}: its ranks recorded different numbers of its collectives ({got}); matched by order "
                    "within the group, those past the first missing one may pair different collectives"
                )
    if m.height and len(ranks) > 1:
        lost = sorted(set(ranks) - set(aligned_offsets(m, min(ranks))))
        if lost:
            out.append(
                f"ranks {lost} share no matched collective, directly or through other ranks, with rank {min(ranks)}: "
                "their clocks are not aligned (offset 0)"
            )
    return out


def warning_groups(own: list[str], summaries: list[RankSummary]) -> list[tuple[str, tuple[int, ...], int]]:
    """The job's own warnings, then each rank warning once for all the ranks that gave it, with its most repeats in one
    rank."""
    ranks_of: dict[str, list[int]] = {}
    repeats: dict[str, int] = {}
    for s in summaries:
        for w, n in fmt.counted(s.warnings):
            ranks_of.setdefault(w, []).append(_rank(s))
            repeats[w] = max(repeats.get(w, 0), n)
    return [(w, (), n) for w, n in fmt.counted(own)] + [(w, tuple(rs), repeats[w]) for w, rs in ranks_of.items()]


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
            by_title.setdefault(x["title"], []).append((_rank(s), x))
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


def global_model_flops(summaries: list[RankSummary]) -> dict[int, float] | None:
    """With a model description, the job's model FLOPs per step are global (not a sum of rank shares)."""
    for s in summaries:
        m = s.model or {}
        if m.get("source") in ("flags", "config") and m.get("flops_per_step") is not None:
            steps = set()
            for x in summaries:
                steps |= set(x.steps["step"].to_list())
            return {st: float(m["flops_per_step"]) for st in steps}
    return None
