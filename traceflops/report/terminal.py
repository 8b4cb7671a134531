"""Terminal report of one trace (rich): its sections in order, each laid out by `report.console` (tables that read at
any width, text from a trace made printable).
"""

from __future__ import annotations

from typing import Any

from msgspec import UnsetType
from rich.console import Console

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.sections import AdviceItem, PathSummary, StepStats, Totals, WhatIf
from traceflops.core.vocab import (
    HEADLINE_WARNINGS,
    OUTLIER_RULES,
    PHASES,
    dimension_name,
    tells_dimensions_apart,
)
from traceflops.report import present
from traceflops.report.console import Col, grid, printable_console, text

# What an MFU band says, in one line (the bands are `flops.model.verdict_band`'s). Dense training only: `band_caveat`
# says where the bands do not apply.
BAND_MEANING = {
    "likely broken": "under 20% MFU: for dense training something large is wrong or missing (host-bound steps, small "
    "batches, "
    "fp32 matmuls, unfused kernels, or a wrong peak): the loss budget and what to try below say where the time went",
    "room to improve": "20-35% MFU: typical of an untuned dense training run: the largest items of what to try below "
    "are the levers",
    "good": "35-55% MFU: a well-tuned dense training run",
    "excellent": "55-75% MFU: about the best dense training reaches on current accelerators",
    "exceptional": "over 75% MFU: rare: check the peak, the FLOPs and the device count before trusting it",
}


def flops_cell(v, ops: int, unknown: int, known: bool = True) -> str:
    """A FLOP count, or `—` where it is unknown: none known in the trace, or a phase with matmuls that counted none
    while some have unknown FLOPs."""
    if not known or (not v and ops and unknown):
        return fmt.NONE
    return fmt.flops(v)


def render(a: Analysis, console: Console | None = None, critical_path: PathSummary | None = None) -> None:
    """The single-trace report.

    `critical_path` is `views.path_summary.path_summary(a)` (a renderer imports no view): given by the caller, else the
    Analysis' own `path_summary`; with neither, the section is left out.
    """
    c = console or printable_console()
    known = a.totals.flops_known  # decided once, in the totals (metrics.utilization.flops_unknown)
    header(c, a)
    phase_table(c, a, known)
    budget_table(c, a)
    what_if_lines(c, a.what_if)
    time_lines(c, a)
    steps_table(c, a, known)
    kernels_table(c, a)
    modules_table(c, a)
    communication_table(c, a.communication)
    if a.outside_steps is not None:
        o = a.outside_steps
        c.print(f"outside steps: {o.kernels} device activities, {fmt.duration(o.device_us)}")
    ps = critical_path if critical_path is not None else a.path_summary
    if ps is not None:
        critical_path_section(c, ps)
    advice_lines(c, a.advice, a.totals.mfu)
    step_flag_lines(c, a)
    warning_lines(c, a.warnings)


