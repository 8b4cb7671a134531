"""The rules that head a budget term of their own: communication (exposed collectives, by dimension where the
groups tell them apart) and recompute (activation-checkpoint recompute).

When their term is large enough, the loss-budget entry is their item with the budget's number as the headline
(`entries._from_finding`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.dtypes import COLLECTIVE_ITEMSIZE, collective_dtype_key
from traceflops.core.sections import AdviceItem
from traceflops.core.vocab import dimension_name, tells_dimensions_apart
from traceflops.views.advice.context import TOP, UNIT, Ctx, activities, is_jax
from traceflops.views.advice.items import item, time_by
from traceflops.views.advice.wording import DIMENSION_REMEDIES


def _coll_bytes(n, dtype) -> float | None:
    key = collective_dtype_key(dtype)
    size = None if key is None else COLLECTIVE_ITEMSIZE.get(key)
    return None if size is None or n is None else float(n) * size


def communication(ctx: Ctx) -> AdviceItem | None:
    exposed = ctx.time.get("communication_exposed", 0.0)
    if exposed <= 0:
        return None
    overlapped = ctx.time.get("communication_overlapped", 0.0)
    total = ctx.time.get("communication_total", 0.0)
    ev = [
        (
            f"{fmt.duration(exposed)} ({fmt.pct(ctx.share(exposed), keep_small=False)} of step time) of communication "
            "ran with no compute beside it; "
            f"{fmt.duration(overlapped)} of {fmt.duration(total)} "
            f"({fmt.pct(overlapped / total, keep_small=False) if total else '0%'}) overlapped compute"
        ),
    ]
    k = ctx.kernels.filter(pl.col("cls") == "communication")
    if (
        k.height == 0 and ctx.kernels.height == 0 and is_jax(ctx)
    ):  # XLA:CPU: its collective ops, as the partition took them
        k = activities(ctx).filter(pl.col("cls") == "communication")
    kinds = set()
    if k.height:
        coll = pl.coalesce(pl.col("collective"), pl.col("name")) if "collective" in k.columns else pl.col("name")
        per = time_by(
            k.with_columns(_c=coll),
            ["_c", "phase"],
            (pl.col("in_nelems").mean() if "in_nelems" in k.columns else pl.lit(None)).alias("elems"),
            (pl.col("coll_dtype").first() if "coll_dtype" in k.columns else pl.lit(None)).alias("dtype"),
            (pl.col("group_size").first() if "group_size" in k.columns else pl.lit(None)).alias("g"),
        )
        for r in per.head(TOP).iter_rows(named=True):
            kinds.add(str(r["_c"]).lower())
            size = _coll_bytes(r["elems"], r["dtype"])
            extra = (f", {fmt.nbytes(size)} per call" if size else "") + (f", group of {r['g']}" if r["g"] else "")
            ev.append(f"{fmt.named(r['_c'], 70, '?')} ({r['phase']}): {r['n']}×, {fmt.duration(r['t'])}{extra}")
    dims = _bydimension_name(ctx)
    title = "Communication is exposed: overlap it with compute"
    if dims is not None:
        top = dims.row(0, named=True)
        title = (
            f"Communication is exposed: {dimension_name(top['role'])} {top['kind']} in {top['phase']} "
            f"{fmt.pct(top['exposed_share'], keep_small=False)} of step time"
        )
        kinds |= set(dims["kind"].to_list())
        ev[0:0] = [
            f"{dimension_name(r['role'])} {r['kind']} in {r['phase']}: {fmt.pct(r['exposed_share'], keep_small=False)} "
            "of step "
            f"time exposed, {fmt.pct(r['overlapped_share'], keep_small=False)} hidden ({r['calls']} calls)"
            for r in dims.head(TOP).iter_rows(named=True)
        ]
    joined = " ".join(kinds)
    dp = []
    if "allreduce" in joined or "all_reduce" in joined:
        dp.append(
            "Bucketing (DDP): tune bucket_cap_mb so the first buckets' all-reduce starts early in backward and runs "
            "under the remaining backward compute; with gradient accumulation, skip the all-reduce on all but the "
            "last micro-batch (no_sync())"
        )
    if any(x in joined for x in ("allgather", "all_gather", "reducescatter", "reduce_scatter", "_allgather_base")):
        dp.append(
            "Prefetch (FSDP): forward_prefetch=True and backward_prefetch=BACKWARD_PRE (FSDP2: "
            "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), so the next all-gather runs "
            "under the current layer's compute"
        )
    if dims is None:
        remedies = dp
    else:  # each dimension's remedies, the most exposed dimension first
        order = list(dict.fromkeys(dims["role"].to_list()))
        remedies = [x for r in order for x in (dp if r in ("dp", "world") else [DIMENSION_REMEDIES.get(r)]) if x]
        remedies += [x for x in dp if x not in remedies]
    remedies.append(
        "Overlap: issue collectives asynchronously (async_op=True, or on a side stream) and wait only where the result "
        "is needed; nothing should synchronize right after a collective"
    )
    data: dict[str, Any] = {"exposed_us": exposed, "overlapped_us": overlapped, "total_us": total}
    if dims is not None:
        data["by_dimension"] = dims.select("role", "phase", "kind", "exposed_share", "overlapped_share").to_dicts()
    return item(ctx, "communication", title, exposed, ev, remedies, data)


def _bydimension_name(ctx: Ctx) -> pl.DataFrame | None:
    """The trace's communication by dimension with exposed time, when its groups tell dimensions apart."""
    d = getattr(ctx.a, "communication", None)
    if d is None or d.height == 0:
        return None
    if not tells_dimensions_apart(d["role"].to_list()):
        return None
    d = d.filter(pl.col("exposed_us") > 0)
    return d if d.height else None


