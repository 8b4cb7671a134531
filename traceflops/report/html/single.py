"""One trace's report (`render_html`): the headline cards and the sections read from a whole `Analysis`.

A renderer: every number comes from the `Analysis`; this module only lays them out (charts from `charts`,
the shell from `page`, the sections built from one result each, advice, GEMM shapes, step statistics, the
critical path and communication, from `sections`). Trace metadata (`metadata`, environment variables) is never
copied in. Sections here:
- per step, a stacked bar of the time partition (`steps.time_*`); per module, kernel time split by phase with
  its recompute share (`traceflops.views.rollup.by_module`).
- tables: top kernels by time, most recoverable time, idle reasons, warnings.
- the loss budget's terms each with a visible one-line explanation (`TERM_HELP`).
"""

from __future__ import annotations

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.sections import PathSummary
from traceflops.core.vocab import PARTITION, PHASES
from traceflops.report import present
from traceflops.report.html.charts import (
    PART_COLORS,
    PART_LABELS,
    PHASE_COLORS,
    TERM_HELP,
    roofline_svg,
    stacked_rows_svg,
    waterfall_svg,
)
from traceflops.report.html.page import (
    MAX_ROWS,
    cards,
    legend,
    num,
    page,
    table,
    warnings_list,
)
from traceflops.report.html.sections import (
    MAX_STEPS,
    advice_section,
    communication_section,
    critical_path_section,
    gemm_section,
    step_stats_section,
    tpl,
    what_if_section,
)

# --- sections of one analysis -----------------------------------------------


def _steps_counted(a) -> str:
    """'N step(s)', or 'N of M steps counted' when the totals leave some out (asked, cut, or the unbounded last)."""
    sc = a.totals.step_count
    counted, have = sc.counted, sc.in_trace
    return f"{counted} step(s)" if counted == have else f"{counted} of {have} steps counted"


def headline(a: Analysis) -> str:
    t, hw, m = a.totals, a.hardware, a.model
    peak, hw_name, precision, peak_source = (
        (hw.peak_flops, hw.name, hw.precision, hw.source) if hw is not None else (None,) * 4
    )
    band, source, mode, note = (m.band, m.source, m.mode, present(m.note)) if m is not None else (None,) * 4
    items = [
        ("MFU", fmt.pct(t.mfu), f"no attention {fmt.pct(t.mfu_no_attention)}"),
        ("HFU", fmt.pct(t.hfu), "executed FLOPs, recompute included"),
        ("band", band or "—", "dense training rule of thumb" if band else "not applicable"),
        (
            "peak",
            fmt.si(peak, "FLOP/s") if peak else "unknown",
            f"{hw_name or 'hardware unknown'}, dense {precision or '?'}",
        ),
        ("model FLOPs", str(source or "—"), f"{mode or ''}; coverage {fmt.pct(t.flops_coverage)}"),
        ("wall", fmt.ms(t.wall_us), _steps_counted(a)),
    ]
    if m is not None and present(m.seq_len) is not None:
        items.append(
            (
                "T",
                str(m.seq_len),
                (
                    f"sequence length, from the {present(m.seq_len_source)}; "
                    f"{present(m.tokens_per_step)} tokens per step"
                ),
            )
        )
    lower_bound = (
        {
            "coverage": fmt.pct(t.flops_coverage),
            "bound": fmt.bound_words(t),
            "kernels": "; ".join(
                f"{fmt.ms(k.time_us)} in {k.count} × {fmt.short(k.name, 80)} ({k.why})"
                for k in t.unknown_matmul_kernels
            ),
        }
        if t.flops_lower_bound
        else None
    )
    by_peak = (
        ", ".join(f"{p} {fmt.pct(v)}" for p, v in t.mfu_by_precision.items()) + fmt.precision_words(t.mfu_by_precision)
        if t.mfu_by_precision
        else None
    )
    unknown = fmt.budget_unknown_words(t.loss_budget_unknown) if t.loss_budget_unknown else None
    return str(tpl().headline(cards(items), lower_bound, by_peak, unknown, note, peak_source))


def phase_flops_table(a: Analysis) -> str:
    t = a.totals
    rows = [[p, t.matmul_count[p], fmt.si(t.flops[p], "FLOP")] for p in PHASES]
    rows.append(["executed", sum(t.matmul_count.values()), fmt.si(t.flops["executed"], "FLOP")])
    return table(["phase", "matmul ops", "FLOPs"], rows)


def steps_svg(a: Analysis) -> str:
    rows = []
    for s in a.steps.head(MAX_STEPS).iter_rows(named=True):
        parts = {c: s.get(f"time_{c}") for c in PARTITION}
        note = f"{fmt.ms(s['window'])} · MFU {fmt.pct(s.get('mfu'))}" + (" (last)" if s.get("last") else "")
        rows.append((s["name"], parts, note))
    more = (MAX_STEPS, a.steps.height) if a.steps.height > MAX_STEPS else None
    return str(
        tpl().steps(
            legend(PART_COLORS, PART_LABELS), stacked_rows_svg(rows, PART_COLORS, PART_LABELS, css_class="steps"), more
        )
    )


def time_table(a: Analysis) -> str:
    t = a.totals
    wall = t.wall_us or 0.0
    rows = [
        [PART_LABELS[k], fmt.ms(v), fmt.pct(v / wall if wall and v is not None else None)]
        for k, v in (t.time_us or {}).items()
    ]
    ov = t.overlay_us
    overlays = ", ".join(f"{k.replace('_', ' ')} {fmt.ms(v)}" for k, v in ov.items()) if ov else None
    ir = t.idle_us_by_reason
    idle = (
        table(["idle reason", "time"], [[k.replace("_", " "), fmt.ms(v)] for k, v in ir.items() if v])
        if ir and any(ir.values())
        else ""
    )
    return str(tpl().time_table(table(["time class", "time", "share of wall"], rows), overlays, idle))