def header(c: Console, a: Analysis) -> None:
    t = a.totals
    hw = a.hardware
    c.print(f"[bold]{text(a.meta.get('path'))}[/bold]  ({text(a.meta.get('format'))}, rank {text(a.meta.get('rank'))})")
    for w in a.warnings:
        if w.startswith(HEADLINE_WARNINGS):  # what the trace cannot say at all: before any number
            c.print(f"[bold yellow]warning:[/bold yellow] {text(w)}")
    if hw is not None:
        c.print(
            f"hardware: {text(hw.name)}, dense {text(hw.precision)} peak {fmt.si(hw.peak_flops, 'FLOP/s')} "
            "[dim](source in --format json)[/dim]"
        )
    else:
        c.print("hardware: unknown (give --hardware or --peak-tflops)")
    m = a.model
    source, mode = (m.source, m.mode) if m is not None else (None, None)
    low = t.flops_lower_bound
    mfu_low = "≥ " if low and source == "trace" and t.mfu is not None else ""
    hfu_low = "≥ " if low and t.hfu is not None else ""
    c.print(
        f"[bold]MFU {mfu_low}{fmt.pct(t.mfu)}[/bold] (no attention {fmt.pct(t.mfu_no_attention)})   "
        f"[bold]HFU {hfu_low}{fmt.pct(t.hfu)}[/bold]   model FLOPs: {text(source)}, {text(mode)}"
    )
    if m is not None and present(m.above_executed) is not None:  # what cannot be right, and why (metrics.model_section)
        c.print(f"[bold yellow]flag:[/bold yellow] {text(m.above_executed)}")
    if t.loss_budget_unknown:  # the known terms do not reach 100%
        c.print(
            f"[bold yellow]flag:[/bold yellow] [yellow]{text(fmt.budget_unknown_words(t.loss_budget_unknown))}[/yellow]"
        )
    if low:
        unknown_lines(c, t)
    if m is not None and present(m.seq_len) is not None:
        c.print(
            f"model: T = {text(m.seq_len)} (from the {text(present(m.seq_len_source))}), "
            f"{fmt.si(present(m.tokens_per_step))} "
            f"tokens per step ({text(present(m.tokens_source))}), {fmt.si(present(m.flops_per_token), 'FLOP')} per "
            "token"
        )
        for note in m.notes or []:
            c.print(f"  [dim]{text(note)}[/dim]")
    if t.mfu_by_precision:
        c.print(
            "MFU by peak: "
            + ", ".join(f"{text(p)} {fmt.pct(v)}" for p, v in t.mfu_by_precision.items())
            + text(fmt.precision_words(t.mfu_by_precision))
        )
    if m is not None and m.band:
        c.print(f"band: {text(m.band)}  [dim](dense training only; not for inference, small or MoE models)[/dim]")
        meaning = BAND_MEANING.get(m.band)
        if meaning:
            c.print(f"  {text(meaning)}")
    devices = (hw.devices if hw is not None else None) or 1
    on = f" on {devices} devices (time per device)" if devices > 1 else ""
    c.print(
        f"wall {fmt.duration(t.wall_us)} over {steps_counted(a)}{on}; FLOPs known for {fmt.pct(t.flops_coverage)} of "
        "matmul time"
    )


def steps_counted(a: Analysis) -> str:
    """'N step(s)', or 'N of M steps' when some are left out of the totals (asked, cut, or the unbounded last)."""
    sc = a.totals.step_count
    counted, have = sc.counted, sc.in_trace
    return (
        f"{counted} step(s)"
        if counted == have
        else f"{counted} of {have} steps (the others shown, left out of the totals)"
    )


def unknown_lines(c: Console, t: Totals) -> None:
    """Part of the matmul work has unknown FLOPs: say it in the headline, with the largest such kernels and why."""
    c.print(
        f"[bold yellow]FLOPs known for only {fmt.pct(t.flops_coverage)} of matmul time: {fmt.bound_words(t)}"
        "[/bold yellow]; largest matmul kernels with unknown FLOPs:"
    )
    for k in t.unknown_matmul_kernels:
        if c.is_terminal:
            c.print(f"  {fmt.duration(k.time_us)} in {k.count} x {text(fmt.kernel_short(k.name), 80)}: {text(k.why)}")
        else:  # the whole name on a line of its own
            c.print(f"  {fmt.duration(k.time_us)} in {k.count} x: {text(k.why)}")
            c.print(f"    {text(k.name)}", soft_wrap=True, overflow="ignore", crop=False)


def phase_table(c: Console, a: Analysis, known: bool) -> None:
    t = a.totals
    unknown = t.matmul_flops_unknown_count
    rows = [[p, str(t.matmul_count[p]), flops_cell(t.flops[p], t.matmul_count[p], unknown, known)] for p in PHASES]
    ops = sum(t.matmul_count.values())
    rows.append(["executed", str(ops), flops_cell(t.flops["executed"], ops, unknown, known)])
    grid(c, "Matmul FLOPs by phase", [Col("phase", kind="label"), Col("matmul ops", "ops"), Col("FLOPs")], rows)
    if unknown:
        c.print(f"{unknown} matmul ops have unknown FLOPs: counted above as ops, not as FLOPs ({fmt.NONE} = unknown)")


