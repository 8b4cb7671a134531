"""Job view renderers (many ranks): JSON and terminal. They format; they compute nothing."""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl
from msgspec import UNSET
from rich.console import Console
from rich.table import Table

from traceflops.core import fmt
from traceflops.core.contract import (
    PATH_PREFIX,
    CommunicationRow,
    InputRecord,
    JobReport,
    PipelineRow,
    collective_record,
    critical_path,
    rank_record,
    step_record,
)
from traceflops.core.results import Job
from traceflops.core.sections import encode, json_default
from traceflops.report.console import BAR, printable_console, text
from traceflops.report.jsonreport import SCHEMA
from traceflops.report.terminal import communication_table


def _rows(df: pl.DataFrame | None) -> list[dict[str, Any]]:
    return [] if df is None or df.height == 0 else df.to_dicts()


def report(job: Job) -> JobReport:
    """The job as the report contract types it (`core.contract.JobReport`)."""
    first = job.summaries[0] if job.summaries else None
    return JobReport(
        schema=SCHEMA,
        inputs=[
            InputRecord(path=s.path, format=None, rank=s.rank, device=s.hardware.name if s.hardware else None)
            for s in job.summaries
        ],
        hardware=first.hardware if first else None,
        model=first.model if first else None,
        steps=[step_record(r, s.rank) for s in job.summaries for r in s.steps.iter_rows(named=True)],
        job_steps=[
            {
                **{k: v for k, v in r.items() if not k.startswith(PATH_PREFIX)},
                "dur_us": r.get("step_us"),
                "critical_path_us": critical_path(r),
            }
            for r in _rows(job.steps)
        ],
        ranks=[
            rank_record(s.rank, s.path, s.totals) for s in sorted(job.summaries, key=lambda s: (s.rank is None, s.rank))
        ],
        collectives=[collective_record(r) for r in _rows(job.collectives)],
        stragglers=_rows(job.stragglers),
        advice=job.advice,
        pipeline=[PipelineRow(**r) for r in _rows(job.pipeline)],
        communication=[CommunicationRow(**r) for r in _rows(job.communication)] or None,
        communication_by_rank=[CommunicationRow(**r) for r in _rows(job.communication_by_rank)] or None,
        experts=_rows(job.experts) or None,
        clock=job.clock,
        outside_steps=None,
        totals=job.totals,
        warnings=job.warnings,
    )


def to_dict(job: Job) -> dict[str, Any]:
    """The job's JSON report as plain values: the typed report encoded."""
    return encode(report(job))


def render_json(job: Job) -> str:
    return orjson.dumps(
        to_dict(job), default=json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    ).decode()


def in_ms(us, digits: int = 3) -> str:
    """Microseconds as a bare number of ms for a table cell, `—` when unknown."""
    return fmt.NONE if us is None else f"{us / 1e3:.{digits}f}"


