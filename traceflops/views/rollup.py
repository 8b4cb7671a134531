"""Roll-ups of device time and FLOPs: per kernel name, and per model module.

Pure functions of the `Analysis` frames (`kernels`: name, cls, dur, flops,
phase, op_row; `ops`: row, parent, name, cat, seq, phase). Times are summed
kernel durations in µs (kernels on concurrent streams each count in full).

A kernel's module (`module_of`), first rule that applies:

1. 'annotation': the nearest enclosing op (of the launching op, itself
   included) that names a module: `nn.Module: X` (profile(with_modules=True))
   or a user annotation (`record_function`), except the step and optimizer
   markers (`ProfilerStep#N`, `Optimizer.*`). A recomputed forward re-runs its
   annotations, so recompute kernels find their module this way.
2. 'forward_seq': a backward op with no such annotation (the autograd thread
   runs outside the forward's nesting) takes the module of the forward (or
   recomputed) op whose sequence number its autograd node carries.
3. 'top_op': the outermost op below the step and optimizer markers
   (e.g. `aten::linear`, `autograd::engine::evaluate_function: MmBackward0`).

A kernel with no launching op has module null.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.trace import name_matches
from traceflops.core.vocab import PHASES, STEP_MARKER_RE
from traceflops.stages.link import nearest, row_index
from traceflops.stages.phases import node_names

MODULE_PREFIX = "nn.Module: "


def by_kernel(kernels: pl.DataFrame) -> pl.DataFrame:
    """Per kernel name: class, count, total/mean/median µs, share of kernel time, FLOPs, TFLOP/s, phases.

    `tflops` is the FLOPs over the time of the kernels whose FLOPs are known
    (`flops_known_us`); both null for a name with no known FLOPs.
    """
    total = kernels["dur"].sum() if kernels.height else 0.0
    known = pl.col("flops").is_not_null()
    out = (
        kernels.group_by("name")
        .agg(
            pl.col("cls").sort_by("dur", descending=True).first().alias("cls"),  # class of its longest kernel
            pl.len().alias("count"),
            pl.col("dur").sum().alias("total_us"),
            pl.col("dur").mean().alias("mean_us"),
            pl.col("dur").median().alias("median_us"),
            pl.when(known.any()).then(pl.col("flops").sum()).alias("flops"),
            pl.when(known.any()).then(pl.col("dur").filter(known).sum()).alias("flops_known_us"),
            pl.col("phase").drop_nulls().unique().sort().alias("phases"),
        )
        .with_columns(
            share=(pl.col("total_us") / total) if total else pl.lit(None, pl.Float64),
            tflops=pl.when(pl.col("flops_known_us") > 0).then(
                pl.col("flops") / (pl.col("flops_known_us") * 1e-6) / 1e12
            ),
        )
        .select(
            "name",
            "cls",
            "count",
            "total_us",
            "mean_us",
            "median_us",
            "share",
            "flops",
            "flops_known_us",
            "tflops",
            "phases",
        )
        .sort(["total_us", "name"], descending=[True, False])
    )
    return out


def launching_rows(kernels: pl.DataFrame) -> np.ndarray:
    """The op rows that launched kernels, ascending: the only ones whose module a kernel view names."""
    used = kernels["op_row"].drop_nulls().unique().sort()
    return used.filter(used >= 0).cast(pl.Int64).to_numpy()


def module_of(ops: pl.DataFrame, rows: np.ndarray | None = None) -> pl.DataFrame:
    """Per op row (all, or `rows`): `module` (name) and `module_source` ('annotation' | 'forward_seq' | 'top_op')."""
    n = ops.height
    if n == 0:
        return pl.DataFrame(schema={"row": pl.Int64, "module": pl.Utf8, "module_source": pl.Utf8})
    order = ops["row"].to_numpy()
    if not np.array_equal(order, np.arange(n)):
        ops = ops.sort("row")
        if not np.array_equal(ops["row"].to_numpy(), np.arange(n)):
            raise ValueError("ops rows must be 0..n-1 (the `row` index of link())")
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    parent = ops["parent"].to_numpy()
    names = ops["name"].fill_null("")
    cat = ops["cat"].fill_null("")
    annotation = (cat == "user_annotation").to_numpy()
    marker = annotation & name_matches(names, STEP_MARKER_RE).to_numpy()
    is_module = (names.str.starts_with(MODULE_PREFIX).to_numpy() | annotation) & ~marker
    top = ~marker & ((parent < 0) | marker[np.maximum(parent, 0)])
    seq = ops["seq"] if "seq" in ops.columns else pl.Series("seq", [None] * n, dtype=pl.Int64)
    phase = ops["phase"] if "phase" in ops.columns else pl.Series("phase", ["forward"] * n)
    is_node = ops["is_node"] if "is_node" in ops.columns else node_names(ops["name"]) != ""

    # Each rule climbs from the rows it is asked for only (the ops that launched kernels: a third of them), to an op
    # row (-1: none); the names are gathered once, for the rule that applies (strings carried through the join and
    # the coalesce were half of this).
    # the op that created the autograd node: a forward op, or a recomputed one (reentrant checkpoint)
    maybe = np.flatnonzero((phase.is_in(["forward", "recompute"]) & seq.is_not_null()).to_numpy())
    mod_of = nearest(parent, is_module, maybe)  # rule 1, for them
    creators, creator_mod = maybe[mod_of >= 0], mod_of[mod_of >= 0]
    fwd = pl.DataFrame({"_node_seq": seq.gather(creators), "_fwd": pl.Series(creator_mod, dtype=pl.Int64)}).unique(
        "_node_seq", keep="first", maintain_order=True
    )
    at_node = nearest(parent, (is_node & seq.is_not_null()).to_numpy(), rows)  # rule 2

    frame = pl.DataFrame(
        {
            "row": pl.Series(rows, dtype=pl.Int64),
            "_ann": row_index(nearest(parent, is_module, rows)),  # rule 1
            "_top": row_index(nearest(parent, top, rows)),  # rule 3
            "_node_seq": pl.select(
                pl.when(pl.Series(at_node >= 0)).then(seq.gather(np.maximum(at_node, 0)))
            ).to_series(),
        }
    )
    frame = frame.join(fwd, on="_node_seq", how="left", maintain_order="left")
    source = (
        pl.when(pl.col("_ann").is_not_null())
        .then(pl.lit("annotation"))
        .when(pl.col("_fwd").is_not_null())
        .then(pl.lit("forward_seq"))
        .when(pl.col("_top").is_not_null())
        .then(pl.lit("top_op"))
    )
    at = frame.select(pl.coalesce("_ann", "_fwd", "_top"))[:, 0]
    return frame.select("row", module=names.gather(at), module_source=source)


def by_module(ops: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """Per module: kernel time and FLOPs by phase, recompute share of its time.

    Columns: module, sources (how its kernels were attributed), kernels, time_us,
    share (of all kernel time), matmul_us, time_<phase> and flops_<phase> for each
    phase in PHASES, flops (executed, all phases), recompute_share
    (time_recompute / time_us). FLOPs are the kernels' `flops` (null-free sums:
    kernels with unknown FLOPs add nothing).
    """
    k = kernels.select("dur", "phase", "cls", pl.col("flops").cast(pl.Float64), pl.col("op_row").cast(pl.Int64))
    rows = launching_rows(k)
    mods = module_of(ops, rows)  # only the ops that launched kernels
    place = np.full(ops.height + 1, -1, dtype=np.int64)  # per op row, its place in `rows`; the last: no op
    place[rows] = np.arange(len(rows))
    op_row = k["op_row"].fill_null(-1).to_numpy()
    at = place[np.where((op_row >= 0) & (op_row < ops.height), op_row, ops.height)]
    k = k.with_columns(mods.drop("row").select(pl.all().gather(row_index(at))))  # no join: each kernel's place
    total = k["dur"].sum() if k.height else 0.0
    per_phase = []
    for p in PHASES:
        here = pl.col("phase") == p
        per_phase.append(pl.col("dur").filter(here).sum().alias(f"time_{p}"))
        per_phase.append(pl.col("flops").filter(here).sum().alias(f"flops_{p}"))
    out = (
        k.group_by("module")
        .agg(
            pl.col("module_source").drop_nulls().unique().sort().alias("sources"),
            pl.len().alias("kernels"),
            pl.col("dur").sum().alias("time_us"),
            pl.col("dur").filter(pl.col("cls") == "matmul").sum().alias("matmul_us"),
            pl.col("flops").sum().alias("flops"),
            *per_phase,
        )
        .with_columns(
            share=(pl.col("time_us") / total) if total else pl.lit(None, pl.Float64),
            recompute_share=pl.when(pl.col("time_us") > 0).then(pl.col("time_recompute") / pl.col("time_us")),
        )
    )
    cols = ["module", "sources", "kernels", "time_us", "share", "matmul_us"]
    cols += [f"time_{p}" for p in PHASES] + ["flops"] + [f"flops_{p}" for p in PHASES] + ["recompute_share"]
    return out.select(cols).sort(["time_us", "module"], descending=[True, False], nulls_last=True)