def budget_table(c: Console, a: Analysis) -> None:
    lb = a.totals.loss_budget
    if not lb:
        return
    unknown = a.totals.loss_budget_unknown
    title = (
        "Where peak x time went (loss budget, sums to 100%)"
        if not unknown
        else f"Where peak x time went (loss budget; the unknown terms hold {fmt.pct(unknown['share'])}, see above)"
    )
    rows = [[k, fmt.pct(v), v] for k, v in lb.items()]
    grid(c, title, [Col("term", kind="label"), Col("share"), Col("", kind="bar")], rows)
    m = a.model
    if m is not None and present(m.above_executed) is not None and (lb.get("extra_executed") or 0) < 0:
        c.print(f"  [yellow]extra_executed {fmt.pct(lb.get('extra_executed'))} < 0:[/yellow] {text(m.above_executed)}")


def time_lines(c: Console, a: Analysis) -> None:
    t = a.totals
    tu = t.time_us
    if tu:
        c.print("device time: " + ", ".join(f"{text(k)} {fmt.duration(v)}" for k, v in tu.items()))
    ir = t.idle_us_by_reason
    if ir and any(ir.values()):
        c.print("idle by reason: " + ", ".join(f"{text(k)} {fmt.duration(v)}" for k, v in ir.items() if v))


def start_ms(start, first) -> str:
    """A step's start in ms after the trace's first step start."""
    return fmt.NONE if start is None or first is None else f"{(start - first) / 1e3:.3f}"


def steps_table(c: Console, a: Analysis, known: bool) -> None:
    first = a.steps["start"].min() if a.steps.height else None
    left_out = set(a.totals.step_count.excluded)
    rows = []
    for s in a.steps.iter_rows(named=True):
        unknown = s.get("flops_unknown_count") or 0
        step_known = known and s["flops_known"]
        rows.append(
            [
                # a step name is never cut: it is what --exclude-step and the trace call it
                fmt.printable(s["name"]) + (" (last)" if s["last"] else ""),
                start_ms(s["start"], first),
                fmt.NONE if s["window"] is None else f"{s['window'] / 1e3:.3f}",
                flops_cell(s["flops_executed"], 1, unknown, step_known),
                flops_cell(s["flops_recompute"], s.get("count_recompute") or 0, unknown, step_known),
                fmt.pct(s["mfu"]),
                fmt.pct(s["hfu"]),  # null where the step's FLOPs are unknown (metrics.utilization.step_metrics)
            ]
        )
    cols = [
        Col("step", kind="label"),
        Col("start (ms)", "start"),
        Col("dur (ms)", "dur"),
        Col("executed", "exec."),
        Col("recompute", "recomp."),
        Col("MFU"),
        Col("HFU"),
    ]
    grid(
        c,
        "Steps (start: ms after the first step's start)",
        cols,
        rows,
        short_title="Steps (start, dur: ms; start after the first step's start)",
    )
    out = [text(s["name"]) for s in a.steps.iter_rows(named=True) if s["step"] in left_out]
    if out:
        c.print(f"not in the totals: {', '.join(out)} (see the warnings)")


def kernels_table(c: Console, a: Analysis) -> None:
    if a.top_kernels is None or not a.top_kernels.height:
        return
    rows = []
    for r in a.top_kernels.head(8).iter_rows(named=True):
        rec = r["recoverable_us"] if r.get("known", 1) else None
        rows.append(
            [
                r["name"],
                r["cls"],
                r["bound"],
                str(r["count"]),
                f"{r['dur_us'] / 1e3:.3f}",
                fmt.NONE if rec is None else f"{rec / 1e3:.3f}",
            ]
        )
    cols = [
        Col("kernel", kind="name"),
        Col("class", kind="label"),
        Col("bound", kind="label"),
        Col("count"),
        Col("time (ms)", "time"),
        Col("recov. (ms)", "recov."),
    ]
    title = "Top recoverable kernels (duration - max(FLOPs/peak, bytes/bandwidth); — = FLOPs and bytes unknown)"
    grid(c, title, cols, rows, short_title="Top recoverable kernels (ms; recov. = time above the roofline's floor)")


