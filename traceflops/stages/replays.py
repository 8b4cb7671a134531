"""Kernels replayed from a CUDA/HIP graph, attributed to the ops that recorded them.

A graph replay (`cudaGraphLaunch` / `hipGraphLaunch`) runs many kernels under
one runtime call and no op: their shapes, and so their FLOPs and phase, are
where the graph was captured. A capture is a span of runtime launches between
`*StreamBeginCapture` and `*StreamEndCapture` on one thread, each launch
naming its kernel and sitting under the op that issued it; the kernels did not
run then. Captures come from a capture trace (vLLM / SGLang write one per
graph into `capture_traces/`) or from the analysed trace itself (torch.compile
captures on its first calls, replays after).

A replay is matched to a captured graph holding the same kernels (by name, as
a multiset: streams may interleave), the i-th replay of a kernel set to the
i-th capture of it, round robin; the k-th replayed kernel of a name is then
the k-th captured launch of that name. Each captured op a replay ran (the
matmul op above a launch, else the op that made it) becomes one op of the
analysed trace, nested under the op that launched the
replay (so it takes the phase and the step of the replay), with the captured
op's name and recorded inputs: the FLOP formulas then count it as if it had
run eagerly. Replays whose kernel set matches no capture, or matches captures
whose ops' shapes differ (graphs of several batch sizes), stay unattributed:
their matmul kernels are told by name, their FLOPs unknown, and a warning
says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from traceflops.core.trace import OPS_SCHEMA, Coded, Trace, Warnings
from traceflops.stages.clean import clean
from traceflops.stages.count import has_formula, leaf_matmuls
from traceflops.stages.link import Linked, link, nearest

GRAPH_LAUNCH_RE = r"(?i)graphlaunch"  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch
_BEGIN_RE = r"StreamBeginCapture"
_END_RE = r"StreamEndCapture"
OP_FIELDS = ("name", "dims", "types", "concrete", "strides")
_SEP = "\x1f"

HOW_TO_CAPTURE = (
    "profile the graph captures too and pass that trace with --graph-capture (vLLM and SGLang write "
    "capture_traces/ beside the trace when capture profiling is on; torch.compile captures on its first calls: "
    "start the profiler before them)"
)


def replays_graphs(trace: Trace) -> bool:
    """Whether the trace launched any CUDA/HIP graph (only then are captures read)."""
    names = trace.launches["name"]
    coded = Coded.found(names)  # the rule run over the distinct names only
    distinct = coded.distinct if coded is not None else names.drop_nulls().unique()
    return bool(distinct.str.contains(GRAPH_LAUNCH_RE).any())


@dataclass
class Captures:
    """What graph captures recorded: each captured kernel launch with its op (`launches`), and the ops below each
    captured matmul op (`below`: what its formula may read, such as a fused MoE's expert weights)."""

    launches: pl.DataFrame
    below: pl.DataFrame


_BELOW_SCHEMA = {
    "op": pl.Int64,
    "sub": pl.Int64,
    "up": pl.Int64,
    "ts": pl.Float64,
    **{f"op_{c}": OPS_SCHEMA[c] for c in OP_FIELDS},
}


def captured_launches(trace: Trace) -> Captures:
    """Every kernel launch made while a stream was being captured, with the matmul op (if any) that issued it.

    Columns: graph (capture number, in capture order), kernel, occ (its ordinal among the graph's launches of
    that kernel), op (a key for the captured op, unique within the trace, or null) and `OP_FIELDS` as op_*. The op
    is the matmul op above the launch, else the innermost op that made it.
    """
    out_schema = {
        "graph": pl.Int64,
        "kernel": pl.Utf8,
        "occ": pl.Int64,
        "op": pl.Int64,
        **{f"op_{c}": OPS_SCHEMA[c] for c in OP_FIELDS},
    }
    none = Captures(pl.DataFrame(schema=out_schema), pl.DataFrame(schema=_BELOW_SCHEMA))
    launches = trace.launches
    marks = launches["name"].str.contains(_BEGIN_RE) | launches["name"].str.contains(_END_RE)
    if not marks.any():
        return none
    linked = link(clean(trace))
    ops = linked.ops
    ran = set(trace.kernels["correlation"].drop_nulls().to_list()) if trace.kernels.height else set()
    nearest_mm = nearest(ops["parent"].to_numpy(), leaf_matmuls(ops)) if ops.height else np.zeros(0, dtype=np.int64)
    op_row = linked.launches["op_row"].to_numpy()
    mm = np.where(op_row >= 0, nearest_mm[np.maximum(op_row, 0)] if ops.height else -1, -1)
    mm = np.where(mm >= 0, mm, op_row)  # not under a matmul op: the op that launched it (its name says why no FLOPs)
    ln = (
        linked.launches.with_columns(mm=pl.Series(mm, dtype=pl.Int64))
        .sort(["pid", "tid", "ts"], nulls_last=True)
        .with_columns(
            begin=pl.col("name").str.contains(_BEGIN_RE).cast(pl.Int64),
            end=pl.col("name").str.contains(_END_RE).cast(pl.Int64),
        )
        .with_columns(
            opened=pl.col("begin").cum_sum().over("pid", "tid"),
            closed=pl.col("end").cum_sum().over("pid", "tid") - pl.col("end"),
        )
    )
    # A launch names its kernel on ROCm; one that names none (CUDA's runtime calls may not) is kept as "": such a
    # capture is matched by the order of its launches.
    is_launch = pl.col("kernel").is_not_null() | (
        pl.col("name").str.contains("Launch") & ~pl.col("name").str.contains(GRAPH_LAUNCH_RE)
    )
    inside = ln.filter(
        (pl.col("opened") > pl.col("closed")) & is_launch & ~pl.col("correlation").is_in(list(ran))
    ).with_columns(kernel=pl.col("kernel").fill_null(""))
    if inside.height == 0:
        return none
    keyed = inside.with_columns(graph=pl.struct("pid", "tid", "opened").rank("dense").cast(pl.Int64) - 1)
    keyed = keyed.sort(["graph", "ts"]).with_columns(occ=pl.int_range(pl.len(), dtype=pl.Int64).over("graph", "kernel"))
    fields = ops.select([pl.col(c).alias(f"op_{c}") for c in OP_FIELDS]) if ops.height else None
    rows = keyed["mm"].to_numpy()
    gathered = (
        fields[np.maximum(rows, 0)]
        if fields is not None and len(rows)
        else pl.DataFrame(schema={f"op_{c}": OPS_SCHEMA[c] for c in OP_FIELDS})
    )
    keep = pl.Series(rows >= 0)
    gathered = gathered.select([pl.when(keep).then(pl.col(c)).alias(c) for c in gathered.columns])
    out = pl.concat(
        [
            keyed.select("graph", "kernel", "occ", op=pl.when(pl.col("mm") >= 0).then(pl.col("mm"))),
            gathered,
        ],
        how="horizontal",
    ).cast(out_schema)  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant
    return Captures(out, _below(ops, np.unique(rows[rows >= 0])))


def _below(ops: pl.DataFrame, roots: np.ndarray) -> pl.DataFrame:
    """The ops nested under each captured matmul op (a root), with their parents as keys."""
    formula = has_formula(ops["name"], ops["matmul_hint"])
    roots = roots[formula[roots]] if len(roots) else roots
    if not len(roots):
        return pl.DataFrame(schema=_BELOW_SCHEMA)
    mark = np.zeros(ops.height, dtype=bool)
    mark[roots] = True
    parent = ops["parent"].to_numpy()
    owner = nearest(parent, mark)
    sub = np.flatnonzero((owner >= 0) & ~mark)
    if not len(sub):
        return pl.DataFrame(schema=_BELOW_SCHEMA)
    return pl.concat(
        [
            pl.DataFrame({"op": owner[sub], "sub": sub, "up": parent[sub]}),
            ops[sub].select("ts", *[pl.col(c).alias(f"op_{c}") for c in OP_FIELDS]),
        ],
        how="horizontal",
    ).cast(_BELOW_SCHEMA)  # type: ignore[arg-type]  # polars' stub: Mapping keys invariant


def merge_captures(captures: Sequence[Captures]) -> Captures:
    """Captures of several traces as one: graph numbers and op keys made distinct."""
    parts, below, graphs, ops = [], [], 0, 0
    for c in captures:
        if c.launches.height == 0:
            continue
        parts.append(c.launches.with_columns(pl.col("graph") + graphs, pl.col("op") + ops))
        below.append(c.below.with_columns(pl.col("op") + ops, pl.col("sub") + ops, pl.col("up") + ops))
        graphs += int(c.launches["graph"].max()) + 1  # type: ignore[arg-type]  # polars' stub
        last_op = int(c.launches["op"].max() or 0)  # type: ignore[arg-type]  # polars' stub
        last_sub = int(c.below["sub"].max() or 0) if c.below.height else 0  # type: ignore[arg-type]  # polars' stub
        ops += max(last_op, last_sub) + 1
    if not parts:
        return Captures(pl.DataFrame(), pl.DataFrame(schema=_BELOW_SCHEMA))
    return Captures(pl.concat(parts), pl.concat(below) if below else pl.DataFrame(schema=_BELOW_SCHEMA))


def _signatures(df: pl.DataFrame, key: str, name: str) -> pl.DataFrame:
    """Per graph (or replay): its kernel names as a sorted multiset, hashed."""
    return df.group_by(key).agg(sig=pl.col(name).sort().str.join(_SEP).hash())


def _match(replay: pl.DataFrame, captured: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Replayed kernels matched to captured graphs by `mkey` (the kernel name, or "" for captures that name none).

    Returns the matched kernels with their graph and `occ` (k-th of its key in the replay), the correlations of
    replays whose candidate captures disagree on their ops, and the kernels of replays no capture holds.
    """
    if captured.height == 0:
        return (
            replay.clear().with_columns(graph=pl.lit(None, pl.Int64), occ=pl.lit(None, pl.Int64)),
            pl.DataFrame(schema={"correlation": pl.Int64}),
            replay,
        )
    # Candidate graphs per kernel set, and whether their ops agree (else the replay cannot be told apart).
    gsig = _signatures(captured, "graph", "kernel")
    shape = (
        captured.sort("graph", "kernel", "occ")
        .group_by("graph", maintain_order=True)
        .agg(
            fp=pl.concat_str([pl.col("kernel"), *[pl.col(f"op_{c}").fill_null("") for c in OP_FIELDS]], separator=_SEP)
            .str.join(_SEP)
            .hash()
        )
    )
    cand = (
        gsig.join(shape, on="graph")
        .sort("graph")
        .with_columns(
            slot=pl.int_range(pl.len(), dtype=pl.Int64).over("sig"),
            n=pl.len().over("sig"),
            agree=pl.col("fp").n_unique().over("sig") == 1,
        )
    )
    rsig = (
        _signatures(replay, "correlation", "mkey")
        .join(replay.group_by("correlation").agg(first=pl.col("ts").min()), on="correlation")
        .sort("first")
    )
    rsig = rsig.join(cand.select("sig", "n", "agree").unique("sig"), on="sig", how="left")
    ambiguous = rsig.filter(pl.col("n").is_not_null() & ~pl.col("agree")).select("correlation")
    rsig = rsig.filter(pl.col("n").is_not_null() & pl.col("agree")).with_columns(
        slot=pl.int_range(pl.len(), dtype=pl.Int64).over("sig") % pl.col("n")
    )
    rsig = rsig.join(cand.select("sig", "slot", "graph"), on=["sig", "slot"], how="left")
    matched = replay.join(rsig.select("correlation", "graph"), on="correlation", how="inner")
    matched = matched.sort("ts").with_columns(occ=pl.int_range(pl.len(), dtype=pl.Int64).over("correlation", "mkey"))
    rest = replay.join(rsig.select("correlation"), on="correlation", how="anti").join(
        ambiguous, on="correlation", how="anti"
    )
    return matched, ambiguous, rest


def attribute_replays(linked: Linked, captures: Captures, warnings: Warnings) -> Linked:
    """Replayed kernels linked to one new op per captured op they ran (see the module doc)."""
    captured = captures.launches
    k = linked.kernels
    if k.height == 0 or "launch_name" not in k.columns:
        return linked
    replay = k.with_row_index("_k").filter(
        pl.col("launch_name").fill_null("").str.contains(GRAPH_LAUNCH_RE) & (pl.col("kind") == "compute")
    )
    if replay.height and linked.ops.height:  # a replay under a matmul op is that op's work: left to it
        ops = linked.ops
        counted = nearest(ops["parent"].to_numpy(), has_formula(ops["name"], ops["matmul_hint"]))
        row = replay["op_row"].fill_null(-1).to_numpy()
        replay = replay.filter(pl.Series(np.where(row >= 0, counted[np.maximum(row, 0)], -1) < 0))
    if replay.height == 0:
        return linked
    if captured.height == 0:
        _warn_unmatched(replay, warnings, "no capture of these graphs was given")
        return linked
    named, anonymous = captured.filter(pl.col("kernel") != ""), captured.filter(pl.col("kernel") == "")
    matched, ambiguous, rest = _match(replay.with_columns(mkey=pl.col("name")), named)
    if rest.height and anonymous.height:
        # Captures whose launches do not name their kernels: a replay on one stream runs them in capture order.
        one_stream = rest.group_by("correlation").agg(pl.col("stream").n_unique() == 1).filter(pl.col("stream"))
        tried = rest.join(one_stream.select("correlation"), on="correlation", how="semi")
        got, amb2, _ = _match(tried.with_columns(mkey=pl.lit("")), anonymous)
        matched = pl.concat([matched, got], how="diagonal_relaxed")
        ambiguous = pl.concat([ambiguous, amb2])
        rest = rest.join(got.select("correlation").unique(), on="correlation", how="anti").join(
            amb2, on="correlation", how="anti"
        )
    if ambiguous.height:
        _warn_unmatched(
            replay.join(ambiguous, on="correlation", how="semi"),
            warnings,
            "their kernels match captures whose ops' shapes differ (graphs of several sizes)",
        )
        rest = rest.join(ambiguous, on="correlation", how="anti")
    if rest.height:
        _warn_unmatched(rest, warnings, "no captured graph holds the same kernels")
    if matched.height == 0:
        return linked
    hit = matched.join(captured.rename({"kernel": "mkey"}), on=["graph", "mkey", "occ"], how="left").filter(
        pl.col("op").is_not_null()
    )
    if hit.height == 0:
        return linked
    return _with_replayed_ops(linked, hit, captures.below, warnings)


def _with_replayed_ops(linked: Linked, hit: pl.DataFrame, below: pl.DataFrame, warnings: Warnings) -> Linked:
    """One op per (replay, captured op), with copies of the ops below it, appended to the linked ops; the replayed
    kernels point at it. Copies are nested as captured, at the replay's launch instant (they took no host time)."""
    ops = linked.ops
    n = ops.height
    roots = hit.group_by("correlation", "op", maintain_order=True).agg(
        ts=pl.col("launch_ts").first(),
        tid=pl.col("launch_tid").first(),
        outer=pl.col("op_row").first(),
        **{f"op_{c}": pl.col(f"op_{c}").first() for c in OP_FIELDS},
    )
    # Every node: the root (sub = op, up = null) and the copies below it, numbered root first, then in capture order.
    nodes = pl.concat(
        [
            roots.select(
                "correlation",
                "op",
                pl.col("op").alias("sub"),
                pl.lit(None, pl.Int64).alias("up"),
                pl.lit(-np.inf).alias("order"),
                *[f"op_{c}" for c in OP_FIELDS],
            ),
            roots.select("correlation", "op")
            .join(below, on="op")
            .select("correlation", "op", "sub", "up", pl.col("ts").alias("order"), *[f"op_{c}" for c in OP_FIELDS]),
        ],
        how="vertical_relaxed",
    ).sort("correlation", "op", "order", "sub", maintain_order=True)
    nodes = nodes.join(
        roots.select("correlation", "op", "ts", "tid", "outer"),
        on=["correlation", "op"],
        how="left",
        maintain_order="left",
    ).with_columns(row=pl.int_range(n, n + pl.len(), dtype=pl.Int64))
    ups = nodes.select("correlation", "op", pl.col("sub").alias("up"), pl.col("row").alias("up_row"))
    nodes = nodes.join(ups, on=["correlation", "op", "up"], how="left", maintain_order="left")
    parent = nodes.select(pl.coalesce("up_row", "outer").fill_null(-1))[:, 0].to_numpy()
    depth = _depths(ops["depth"].to_numpy() if n else np.zeros(0, dtype=np.int64), parent, n)
    pid = np.full(nodes.height, None, dtype=object)
    outer = nodes["outer"].fill_null(-1).to_numpy()
    if n and (outer >= 0).any():
        pid[outer >= 0] = ops["pid"].gather(outer[outer >= 0]).to_numpy()
    first_id = int(ops["op_id"].max() or 0) + 1 if n else 0  # type: ignore[arg-type]  # polars' stub
    rows = pl.DataFrame(
        {
            "op_id": pl.int_range(first_id, first_id + nodes.height, dtype=pl.Int64, eager=True),
            "cat": pl.Series(["cpu_op"] * nodes.height, dtype=pl.Utf8),
            "pid": pl.Series(pid.tolist(), dtype=pl.Utf8),
            "tid": nodes["tid"],
            "ts": nodes["ts"],
            "dur": pl.Series(np.zeros(nodes.height)),
            **{c: nodes[f"op_{c}"] for c in OP_FIELDS},
            "row": nodes["row"],
            "parent": pl.Series(parent, dtype=pl.Int64),
            "depth": pl.Series(depth, dtype=pl.Int64),
        }
    )
    ops = pl.concat(
        [
            ops,
            rows.with_columns([pl.lit(None, ops.schema[c]).alias(c) for c in ops.columns if c not in rows.columns])
            .select(ops.columns)
            .cast(ops.schema),
        ],
        how="vertical",
    )
    ops = ops.with_columns(replayed=pl.int_range(ops.height, dtype=pl.Int64) >= n)  # not events of the file (annotate)
    at_root = nodes.filter(pl.col("up").is_null()).select("correlation", "op", "row")
    where = hit.join(at_root, on=["correlation", "op"]).select("_k", "row")
    op_row = linked.kernels["op_row"].cast(pl.Int64).fill_null(-1).to_numpy().copy()
    op_row[where["_k"].to_numpy()] = where["row"].to_numpy()
    captured = np.zeros(len(op_row), dtype=bool)
    captured[where["_k"].to_numpy()] = True
    kernels = linked.kernels.with_columns(
        op_row=pl.when(pl.Series(op_row) >= 0).then(pl.Series(op_row)), from_capture=pl.Series(captured)
    )
    warnings.add(
        "kernels replayed from CUDA/HIP graphs, attributed to the captured ops that recorded them", where.height
    )
    return Linked(ops=ops, kernels=kernels, launches=linked.launches)


def _depths(depth: np.ndarray, parent: np.ndarray, n: int) -> np.ndarray:
    """Depths of appended rows (numbered from n): one more than their parent's, resolved level by level."""
    out = np.full(len(parent), -1, dtype=np.int64)
    out[parent < 0] = 0
    old = (parent >= 0) & (parent < n)
    out[old] = depth[parent[old]] + 1
    todo = np.flatnonzero(out < 0)
    while len(todo):  # as many rounds as the captured ops nest
        up = out[parent[todo] - n]
        ready = up >= 0
        if not ready.any():
            raise ValueError("appended ops nest in a cycle; this is a bug in traceflops.stages.replays")
        out[todo[ready]] = up[ready] + 1
        todo = todo[~ready]
    return out


def _warn_unmatched(replay: pl.DataFrame, warnings: Warnings, why: str) -> None:
    if replay.height == 0:
        return
    ms = float(replay["dur"].sum()) / 1e3
    warnings.add(
        f"kernels replayed from {replay['correlation'].n_unique()} CUDA/HIP graph launch(es) ({ms:.2f} ms) have "
        f"no op: {why}; their matmul kernels are told by name with unknown FLOPs. To count them, {HOW_TO_CAPTURE}",
        replay.height,
    )
