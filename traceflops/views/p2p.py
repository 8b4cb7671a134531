"""Point-to-point transfers (pipeline parallelism): who sends to whom, in which phase, and how long a receive blocked.

gloo records a send or receive as `gloo:send` / `gloo:recv` on the calling
thread, spanning from its issue to its completion, and the issuing call
(`c10d::send(tensors, group, dst, tag)`, `c10d::recv_(tensors, group, src, tag)`)
records the peer's rank within the group as its third concrete input. On a
device trace PyTorch names NCCL's transfers `send` / `recv` (`Collective name`)
with the peer's global rank (`Dst Rank` / `Src Rank`, in recent releases).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import polars as pl

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.vocab import (
    HOST_COMM_CALL_RE,
    HOST_COMM_WAIT_RE,
    HOST_COMM_WORK_RE,
)
from traceflops.stages.sweep import union_measure

# A P2P transfer's direction (`send` | `recv`), its peer's global rank and, for a receive, the time its thread was
# blocked in it with no compute running (`blocked_us`); null where the trace does not say.
P2P_COLUMNS = ("p2p", "peer", "blocked_us")
P2P_CALLS = ("c10d::send", "c10d::recv_")


def call_args(a: Analysis, w: pl.DataFrame) -> dict[str, pl.Expr | pl.Series]:
    """Columns for CPU collective works `w`: a send's or receive's direction and its peer's rank within the group,
    from the call that issued it (`comm_issuer`, an op row)."""
    name = pl.col("name")
    p2p = pl.when(name == "gloo:send").then(pl.lit("send")).when(name == "gloo:recv").then(pl.lit("recv"))
    if "comm_issuer" not in w.columns or "concrete" not in a.ops.columns or w.height == 0:
        return {"p2p": p2p, "peer_local": pl.lit(None, pl.Int64)}
    call = a.ops.select("name", "concrete")[w["comm_issuer"].fill_null(0)].with_columns(
        ok=w["comm_issuer"].is_not_null()
    )
    peer = call.select(
        pl.when(pl.col("ok") & pl.col("name").is_in(P2P_CALLS)).then(
            pl.col("concrete").str.json_path_match("$[2]").str.to_integer(strict=False)
        )
    ).to_series()
    return {"p2p": p2p, "peer_local": peer.cast(pl.Int64)}


def device_args() -> dict[str, pl.Expr]:
    """Columns for device collectives: a send's or receive's direction and its peer's global rank, as PyTorch records
    them on NCCL's point-to-point (`Collective name` send / recv, the `Dst Rank` of a send, the `Src Rank` of a
    receive: torch/csrc/profiler/util.cpp); null where it records neither (an older PyTorch)."""
    c = pl.col("collective")
    return {
        "p2p": pl.when(c.is_in(["send", "recv"])).then(c),
        "peer_local": pl.lit(None, pl.Int64),  # `keyed` maps a group-local peer; this one is global already
        "peer_global": pl.when(c.is_in(["send", "recv"])).then(pl.col("p2p_peer")),
    }


def keyed(k: pl.DataFrame, a: Analysis) -> pl.DataFrame:
    """P2P transfers keyed by who sends to whom, with the peer's global rank, their phase and a receive's blocked time.

    The group becomes `<pg>:<sender>-><receiver>` (ranks `[low,high]`), so that
    order within it pairs a rank's k-th send to a peer with that peer's k-th
    receive from it, not a rank's i-th P2P with its neighbour's i-th (which
    pairs sends with sends). A pipeline schedule issues its transfers outside
    autograd, so their op phase says nothing: the first transfer a step makes
    with a peer carries a forward activation (micro-batch 0's forward comes
    before any backward), so a peer this rank first sends to is downstream;
    to a downstream peer (or from an upstream one) is forward, the other way
    backward gradients. A phase autograd gave (backward, recompute) is kept.
    """
    if "p2p" not in k.columns or k.height == 0 or k["p2p"].is_null().all():
        return k.with_columns(
            p2p=pl.col("p2p") if "p2p" in k.columns else pl.lit(None, pl.Utf8),
            peer=pl.lit(None, pl.Int64),
            blocked_us=pl.lit(None, pl.Float64),
        )
    rank = a.meta.get("rank")
    listed = pl.col("pg_ranks").str.json_decode(pl.List(pl.Int64))
    peer = (
        pl.when(pl.col("pg_ranks").is_not_null())
        .then(listed.list.get(pl.col("peer_local"), null_on_oob=True))
        .otherwise(pl.col("peer_local"))
    )
    if "peer_global" in k.columns:  # recorded as a global rank (device traces)
        peer = pl.coalesce(pl.col("peer_global"), peer)
    k = k.with_columns(
        peer=pl.when(pl.col("p2p").is_not_null()).then(peer).cast(pl.Int64),
        blocked_us=pl.Series(recv_blocked(a, k), dtype=pl.Float64, nan_to_null=True),
    )
    first = (
        k.filter(pl.col("peer").is_not_null())
        .sort("ts")
        .group_by("step", "peer", maintain_order=True)
        .agg(pl.col("p2p").first())
        .group_by("peer")
        .agg(down=(pl.col("p2p") == "send").mean() > 0.5)
    )
    down = pl.col("peer").replace_strict(first["peer"], first["down"], default=None, return_dtype=pl.Boolean)
    forward = (pl.col("p2p") == "send") == down
    if "phase" in k.columns:
        kept = pl.col("phase").is_in(["backward", "recompute"])
        k = k.with_columns(
            phase=pl.when(down.is_null() | kept)
            .then(pl.col("phase"))
            .otherwise(pl.when(forward).then(pl.lit("forward")).otherwise(pl.lit("backward")))
        )
    if rank is None:
        return k
    me = pl.lit(rank, pl.Int64)
    src = pl.when(pl.col("p2p") == "send").then(me).otherwise(pl.col("peer")).cast(pl.Utf8)
    dst = pl.when(pl.col("p2p") == "send").then(pl.col("peer")).otherwise(me).cast(pl.Utf8)
    pair = pl.col("p2p").is_not_null() & pl.col("peer").is_not_null()
    return k.with_columns(
        pg_name=pl.when(pair)
        .then(pl.concat_str(pl.col("pg_name").fill_null("?"), pl.lit(":"), src, pl.lit("->"), dst))
        .otherwise(pl.col("pg_name")),
        pg_ranks=pl.when(pair)
        .then(
            pl.concat_str(
                pl.lit("["),
                pl.min_horizontal(me, "peer").cast(pl.Utf8),
                pl.lit(","),
                pl.max_horizontal(me, "peer").cast(pl.Utf8),
                pl.lit("]"),
            )
        )
        .otherwise(pl.col("pg_ranks")),
    )


def recv_blocked(a: Analysis, k: pl.DataFrame) -> np.ndarray:
    """Per receive, the time its thread spent in it with no compute running; NaN for the other rows.

    The receive's work spans from its issue to its completion on the calling
    thread, and the thread sits in the wait for whatever of that span no op
    covers. Compute is the thread's `cpu_op`s other than communication calls,
    works and waits, and other than the ops around a transfer (the thread
    waits inside those). Receives that overlap one another count their common
    time once (the earliest has it).
    """
    out = np.full(k.height, np.nan)
    recv = (k["p2p"] == "recv").fill_null(False).to_numpy()
    ops = a.ops
    if not recv.any() or "row" not in k.columns or "cat" not in ops.columns:
        return out
    parent = ops["parent"].to_numpy()
    around = np.zeros(ops.height, bool)
    at = parent[k["row"].to_numpy()]
    while len(at := at[at >= 0]):
        around[at] = True
        at = parent[at]
    comm = pl.col("name").str.contains(f"{HOST_COMM_WORK_RE}|{HOST_COMM_CALL_RE}|{HOST_COMM_WAIT_RE}")
    compute = ops.select((pl.col("cat") == "cpu_op") & ~comm).to_series().fill_null(False).to_numpy() & ~around
    ts, end, tid = ops["ts"].to_numpy(), (ops["ts"] + ops["dur"]).to_numpy(), ops["tid"].cast(pl.Utf8).to_numpy()
    rows = np.flatnonzero(recv)
    r_tid = k["tid"].cast(pl.Utf8).to_numpy()[rows]
    r_ts, r_end = k["ts"].to_numpy()[rows], (k["ts"] + k["dur"]).to_numpy()[rows]
    for t in np.unique(r_tid):  # the threads that receive: one per pipeline stage
        on_t = r_tid == t
        o = np.argsort(r_ts[on_t], kind="stable")
        s, e = r_ts[on_t][o], r_end[on_t][o]
        s = np.maximum(s, np.r_[-np.inf, np.maximum.accumulate(e)[:-1]])  # what an earlier receive has not counted
        e = np.maximum(e, s)
        on = compute & (tid == t)
        covered = union_measure(ts[on], end[on])
        out[rows[on_t][o]] = (e - s) - (covered(e) - covered(s))
    return out


# --- the pipeline across ranks ------------------------------------------------

PIPELINE_COLUMNS = (
    "rank",
    "step",
    "stage",
    "stages",
    "microbatches",
    "stages_source",
    "sends",
    "recvs",
    "matched",
    "forward_p2p",
    "backward_p2p",
    "p2p_us",
    "recv_blocked_us",
    "window",
    "bubble",
    "bubble_source",
    "ideal_bubble",
)


def ideal_bubble(p, m) -> float | None:
    """The idle share of a step a p-stage schedule of m micro-batches cannot avoid (GPipe and 1F1B alike)."""
    return (p - 1) / (m + p - 1) if p and m else None


def _stages(c: pl.DataFrame) -> tuple[dict[int, int], dict[int, int]]:
    """Each rank's stage and its pipeline's number of stages, from who is upstream of whom.

    A step's first transfer between two neighbours carries micro-batch 0's
    forward activation, so it goes downstream: a rank whose first transfer with
    a peer is a send is upstream of it (votes of both ranks over every step).
    Stage = the longest chain of upstream ranks before a rank; a pipeline's
    stages = its longest chain.
    """
    first = (
        c.sort("ts")
        .group_by("rank", "step", "peer", maintain_order=True)
        .agg(pl.col("p2p").first())
        .with_columns(
            lo=pl.min_horizontal("rank", "peer"),
            hi=pl.max_horizontal("rank", "peer"),
            vote=pl.when((pl.col("p2p") == "send") == (pl.col("rank") < pl.col("peer"))).then(1).otherwise(-1),
        )
        .group_by("lo", "hi")
        .agg(pl.col("vote").sum())
    )
    edges = [(lo, hi) if v >= 0 else (hi, lo) for lo, hi, v in first.select("lo", "hi", "vote").iter_rows()]
    ranks = sorted({r for e in edges for r in e})
    stage = dict.fromkeys(ranks, 0)
    for _ in ranks:  # longest path over a handful of edges (one per pair of neighbouring stages)
        for a, b in edges:
            stage[b] = max(stage[b], stage[a] + 1)
    comp = {r: r for r in ranks}

    def root(r):
        while comp[r] != r:
            r = comp[r]
        return r

    for a, b in edges:
        comp[root(a)] = root(b)
    depth: dict[int, int] = {}
    for r in ranks:
        depth[root(r)] = max(depth.get(root(r), 0), stage[r] + 1)
    return stage, {r: depth[root(r)] for r in ranks}


def pipeline(summaries, stages: int | None = None, microbatches: int | None = None) -> pl.DataFrame | None:
    """Per rank (stage) and step: its P2P transfers, matched with their peers', and the pipeline bubble it waited.

    Where the trace tells each transfer's direction and peer (gloo's calls; NCCL's send and recv as PyTorch records
    them, `device_args`), stages p
    come from the chain of send directions and micro-batches m from the first
    stage's forward sends in the step; `stages` and `microbatches` override
    them. A rank's bubble is the time it was blocked on receives with no compute
    running (`recv_blocked_us`) over its step window, against the ideal
    (p−1)/(m+p−1); on a device trace (no thread to be blocked on a receive), or without directions, the bubble is
    the rank's P2P time over its window. Sends and receives are matched by
    (sender, receiver, order): `matched` counts this rank's transfers whose other
    end the peer recorded. None when no rank has P2P.
    """
    frames = []
    for s in summaries:
        c = s.collectives.filter(pl.col("kind") == "sendrecv")
        if c.height:
            frames.append(c.with_columns(rank=pl.lit(s.rank, pl.Int64), step=pl.col("step").cast(pl.Int64)))
    if not frames:
        return None
    c = pl.concat(frames, how="diagonal_relaxed")
    for col, t in (("p2p", pl.Utf8), ("peer", pl.Int64), ("blocked_us", pl.Float64)):
        if col not in c.columns:
            c = c.with_columns(pl.lit(None, t).alias(col))
    windows = pl.concat(
        [
            s.steps.select(pl.col("step").cast(pl.Int64), pl.col("window").cast(pl.Float64)).with_columns(
                rank=pl.lit(s.rank, pl.Int64)
            )
            for s in summaries
        ],
        how="diagonal_relaxed",
    )
    known = c.filter(pl.col("p2p").is_not_null() & pl.col("peer").is_not_null())
    stage, depth = _stages(known) if known.height else ({}, {})
    st = pl.col("rank").replace_strict(stage, default=None, return_dtype=pl.Int64)
    peer_st = pl.col("peer").replace_strict(stage, default=None, return_dtype=pl.Int64)
    c = c.with_columns(
        stage=st,
        stages=pl.col("rank").replace_strict(depth, default=None, return_dtype=pl.Int64),
        forward=pl.when(pl.col("p2p") == "send").then(peer_st > st).otherwise(peer_st < st),
    )
    # (sender, receiver, order): a send and the receive it fed share the key
    src = pl.when(pl.col("p2p") == "send").then(pl.col("rank")).otherwise(pl.col("peer"))
    dst = pl.when(pl.col("p2p") == "send").then(pl.col("peer")).otherwise(pl.col("rank"))
    c = (
        c.sort("ts")
        .with_columns(src=src, dst=dst)
        .with_columns(nth=pl.int_range(pl.len()).over("rank", "src", "dst", "p2p"))
    )
    ends = c.filter(pl.col("p2p").is_not_null() & pl.col("peer").is_not_null())
    other = ends.select(
        "src",
        "dst",
        "nth",
        p2p=pl.when(pl.col("p2p") == "send").then(pl.lit("recv")).otherwise(pl.lit("send")),
        _found=pl.lit(True),
    )
    c = c.join(other, on=["src", "dst", "nth", "p2p"], how="left").with_columns(pl.col("_found").fill_null(False))
    # micro-batches: the first stage's forward sends in the step, per pipeline (its first stage's rank)
    firsts = (
        c.filter((pl.col("stage") == 0) & (pl.col("p2p") == "send") & pl.col("forward"))
        .group_by("rank", "step")
        .agg(m=pl.len())
    )
    head = _heads(known, stage)
    per = (
        c.group_by("rank", "step")
        .agg(
            pl.col("stage").first(),
            pl.col("stages").first(),
            sends=(pl.col("p2p") == "send").sum(),
            recvs=(pl.col("p2p") == "recv").sum(),
            matched=pl.col("_found").sum(),
            forward_p2p=pl.col("forward").fill_null(False).sum(),
            backward_p2p=(~pl.col("forward")).fill_null(False).sum(),
            p2p_us=pl.col("dur").sum(),
            recv_blocked_us=pl.when(pl.col("blocked_us").is_not_null().any()).then(pl.col("blocked_us").sum()),
        )
        .with_columns(head=pl.col("rank").replace_strict(head, default=None, return_dtype=pl.Int64))
    )
    per = per.join(firsts.rename({"rank": "head"}), on=["head", "step"], how="left")
    per = per.join(windows, on=["rank", "step"], how="inner").filter(pl.col("step") >= 0)
    p = pl.lit(stages, pl.Int64) if stages else pl.col("stages")
    m = pl.lit(microbatches, pl.Int64) if microbatches else pl.col("m").cast(pl.Int64)
    measured = pl.col("recv_blocked_us").is_not_null()
    return (
        per.with_columns(
            stages=p,
            microbatches=m,
            stages_source=pl.lit(
                "given"
                if stages and microbatches
                else "inferred"
                if not (stages or microbatches)
                else "given and inferred"
            ),
            bubble=pl.when(measured).then(pl.col("recv_blocked_us")).otherwise(pl.col("p2p_us")) / pl.col("window"),
            bubble_source=pl.when(measured).then(pl.lit("recv_blocked")).otherwise(pl.lit("p2p_time")),
        )
        .with_columns(
            ideal_bubble=(pl.col("stages") - 1) / (pl.col("microbatches") + pl.col("stages") - 1),
            stages_source=pl.when(pl.col("stages").is_null() | pl.col("microbatches").is_null())
            .then(pl.lit(None, pl.Utf8))
            .otherwise(pl.col("stages_source")),
        )
        .with_columns(
            pl.col("ideal_bubble").cast(pl.Float64),
            *[pl.col(x).cast(pl.Int64) for x in ("sends", "recvs", "matched", "forward_p2p", "backward_p2p")],
        )
        .select(PIPELINE_COLUMNS)
        .sort("rank", "step")
    )


def _heads(known: pl.DataFrame, stage: dict[int, int]) -> dict[int, int]:
    """Each rank's pipeline's first stage: climb upstream neighbours (a sender to it in forward) to stage 0."""
    up: dict[int, int] = {}
    for r, peer in known.select("rank", "peer").unique().iter_rows():
        if stage.get(peer, -1) == stage.get(r, -1) - 1:
            up[r] = peer
    out = {}
    for r in stage:
        h = r
        for _ in stage:
            if h not in up:
                break
            h = up[h]
        out[r] = h
    return out


def bubble_advice(
    pipe: pl.DataFrame | None, summaries, exclude_steps=(), unit: str = "of step time, over all ranks"
) -> dict | None:
    """The pipeline bubble as what to try, when the stages' blocked receives are most of their exposed communication:
    then overlapping communication cannot help, only a smaller bubble (more micro-batches, virtual stages) can.

    The share is the blocked time over the ranks' summed step windows; the gain
    expected from m → 2m scales the measured bubble by the ideal's ratio."""
    if pipe is None or pipe.height == 0 or pipe["recv_blocked_us"].is_null().all():
        return None
    use = pipe.filter(~pl.col("step").is_in(list(exclude_steps)) & pl.col("recv_blocked_us").is_not_null())
    blocked, window = float(use["recv_blocked_us"].sum()), float(use["window"].sum())
    exposed = sum(
        float(
            s.steps.filter(~pl.col("step").is_in(list(exclude_steps)))["time_communication_exposed"].fill_null(0).sum()
        )
        for s in summaries
        if "time_communication_exposed" in s.steps.columns
    )
    if blocked <= 0 or window <= 0 or (exposed > 0 and blocked < 0.5 * exposed):
        return None
    # polars stubs type a column's max as any literal: these are whole-number columns
    p, m = cast("int | None", use["stages"].max()), cast("int | None", use["microbatches"].max())
    ideal, share = ideal_bubble(p, m), blocked / window
    per = (
        use.group_by("stage", "rank")
        .agg(pl.col("recv_blocked_us").sum(), pl.col("window").sum())
        .with_columns(b=pl.col("recv_blocked_us") / pl.col("window"))
        .sort("stage", "rank")
    )
    ev = [
        f"{p} stages, {m} micro-batches per step ({use['stages_source'].drop_nulls().first() or 'unknown'}); "  # type: ignore[str-bytes-safe]  # polars stubs: a str column's value is a str
        f"ideal bubble (p−1)/(m+p−1) = {ideal:.1%}"
        if ideal is not None
        else "stages or micro-batches unknown: no ideal bubble"
    ]
    ev += [
        f"stage {st} (rank {r}): blocked on receives with no compute {b:.1%} of its step time"
        for st, r, b in per.select("stage", "rank", "b").iter_rows()
    ]
    ev.append(
        f"{fmt.pct(blocked / exposed, keep_small=False) if exposed > 0 else 'all'} of the ranks' exposed communication "
        "is this waiting"
    )
    remedies, gain = [], None
    if ideal and m:  # (an ideal bubble is known only with m)
        at2m = ideal_bubble(p, 2 * m)
        assert at2m is not None  # p and 2m are known
        gain = share * (1 - at2m / ideal)
        remedies.append(
            f"More micro-batches per step: m = {2 * m} instead of {m} lowers the ideal bubble from {ideal:.1%} to "
            f"{at2m:.1%}, about {gain:.1%} of step time back at the measured bubble (keep each micro-batch large "
            "enough for efficient matmuls)"
        )
        remedies.append(
            f"An interleaved schedule (ScheduleInterleaved1F1B, v virtual stages per rank) divides the ideal bubble "
            f"by v: {ideal / 2:.1%} at v = 2"
        )
        if share > 1.5 * ideal:
            remedies.append(
                f"The measured bubble ({share:.1%}) is {share / ideal:.1f}× the ideal: balance the stages' compute "
                "(the slowest stage sets the pace) and keep host work off the step"
            )
    return {
        "kind": "pipeline_bubble",
        "term": "communication_exposed",
        "title": "Pipeline bubble: stages wait on their neighbours' activations and gradients",
        "share": share,
        "recoverable": gain if gain is not None else share,
        "unit": unit,
        "evidence": ev,
        "remedies": remedies,
        "data": {
            "blocked_us": blocked,
            "window_us": window,
            "exposed_us": exposed,
            "stages": p,
            "microbatches": m,
            "ideal_bubble": ideal,
        },
    }
