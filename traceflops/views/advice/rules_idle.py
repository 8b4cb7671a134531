"""The rules of idle time: host_bound (gaps the host caused, launch bubbles), input_pipeline (a data loader over
the gap) and sync (a synchronising call over the gap).

Each reads the counted steps' idle gaps by reason and names what the host did over them; their items explain part
of the loss budget's idle term.
"""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
import polars as pl
from msgspec import UnsetType

from traceflops.core import fmt
from traceflops.core.sections import AdviceItem
from traceflops.core.trace import named_by
from traceflops.stages.idle import is_dataloader, sync_calls
from traceflops.views.advice.context import SHORT_KERNEL_US, Ctx
from traceflops.views.advice.items import item, time_by


def host_bound(ctx: Ctx) -> AdviceItem | None:
    if ctx.gaps is None:
        return None
    g = ctx.gaps.filter(pl.col("reason").is_in(["host_bound", "launch_gap"]))
    if g.height == 0:
        return None
    hb = g.filter(pl.col("reason") == "host_bound")
    lg = g.filter(pl.col("reason") == "launch_gap")
    total = float(g["dur"].sum())
    hb_us, lg_us = float(hb["dur"].sum()), float(lg["dur"].sum())
    ev = []
    if hb.height:
        worst = hb.row(int(hb["dur"].arg_max() or 0), named=True)  # the first of the longest (no sort of every gap)
        ev.append(
            f"{hb.height} idle gaps where the device waited for the host to launch the next kernel: "
            f"{fmt.duration(hb_us)} ({fmt.pct(ctx.share(hb_us), keep_small=False)} of step time), "
            f"longest {fmt.duration(worst['dur'])} "
            f"before {fmt.named(worst['next_kernel'], 70, '?')}"
        )
    if lg.height:
        ev.append(
            f"{lg.height} bubbles between kernels already queued: {fmt.duration(lg_us)} "
            f"({fmt.pct(ctx.share(lg_us), keep_small=False)}), "
            f"median {fmt.duration(lg['dur'].median())}"  # type: ignore[arg-type]  # polars stubs: a float column's median
        )
    data: dict[str, Any] = {
        "host_bound_us": hb_us,
        "launch_gap_us": lg_us,
        "host_bound_gaps": hb.height,
        "launch_gaps": lg.height,
    }
    title = "The device waits for kernel launches (host-bound)"
    path = ctx.a.path_summary
    if path is not None and path.available:
        # The verdict rests on the critical path: only host time on the chain that bounded the step can be recovered.
        assert not isinstance(path.us, UnsetType) and not isinstance(path.top, UnsetType)  # an available path has both
        host, launch = path.us["host"], path.us["launch"]
        assert host is not None and launch is not None  # an available path's times by kind are all known
        on_host = float(host + launch)
        share = ctx.share(on_host)
        top = next((t for t in path.top if t.kind in ("host", "launch")), None)
        ev.insert(
            0,
            f"critical path: the host and its launches bounded {fmt.pct(share, keep_small=False)} of the step"
            + (f" (longest: {fmt.named(top.name, 60)}, {fmt.duration(top.us)})" if top else ""),
        )
        data["critical_path_host_us"] = on_host
        total = min(total, on_host)
        title = (
            "The host bounds the step (critical path): the device waits for launches"
            if share >= 0.5
            else "Idle gaps wait for the host, but the device bounds the step (critical path)"
        )
    many_short = False
    if "launch_kernels" in ctx.steps.columns and ctx.steps["launch_kernels"].null_count() < ctx.steps.height:
        # polars stubs type a column's mean and median as any literal; these are float columns
        per_step = float(ctx.steps["launch_kernels"].mean())  # type: ignore[arg-type]
        med = cast(float | None, ctx.steps["launch_median_kernel_us"].median())
        delay = cast(float | None, ctx.steps["launch_median_delay_us"].median())
        many_short = med is not None and med < SHORT_KERNEL_US
        line = f"{per_step:.0f} kernels per step"
        if med is not None:
            line += f", median kernel {fmt.duration(med)}"
        if delay is not None:
            line += f", median launch-to-start delay {fmt.duration(delay)}"
        if many_short:
            line += ": many short kernels, each paying a launch"
        ev.append(line)
        data.update(kernels_per_step=per_step, median_kernel_us=med, median_launch_delay_us=delay)
    remedies = [
        (
            'Capture the step\'s steady part in a CUDA/HIP graph (torch.compile(mode="reduce-overhead"), or '
            "torch.cuda.graph): one launch replaces one per kernel"
        ),
        "torch.compile the model: it fuses small kernels, so fewer launches and less host work per step",
        "A larger batch per step: the same launches, each doing more work",
    ]
    if not many_short:
        remedies = [remedies[1], remedies[0], remedies[2]]
    return item(ctx, "host_bound", title, total, ev, remedies, data)


def _gap_item(ctx: Ctx, reason: str) -> tuple[pl.DataFrame, list[str]] | None:
    if ctx.gaps is None:
        return None
    g = ctx.gaps.filter(pl.col("reason") == reason)
    if g.height == 0:
        return None
    worst = float(g["dur"].max())  # type: ignore[arg-type]  # polars stubs: a float column's max is a float
    total = float(g["dur"].sum())
    return g, [
        (
            f"{g.height} idle gaps, {fmt.duration(total)} "
            f"({fmt.pct(ctx.share(total), keep_small=False)} of step time), "
            f"longest {fmt.duration(worst)}"
        )
    ]