def recompute(ctx: Ctx) -> AdviceItem | None:
    t = ctx.time.get("recompute", 0.0)
    if t <= 0:
        return None
    flops = float(ctx.steps["flops_recompute"].fill_null(0).sum()) if "flops_recompute" in ctx.steps.columns else 0.0
    executed = float(ctx.steps["flops_executed"].fill_null(0).sum()) if "flops_executed" in ctx.steps.columns else 0.0
    term = (ctx.budget or {}).get("recompute")
    what = "kernels" if ctx.kernels.height else "ops"
    ev = [
        f"recompute {what} ran {fmt.duration(t)} ({fmt.pct(ctx.share(t), keep_small=False)} of step time, as time)"
        + (
            f", redoing {flops / 1e9:.1f} GFLOP ({fmt.pct(flops / executed, keep_small=False)} of the executed matmul "
            "FLOPs)"
            if flops and executed
            else ""
        )
    ]
    if term is not None:
        ev.insert(
            0,
            f"the recomputed matmul FLOPs take {fmt.pct(term, keep_small=False)} {UNIT} (the loss budget's recompute "
            "term); "
            "the rest of the recompute time is counted in non_matmul and matmul_below_peak",
        )
    rk = ctx.kernels.filter(pl.col("phase") == "recompute")
    if rk.height:
        by = dict(rk.group_by("cls").agg(pl.col("dur").sum()).iter_rows())
        ev.append(
            f"of the recompute kernels' time: matmul {fmt.duration(by.get('matmul', 0.0))}, other compute "
            f"{fmt.duration(by.get('other_compute', 0.0))}"
        )
    bm = ctx.a.by_module
    if bm is not None and "time_recompute" in bm.columns:
        top = bm.filter(pl.col("time_recompute") > 0).sort("time_recompute", descending=True).head(3)
        for r in top.iter_rows(named=True):
            ev.append(
                f"module {fmt.named(r['module'], 70, '?')}: {fmt.duration(r['time_recompute'])} recomputed "
                f"({fmt.pct(r['recompute_share'] or 0.0, keep_small=False)} of its kernel time, all steps)"
            )
    remedies = [
        (
            "Selective activation checkpointing: save the outputs of the expensive ops (matmuls, convolutions, "
            "attention) "
            "and recompute only the cheap ones (torch.utils.checkpoint with create_selective_checkpoint_contexts, or "
            "your framework's checkpoint policy)"
        ),
        "Checkpoint fewer blocks (e.g. every other layer) where memory allows: the blocks left out cost no recompute",
    ]
    data = {"time_us": t, "time_share": ctx.share(t), "flops": flops, "executed_flops": executed}
    if term is None:  # no peak: the budget has no recompute term, so the headline is the recompute time
        return item(
            ctx,
            "recompute",
            "Recompute costs time: checkpoint selectively",
            t,
            ev,
            remedies,
            data,
            unit="of step time (recompute time: without a peak the loss budget has no recompute term)",
        )
    return item(ctx, "recompute", "Recompute costs time: checkpoint selectively", t, ev, remedies, data, share=term)