def render(job: Job, console: Console | None = None) -> None:
    c = console or printable_console()
    t = job.totals
    c.print(f"[bold]job of {text(t.world_size)} ranks[/bold] ({len(job.summaries)} traces)")
    label = {
        "trace": "model FLOPs from the trace (forward + backward matmuls)",
        "flags": "model FLOPs from flags",
        "config": "model FLOPs from the config",
    }.get(t.model_source or "", "model FLOPs unknown")
    c.print(
        f"[bold]MFU {fmt.pct(t.mfu)}   HFU {fmt.pct(t.hfu)}[/bold]  ({label}; step time = slowest rank's; devices = "
        "world size)"
    )
    ck = job.clock
    if ck.residual_skew_us is not None:
        c.print(
            f"clocks aligned on {t.collectives_matched} matched collectives; residual skew {ck.residual_skew_us:.2f} us"
        )
    c.print(f"collectives: arrival skew {t.arrival_skew_us / 1e3:.3f} ms, transfer {t.transfer_us / 1e3:.3f} ms")
    rt = Table(title="Ranks")
    for col in ("rank", "wall (ms)", "device MFU", "HFU", "matmul", "other", "comm\nexposed", "idle"):
        rt.add_column(col, justify="right", no_wrap=True)  # numbers are never cut
    for r in job.ranks.iter_rows(named=True):
        rt.add_row(
            text(r["rank"]),
            in_ms(r["wall_us"]),
            fmt.pct(r["device_mfu"]),
            fmt.pct(r["hfu"]),
            *[in_ms(r.get(f"time_{k}"), 2) for k in ("matmul", "other_compute", "communication_exposed", "idle")],
        )
    c.print(rt)
    if job.steps.height:
        jt = Table(title="Job steps (step time = the slowest rank's)")
        for col in ("step", "step time (ms)", "slowest rank", "ranks", "MFU", "HFU"):
            jt.add_column(col, justify="right", no_wrap=True)  # numbers are never cut
        for r in job.steps.iter_rows(named=True):
            jt.add_row(
                text(r["step"]),
                in_ms(r["step_us"]),
                text(r["slowest_rank"]),
                text(r["ranks"]),
                fmt.pct(r["mfu"]),
                fmt.pct(r["hfu"]),
            )
        c.print(jt)
    if job.collectives.height:
        ct = Table(title="Collectives (clock-aligned; longest arrival skew first)")
        roles = (
            "role" in job.collectives.columns and job.collectives["role"].is_not_null().any()
        )  # the group's mesh dimension
        for col in (
            "group",
            "#",
            *(("role",) if roles else ()),
            "kind",
            "step",
            "ranks",
            "skew\n(us)",
            "transfer\n(us)",
            "last\nrank",
            "busbw\n(GB/s)",
        ):
            ct.add_column(
                col, justify="right", no_wrap=col not in ("group", "role", "kind")
            )  # names give way on a narrow terminal, numbers never
        for r in job.collectives.sort("arrival_skew_us", descending=True).head(12).iter_rows(named=True):
            bw = "—" if r.get("busbw_gbps") is None else f"{r['busbw_gbps']:.1f}"
            ct.add_row(
                text(r["pg"]),
                text(r["seq"]),
                *((text(r.get("role")),) if roles else ()),
                text(r["kind"]),
                text(r["step"]),
                text(r["ranks"]),
                f"{r['arrival_skew_us']:.1f}",
                f"{r['transfer_us']:.1f}",
                text(r["last_rank"]),
                bw,
            )
        c.print(ct)
    if job.stragglers.height:
        st = Table(title="Stragglers (the rank others waited for)")
        for col in ("step", "rank", "others waited (ms)", "why"):
            st.add_column(col, justify="right", no_wrap=col != "why")
        for r in job.stragglers.iter_rows(named=True):
            st.add_row(text(r["step"]), text(r["rank"]), in_ms(r["wait_us"]), text(r["reason"]))
        c.print(st)
    if job.pipeline is not None and job.pipeline.height:
        pipeline_table(c, job.pipeline)
    communication_table(
        c, job.communication, "Communication by dimension and phase, all ranks (share of the ranks' step time)"
    )
    experts_table(c, job.experts)
    budget_table(c, job)
    job_advice_lines(c, job)
    advice_lines(c, job)
    for w in warning_lines(job):
        c.print(f"[yellow]warning:[/yellow] {text(w)}")


# One glyph per loss-budget term in the ranks' stacked bars (a legend names them); a term not listed draws no cells.
GLYPHS = {
    "mfu": "█",
    "extra_executed": "x",
    "recompute": "r",
    "matmul_below_peak": "▓",
    "matmul_flops_unknown": "?",
    "non_matmul": "▒",
    "memcpy_exposed": "m",
    "communication_exposed": "c",
    "idle": "░",
}


# Short column heads for the loss-budget terms (a narrow terminal keeps every number).
TERM_LABELS = {
    "mfu": "mfu",
    "extra_executed": "extra exec.",
    "recompute": "recompute",
    "attention_mask_credit": "mask credit",
    "matmul_below_peak": "below peak",
    "matmul_flops_unknown": "FLOPs unknown",
    "non_matmul": "non-matmul",
    "memcpy_exposed": "memcpy",
    "communication_exposed": "comm.",
    "idle": "idle",
}


def stacked_bar(budget: dict[str, Any]) -> str:
    """One rank's loss budget as a bar of `BAR` cells, a glyph per term (negative terms, credits, draw nothing)."""
    return "".join(GLYPHS.get(k, "") * round(v * BAR) for k, v in budget.items() if v and v > 0 and k in GLYPHS)


def budget_table(c: Console, job: Job) -> None:
    """Each rank's own loss budget (its totals' `loss_budget`, over its own wall), terms as columns and as one stacked
    bar."""
    budgets = {s.rank: s.totals.loss_budget for s in job.summaries}
    if not any(budgets.values()):
        return
    terms = [k for k in next(b for b in budgets.values() if b) if any((b or {}).get(k) for b in budgets.values())]
    bt = Table(title="Where each rank's peak x time went (its loss budget, sums to 100%)")
    bt.add_column("rank", justify="right", no_wrap=True)
    for k in terms:
        bt.add_column(TERM_LABELS.get(k, k), justify="right", no_wrap=True)
    bt.add_column("", overflow="crop")  # on a narrow terminal the bar gives way, never a number
    for r, b in budgets.items():
        b = b or {}
        bt.add_row(text(r), *[fmt.pct(b.get(k)) for k in terms], stacked_bar(b) if b else fmt.NONE)
    c.print(bt)
    c.print(
        "  [dim]bar: " + ", ".join(f"{g} {TERM_LABELS.get(k, k)}" for k, g in GLYPHS.items() if k in terms) + "[/dim]"
    )