def _overlapping(frame: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """Rows of `frame` (ts, dur) that share time with any gap."""
    if frame.height == 0 or gaps.height == 0:
        return frame.head(0)
    gs = gaps["start"].to_numpy()
    ge = gs + gaps["dur"].to_numpy()
    o = np.argsort(gs)
    gs, ge = gs[o], np.maximum.accumulate(ge[o])
    s = frame["ts"].cast(pl.Float64).to_numpy()
    e = s + frame["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    j = np.searchsorted(gs, e, side="left") - 1
    hit = (j >= 0) & (ge[np.maximum(j, 0)] > s)
    return frame.filter(pl.Series(hit))


def input_pipeline(ctx: Ctx) -> AdviceItem | None:
    got = _gap_item(ctx, "input_pipeline")
    if got is None:
        return None
    g, ev = got
    loaders = _overlapping(ctx.a.ops.filter(named_by(ctx.a.ops["name"], is_dataloader)), g)
    single = False
    if loaders.height:
        per = time_by(loaders, "name")
        for r in per.head(3).iter_rows(named=True):
            ev.append(f"{fmt.named(r['name'], 70, '?')}: {r['n']}× over the gaps, {fmt.duration(r['t'])} on the host")
        single = loaders["name"].str.contains("SingleProcess").any()
    if single:
        ev.append("the loader runs in the training process (num_workers=0)")
    remedies = [
        (
            "DataLoader(num_workers=N > 0, persistent_workers=True, prefetch_factor=2 or more): batches are prepared "
            "while the device computes"
        ),
        "pin_memory=True with .to(device, non_blocking=True): the copy does not block the host",
        "Move decoding and augmentation to the device, or pre-process the data set offline",
    ]
    if not single:
        remedies[0] = "More DataLoader workers or a larger prefetch_factor: the workers do not keep up with the device"
    return item(
        ctx,
        "input_pipeline",
        "The device waits for the data loader",
        float(g["dur"].sum()),
        ev,
        remedies,
        {"gaps": g.height, "time_us": float(g["dur"].sum()), "single_process": bool(single)},
    )


def _enclosing(ops: pl.DataFrame, calls: pl.DataFrame) -> list[str]:
    """Name of the innermost cpu op on the caller's thread that encloses each call (none: left out).

    The last op on the thread to start at or before the call, then up its
    parents to the first that is still running.
    """
    found: list[int] = []
    if calls.height == 0 or ops.height == 0:
        return []
    ops = ops.sort("row")
    tid = ops["tid"]  # compared in polars, per thread asked: an object array of every op's thread cost 30 ms at 587 k
    ts = ops["ts"].cast(pl.Float64).to_numpy()
    end = ts + ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    parent = ops["parent"].to_numpy()
    is_op = (ops["cat"] == "cpu_op").fill_null(False).to_numpy() if "cat" in ops.columns else np.ones(ops.height, bool)
    per_tid: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    for t, at in calls.select("tid", pl.col("ts").cast(pl.Float64)).iter_rows():
        if t not in per_tid:
            rows_t = np.flatnonzero(tid.eq_missing(t).to_numpy())
            rows_t = rows_t[np.argsort(ts[rows_t], kind="stable")]
            per_tid[t] = (rows_t, ts[rows_t])
        rows_t, ts_t = per_tid[t]
        i = np.searchsorted(ts_t, at, side="right") - 1
        r = rows_t[i] if i >= 0 else -1
        while r >= 0 and (end[r] < at or not is_op[r]):  # running, and an op (not a step marker)
            r = parent[r]
        if r >= 0:
            found.append(int(r))
    return ops["name"].gather(found).to_list()  # a few names, not a Python string per op


def sync(ctx: Ctx) -> AdviceItem | None:
    got = _gap_item(ctx, "sync")
    if got is None:
        return None
    g, ev = got
    launches = ctx.a.trace.launches
    calls = _overlapping(launches.filter(sync_calls(launches["name"])), g) if launches is not None else None
    callers: list[str] = []
    if calls is not None and calls.height:
        per = time_by(calls, "name")
        ev.append(
            "synchronizing calls over the gaps: "
            + ", ".join(f"{r['name']} {r['n']}× ({fmt.duration(r['t'])})" for r in per.head(3).iter_rows(named=True))
        )
        callers = _enclosing(ctx.a.ops, calls)
        if callers:
            top = pl.Series(callers).value_counts(sort=True).head(3)
            ev.append("made by: " + ", ".join(f"{n} ({c}×)" for n, c in top.iter_rows()))
    text = " ".join(callers + (calls["name"].to_list() if calls is not None and calls.height else []))
    remedies = []
    if re.search(r"item|_local_scalar_dense|is_nonzero|tolist", text) or not text:
        remedies.append(
            "Drop .item() / .cpu() / .tolist() / print(tensor) inside the step: log every N steps, or "
            "accumulate the metric on the device"
        )
    if re.search(r"nonzero|masked_select|index|unique", text):
        remedies.append(
            "Data-dependent shapes (nonzero, boolean-mask indexing, unique) wait for the device: use "
            "fixed-shape ops (torch.where, masked arithmetic)"
        )
    if re.search(r"Memcpy|copy_|aten::to\b|_to_copy", text):
        remedies.append(
            "Blocking copies: copy from pinned memory with non_blocking=True, and read results back "
            "once per step at most"
        )
    if re.search(r"DeviceSynchronize|StreamSynchronize|EventSynchronize", text):
        remedies.append(
            "Remove explicit torch.cuda.synchronize() / event.synchronize() from the training loop "
            "(keep them for timing runs only)"
        )
    if not remedies:
        remedies.append("Find the host call that waits for the device (the callers above) and move it out of the step")
    return item(
        ctx,
        "sync",
        "Host-device synchronisations stall the device",
        float(g["dur"].sum()),
        ev,
        remedies,
        {"gaps": g.height, "time_us": float(g["dur"].sum()), "callers": callers[:20]},
    )