def communication_table(
    c: Console, rows, title: str = "Communication by dimension and phase (share of step time)"
) -> None:
    """Exposed and hidden communication per dimension, phase and kind, when the groups tell dimensions apart (a job
    on one group says no more than the time breakdown does)."""
    if rows is None or not rows.height:
        return
    if not tells_dimensions_apart(rows["role"].to_list()):
        return
    body = [
        [
            dimension_name(r["role"]),
            r["phase"],
            r["kind"],
            str(r["calls"]),
            f"{r['time_us'] / 1e3:.3f}",
            fmt.pct(r["exposed_share"]),
            fmt.pct(r["overlapped_share"]),
        ]
        for r in rows.head(12).iter_rows(named=True)
    ]
    cols = [
        Col("dimension", "dim.", kind="label"),
        Col("phase", kind="label"),
        Col("kind", kind="label"),
        Col("calls"),
        Col("time (ms)", "ms"),
        Col("exposed"),
        Col("hidden"),
    ]
    grid(c, title, cols, body)


def modules_table(c: Console, a: Analysis) -> None:
    if a.by_module is None or not a.by_module.height or not a.by_module["recompute_share"].max():
        return
    rows = [
        [r["module"], f"{r['time_us'] / 1e3:.3f}", fmt.pct(r["recompute_share"])]
        for r in a.by_module.sort("time_recompute", descending=True).head(8).iter_rows(named=True)
    ]
    cols = [Col("module", kind="name"), Col("time (ms)", "ms"), Col("recompute share", "recomp.")]
    grid(c, "Recompute by module", cols, rows)


def critical_path_section(c: Console, ps: PathSummary) -> None:
    """What bounded the steps: the path's shares by kind (summing to the steps' windows), its longest stretches, or why
    there is none."""
    title = "What bounded the steps (critical path)"
    if not ps.available:
        c.print(f"[bold]{title}[/bold]: none: {text(present(ps.why))}")
        return
    meaning = ps.meaning or {}
    assert not isinstance(ps.us, UnsetType) and not isinstance(ps.share, UnsetType)  # an available path has both
    rows = [
        [k, fmt.pct(ps.share.get(k), 2), fmt.duration(us), ps.share.get(k), meaning.get(k)] for k, us in ps.us.items()
    ]
    cols = [Col("kind", kind="label"), Col("share"), Col("time"), Col("", kind="bar"), Col("meaning", kind="prose")]
    grid(c, f"{title}, over {len(ps.steps or [])} step(s); shares sum to 100%", cols, rows)
    if ps.top:
        rows = [[s.name, s.kind, fmt.duration(s.us), str(s.segments)] for s in ps.top]
        cols = [Col("stretch", kind="name"), Col("kind", kind="label"), Col("time"), Col("segments", "segm.")]
        grid(c, "Longest stretches on the path", cols, rows)
    if ps.note:
        c.print(f"  [dim]{text(ps.note)}[/dim]")


def after_words(mfu, mfu_after, step_us, step_after_us) -> str:
    """ "MFU 31.0% → ≤ 44.0%, step 1.20 ms → ≥ 0.84 ms": a counterfactual as a bound (the numbers are the view's)."""
    parts = []
    if mfu is not None and mfu_after is not None:
        parts.append(f"MFU {fmt.pct(mfu)} → ≤ {fmt.pct(mfu_after)}")
    if step_after_us is not None:
        before = "" if step_us is None else f"{fmt.duration(step_us)} → "
        parts.append(f"step {before}≥ {fmt.duration(step_after_us)}")
    return ", ".join(parts) if parts else "cannot be bounded"


