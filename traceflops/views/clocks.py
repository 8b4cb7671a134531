"""Matching collectives across ranks and aligning the ranks' clocks on them.

A collective completes on all ranks of its group together, so its copies
(keyed by group and order within the group) tie the ranks' clocks: the offsets
that make matched collectives end together, the per-collective table (arrival
skew apart from transfer, with bus bandwidth), the critical path's
communication split into waiting and transfer, and what the matching could not do.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import polars as pl

from traceflops.core.results import RankSummary
from traceflops.stages.sweep import union_measure

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
    "collective_permute": lambda n: 1.0,  # each device's buffer crosses one link
}


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