def modules_svg(a: Analysis) -> str:
    from traceflops.report.tables import by_module_frame

    bm = by_module_frame(a)
    if bm is None or bm.height == 0:
        return '<p class="mute">No device kernels in this trace: no per-module roll-up.</p>'
    top = bm.filter(pl.col("module").is_not_null()).sort("time_us", descending=True).head(20)
    rows = [
        (
            r["module"],
            {p: r[f"time_{p}"] for p in PHASES},
            f"{fmt.ms(r['time_us'])} · recompute {fmt.pct(r['recompute_share'])}",
        )
        for r in top.iter_rows(named=True)
    ]
    return str(
        tpl().modules(
            legend(PHASE_COLORS),
            stacked_rows_svg(rows, PHASE_COLORS, css_class="modules"),
            fmt.ms(bm["time_recompute"].sum()),
            fmt.ms(bm["time_us"].sum()),
            len(rows),
            bm.height,
        )
    )


def kernels_tables(a: Analysis) -> str:
    from traceflops.report.tables import by_kernel_frame, top_kernels_frame

    bk = by_kernel_frame(a)
    if bk is None or bk.height == 0:
        return '<p class="mute">No device kernels in this trace.</p>'
    rows = [
        [
            r["name"],
            r["cls"],
            r["count"],
            fmt.ms(r["total_us"]),
            fmt.pct(r["share"]),
            f"{r['mean_us']:.1f}",
            "—" if r["tflops"] is None else f"{r['tflops']:.1f}",
            ", ".join(r["phases"] or []),
        ]
        for r in bk.head(MAX_ROWS).iter_rows(named=True)
    ]
    out = table(
        ["kernel", "class", "count", "time", "share", "mean µs", "TFLOP/s", "phases"], rows, left=(1, 7), name_cols=(0,)
    )
    recoverable = None
    tk = top_kernels_frame(a)
    if tk is not None and tk.height and tk["recoverable_us"].sum():
        rows = [
            [
                r["name"],
                r["cls"],
                r["bound"] or "—",
                r["count"],
                fmt.ms(r["dur_us"]),
                fmt.ms(r["recoverable_us"]),
                "—" if r["median_intensity"] is None else f"{r['median_intensity']:.3g}",
                fmt.pct(r["median_flops_frac"]),
                fmt.pct(r["median_bw_frac"]),
            ]
            for r in tk.head(MAX_ROWS).iter_rows(named=True)
        ]
        recoverable = table(
            ["kernel", "class", "bound", "count", "time", "recoverable", "FLOP/B", "of peak FLOP/s", "of HBM B/s"],
            rows,
            left=(1, 2),
            name_cols=(0,),
        )
    return str(tpl().kernels(out, recoverable))


def budget_terms_table(lb: dict[str, float | None] | None) -> str:
    """Each loss-budget term, its value and what it means, as visible text."""
    if not lb:
        return ""
    rows = [
        [k.replace("_", " "), num("unknown" if v is None else fmt.pct(v, 2), v, k), TERM_HELP.get(k, "")]
        for k, v in lb.items()
    ]
    return table(
        ["term", "share of peak × step time", "what it means"], rows, css_class="budget-terms", explain_last=True
    )


def _where(a: Analysis) -> str:
    parts = [f"{a.meta.get('format') or 'unknown'} trace"]
    if a.meta.get("rank") is not None:
        parts.append(f"rank {a.meta['rank']}")
    if a.meta.get("world_size") is not None:
        parts.append(f"world size {a.meta['world_size']}")
    return " · ".join(parts)


def render_html(a: Analysis, title: str | None = None, critical_path: PathSummary | None = None) -> str:
    """The single-analysis report as one self-contained HTML document.

    `critical_path` is `views.critical_path.path_summary(a)` (a renderer imports no view): given by the caller, else
    the Analysis' own `path_summary` (the pipeline's, as the JSON report has it).
    """
    from traceflops.report.tables import roofline_frame

    path = a.meta.get("path")
    title = fmt.printable(title or f"traceflops: {path}")  # control characters visible, as the terminal shows them
    lb = a.totals.loss_budget
    sections = {
        "headline": headline(a),
        "warnings": warnings_list(a.warnings),
        "waterfall": waterfall_svg(lb),
        "budget_terms": budget_terms_table(lb),
        "critical_path": critical_path_section(critical_path if critical_path is not None else a.path_summary),
        "what_if": what_if_section(a.what_if),
        "advice": advice_section(a.advice, a.what_if),
        "steps": steps_svg(a),
        "time": time_table(a),
        "communication": communication_section(a.communication),
        "step_stats": step_stats_section(a.step_stats),
        "phases": phase_flops_table(a),
        "gemm": gemm_section(a.by_gemm_shape),
        "roofline": roofline_svg(roofline_frame(a)),
        "modules": modules_svg(a),
        "kernels": kernels_tables(a),
    }
    unknown = a.totals.loss_budget_unknown
    o = a.outside_steps
    outside = {"kernels": o.kernels, "device_us": fmt.ms(o.device_us)} if o is not None else None
    body = tpl().report(
        title,
        _where(a),
        len(a.warnings),
        len(a.advice),
        fmt.budget_unknown_words(unknown) if unknown else None,
        sections,
        outside,
    )
    return page(title, [str(body)])