def job_advice_lines(c: Console, job: Job) -> None:
    """The job's own items (scope "job": waits on a late rank, the pipeline bubble, expert imbalance), biggest first,
    their denominator said once: title, share, the job at the median rank's pace, evidence, remedies."""
    own = [x for x in job.advice if x.scope == "job"]
    if not own:
        return
    c.print(f"[bold]What to try for the job[/bold] (shares {text(own[0].unit)}, biggest first)")
    for i, x in enumerate(own, 1):
        c.print(f" {i}. [bold]{text(x.title)}[/bold]  {fmt.pct(x.share)}")
        if x.step_time_after_us is not UNSET and x.step_time_after_us is not None:
            mfu_after = None if x.mfu_after is UNSET else x.mfu_after
            step = None if x.step_time_us is UNSET else x.step_time_us
            c.print(
                f"    if the late ranks ran at the median rank's pace: MFU {fmt.pct(job.totals.mfu)} → ≤ "
                f"{fmt.pct(mfu_after)}, step time {fmt.duration(step)} → ≥ {fmt.duration(x.step_time_after_us)}"
            )
            if x.bound is not UNSET:
                c.print(f"    [dim]({text(x.bound)})[/dim]")
        for line in x.evidence:
            c.print(f"    {text(line)}")
        if x.remedies:
            c.print(f"    try: {text('; '.join(x.remedies))}")


def advice_lines(c: Console, job: Job) -> None:
    """The worst ranks' own top items (scope "rank"), biggest first, each title on the rank where it is largest, their
    denominator said once."""
    items = [x for x in job.advice if x.scope == "rank"]
    if not items:
        return
    c.print(f"[bold]What to try on the worst ranks[/bold] (shares {text(items[0].unit)}, biggest first)")
    for i, x in enumerate(items, 1):
        c.print(f" {i}. [bold]{text(x.title)}[/bold]  {fmt.pct(x.share)} on rank {text(x.rank)}")
        for line in x.evidence:
            c.print(f"    [dim]{text(line)}[/dim]")


def warning_lines(job: Job) -> list[str]:
    """The job's warnings once each (`Job.warning_groups`): a rank's warning said once for all the ranks that gave it
    (`ranks 0-7: ...`), repeats counted."""
    return [fmt.times(f"{fmt.ranks(rs)}: {w}" if rs else w, n) for w, rs, n in job.warning_groups]


def pipeline_table(c, p) -> None:
    """Per stage (rank) and step: the bubble it waited against the ideal, and its P2P matched with its peers'."""
    first = p.row(0, named=True)
    measured = "recv_blocked" in p["bubble_source"].to_list()
    how = (
        "stages {} and micro-batches {} ({}), ideal bubble (p-1)/(m+p-1) {}".format(
            text(first["stages"]),
            text(first["microbatches"]),
            text(first["stages_source"]),
            fmt.pct(first["ideal_bubble"]),
        )
        if first["ideal_bubble"] is not None
        else "stages and micro-batches unknown (--pipeline-stages, --microbatches)"
    )
    t = Table(title=f"Pipeline: {how}")
    cols = (
        "stage",
        "rank",
        "step",
        "blocked on recv (ms)" if measured else "P2P (ms)",
        "bubble",
        "ideal",
        "sends",
        "recvs",
        "matched",
        "fwd / bwd",
    )
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    for r in p.sort("stage", "rank", "step", nulls_last=True).iter_rows(named=True):
        t.add_row(
            text(r["stage"]),
            text(r["rank"]),
            text(r["step"]),
            in_ms(r["recv_blocked_us"] if r["bubble_source"] == "recv_blocked" else r["p2p_us"]),
            fmt.pct(r["bubble"]),
            fmt.pct(r["ideal_bubble"]),
            text(r["sends"]),
            text(r["recvs"]),
            text(r["matched"]),
            f"{text(r['forward_p2p'])} / {text(r['backward_p2p'])}",
        )
    c.print(t)


def experts_table(c: Console, t: pl.DataFrame | None) -> None:
    if t is None or t.height == 0:
        return
    et = Table(title="Experts per rank (per counted step; × = against its EP group's mean)")
    for col in ("rank", "EP group", "expert FLOPs", "×", "all-to-all", "×"):
        et.add_column(col, justify="right", no_wrap=True)
    x = lambda v: fmt.NONE if v is None else f"{v:.2f}"
    for r in t.iter_rows(named=True):
        et.add_row(
            text(r["rank"]),
            text(r["ep_group"]),
            fmt.si(r["expert_flops_per_step"], "FLOP") if r["expert_flops_per_step"] is not None else fmt.NONE,
            x(r["flops_vs_group_mean"]),
            fmt.nbytes(r["a2a_bytes_per_step"]) if r["a2a_bytes_per_step"] is not None else fmt.NONE,
            x(r["bytes_vs_group_mean"]),
        )
    c.print(et)
