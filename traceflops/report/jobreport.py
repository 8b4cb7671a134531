"""Job view renderers (many ranks): JSON and terminal. They format; they compute nothing."""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl
from rich.console import Console
from rich.table import Table

from traceflops.core import fmt
from traceflops.core.results import Job
from traceflops.report.jsonreport import SCHEMA
from traceflops.report.terminal import console as printable_console
from traceflops.report.terminal import text


def _rows(df: pl.DataFrame | None) -> list[dict[str, Any]]:
    return [] if df is None or df.height == 0 else df.to_dicts()


def to_dict(job: Job) -> dict[str, Any]:
    first = job.summaries[0] if job.summaries else None
    steps = []
    for s in job.summaries:
        for r in s.steps.iter_rows(named=True):
            steps.append({"rank": s.rank, **{k: v for k, v in r.items()}})
    return {
        "schema": SCHEMA,
        "inputs": [{"path": s.path, "format": None, "rank": s.rank, "device": (s.hardware or {}).get("name")} for s in job.summaries],
        "hardware": first.hardware if first else None,
        "model": first.model if first else None,
        "steps": steps,
        "job_steps": _rows(job.steps),
        "ranks": _rows(job.ranks),
        "collectives": _rows(job.collectives),
        "stragglers": _rows(job.stragglers),
        "pipeline": _rows(job.pipeline),
        "clock": job.clock,
        "outside_steps": None,
        "totals": job.totals,
        "warnings": job.warnings,
    }


def render_json(job: Job) -> str:
    return orjson.dumps(to_dict(job), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()


def render(job: Job, console: Console | None = None) -> None:
    c = console or printable_console()
    t = job.totals
    c.print(f"[bold]job of {text(t['world_size'])} ranks[/bold] ({len(job.summaries)} traces)")
    src = t.get("model_source")
    label = {"trace": "model FLOPs from the trace (forward + backward matmuls)", "flags": "model FLOPs from flags", "config": "model FLOPs from the config"}.get(src, "model FLOPs unknown")
    c.print(f"[bold]MFU {fmt.pct(t['mfu'])}   HFU {fmt.pct(t['hfu'])}[/bold]  ({label}; step time = slowest rank's; devices = world size)")
    ck = job.clock
    if ck.get("residual_skew_us") is not None:
        c.print(f"clocks aligned on {t['collectives_matched']} matched collectives; residual skew {ck['residual_skew_us']:.2f} us")
    c.print(f"collectives: arrival skew {t['arrival_skew_us'] / 1e3:.3f} ms, transfer {t['transfer_us'] / 1e3:.3f} ms")
    rt = Table(title="Ranks")
    for col in ("rank", "wall (ms)", "device MFU", "HFU", "matmul", "other", "comm exposed", "idle"):
        rt.add_column(col, justify="right")
    for r in job.ranks.iter_rows(named=True):
        rt.add_row(text(r["rank"]), f"{(r['wall_us'] or 0) / 1e3:.3f}", fmt.pct(r["device_mfu"]), fmt.pct(r["hfu"]),
                   *[f"{(r.get(f'time_{k}') or 0) / 1e3:.2f}" for k in ("matmul", "other_compute", "communication_exposed", "idle")])
    c.print(rt)
    if job.steps.height:
        jt = Table(title="Job steps (step time = the slowest rank's)")
        for col in ("step", "step time (ms)", "slowest rank", "ranks", "MFU", "HFU"):
            jt.add_column(col, justify="right")
        for r in job.steps.iter_rows(named=True):
            jt.add_row(text(r["step"]), f"{r['step_us'] / 1e3:.3f}", text(r["slowest_rank"]), text(r["ranks"]), fmt.pct(r["mfu"]), fmt.pct(r["hfu"]))
        c.print(jt)
    if job.collectives.height:
        ct = Table(title="Collectives (clock-aligned; longest arrival skew first)")
        for col in ("group", "#", "kind", "step", "ranks", "skew (us)", "transfer (us)", "last rank", "busbw (GB/s)"):
            ct.add_column(col, justify="right")
        for r in job.collectives.sort("arrival_skew_us", descending=True).head(12).iter_rows(named=True):
            bw = "—" if r.get("busbw_gbps") is None else f"{r['busbw_gbps']:.1f}"
            ct.add_row(text(r["pg"]), text(r["seq"]), text(r["kind"]), text(r["step"]), text(r["ranks"]),
                       f"{r['arrival_skew_us']:.1f}", f"{r['transfer_us']:.1f}", text(r["last_rank"]), bw)
        c.print(ct)
    if job.stragglers.height:
        st = Table(title="Stragglers (the rank others waited for)")
        for col in ("step", "rank", "others waited (ms)", "why"):
            st.add_column(col, justify="right")
        for r in job.stragglers.iter_rows(named=True):
            st.add_row(text(r["step"]), text(r["rank"]), f"{r['wait_us'] / 1e3:.3f}", text(r["reason"]))
        c.print(st)
    if job.pipeline is not None and job.pipeline.height and job.pipeline["ideal_bubble"][0] is not None:
        p = job.pipeline
        ideal = p["ideal_bubble"][0]
        c.print(f"pipeline: P2P time {fmt.pct(p['bubble'].mean())} of step time (ideal bubble {fmt.pct(ideal)})")
    for w in job.warnings:
        c.print(f"[yellow]warning:[/yellow] {text(w)}")