def what_if_lines(c: Console, what_if: list[WhatIf]) -> None:
    """What removing each loss would buy, at most: one line each, the bound's reason beneath."""
    if not what_if:
        return
    c.print("[bold]What removing each loss would buy, at most[/bold] (model FLOPs unchanged)")
    for w in what_if:
        c.print(f" {text(w.term)}: {after_words(w.mfu, w.mfu_after, w.step_time_us, w.step_time_after_us)} {w.title}")
        c.print(f"    [dim]{text(w.bound)}[/dim]")


def advice_lines(c: Console, advice: list[AdviceItem], mfu: float | None = None) -> None:
    if not advice:
        return
    c.print("[bold]What to try, by the step time it would recover[/bold]")
    for i, item in enumerate(advice[:6], 1):
        c.print(f" {i}. {text(item.title)}  [bold]{fmt.pct(item.recoverable)}[/bold]")
        if item.mfu_after is not None or item.step_time_after_us is not None:
            after = after_words(mfu, item.mfu_after, None, item.step_time_after_us)
            c.print(f"    if recovered: {after}" + (f" [dim]({text(item.bound)})[/dim]" if item.bound else ""))
        for ev in item.evidence[:2]:
            c.print(f"    [dim]{text(ev)}[/dim]")
        if item.remedies:
            c.print(f"    try: {text('; '.join(item.remedies[:3]))}")


def step_flags(ss: StepStats | None, names: dict[Any, str]) -> list[str]:
    """One line per flagged step, saying why: warm-up (a leading slow step), outlier (with its rules and what moved
    most), or both."""
    warm = {w.step: w for w in ss.warmup} if ss is not None else {}
    out = {o.step: o for o in ss.outliers} if ss is not None else {}
    lines = []
    for step in sorted(set(warm) | set(out), key=lambda s: (s is None, s)):
        label = names.get(step) or f"step {fmt.NONE if step is None else step}"
        w, o = warm.get(step), out.get(step)
        parts = []
        if w:
            parts.append(f"a leading step {w.ratio:.2f}× the median window ({fmt.duration(w.window_us)})")
        if o:
            why = " and ".join(OUTLIER_RULES.get(r, r) for r in o.rules)
            dev = (
                f"{fmt.ms(o.deviation_us, True)} ({fmt.pct(o.deviation_frac)}) from the median"
                if o.deviation_us is not None
                else ""
            )
            moved = f"; {o.term} moved most ({fmt.ms(o.term_delta_us, True)} against its median)" if o.term else ""
            parts.append(f"{dev}, {why}{moved}" if dev else f"{why}{moved}")
        if w and o:
            kind = (
                "warm-up and outlier: it is an outlier because it is warm-up (first calls: allocation, "
                "compilation, autotuning)"
            )
        elif w:
            kind = "warm-up"
        else:
            kind = "outlier"
        hint = f"; leave it out with --exclude-step {step}" if w and step is not None else ""
        lines.append(f"{text(label)}: {kind}: {'; '.join(parts)}{hint}")
    return lines


def step_flag_lines(c: Console, a: Analysis) -> None:
    ss = a.step_stats
    names = dict(a.steps.select("step", "name").iter_rows()) if a.steps.height else {}
    lines = step_flags(ss, names)
    if lines:  # a flagged step: step statistics there
        assert ss is not None  # (step_flags flags none without them)
        c.print(f"steps: median {fmt.duration(ss.median_us)}, CV {fmt.pct(ss.cv)}; flagged (still counted):")
        for line in lines:
            c.print(f"  {line}")


def warning_lines(c: Console, warnings: list[str]) -> None:
    """Each distinct warning once, with its count."""
    for w, n in fmt.counted(warnings):
        c.print(f"[yellow]warning:[/yellow] {text(fmt.times(w, n))}")
