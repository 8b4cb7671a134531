"""One trace's report (`render_html`): the headline cards and every section of an `Analysis`.

A renderer: every number comes from the `Analysis`; this module only lays them out (charts from `charts`,
the shell from `page`). Trace metadata (`metadata`, environment variables) is never copied in. Sections:
- per step, a stacked bar of the time partition (`steps.time_*`); per module, kernel time split by phase with
  its recompute share (`traceflops.views.rollup.by_module`).
- tables: top kernels by time, most recoverable time, idle reasons, warnings, communication by dimension
  and phase (shared with the job report).
- what to try: `Analysis.advice`, each item with its evidence, remedies and what to record next time; GEMM
  shapes with their wave quantization (`by_gemm_shape`); step variance, outliers and warm-up (`step_stats`).
- the critical path (`Analysis.path_summary`, from `views.critical_path`; a caller may pass its own:
  renderers import no view): a stacked bar per step of what bounded it, its kinds explained, and the
  longest stretches.
- the loss budget's terms each with a visible one-line explanation (`TERM_HELP`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.sections import AdviceItem, PathStretch, PathSummary, StepStats
from traceflops.core.vocab import OUTLIER_RULES, PARTITION, PHASES
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
    macros,
    num,
    page,
    table,
    warnings_list,
)

MAX_STEPS = 64


def _tpl():
    """The section macros of `templates/single.html`."""
    return macros("single.html")


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
    return str(_tpl().headline(cards(items), lower_bound, by_peak, unknown, note, peak_source))


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
        _tpl().steps(
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
    return str(_tpl().time_table(table(["time class", "time", "share of wall"], rows), overlays, idle))


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
        _tpl().modules(
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
    return str(_tpl().kernels(out, recoverable))


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


def advice_section(items: list[AdviceItem] | list[dict[str, Any]] | None) -> str:
    """What to try, largest recoverable share first: each item's numbers, evidence, remedies, what to record next time.

    Read as mappings: the items are an Analysis' (`AdviceItem`) or a Job's (plain dicts, `views.job.job_advice`, without
    `recoverable_us`, `mfu_after` or `record`)."""
    if not items:
        return (
            '<p class="mute">No advice: nothing in this trace stood out (or there was no step time to share out).</p>'
        )
    shown = []
    for it in items:
        share, rec, after = it.get("share"), it.get("recoverable_us"), it.get("mfu_after")
        shown.append(
            {
                "kind": it.get("kind"),
                "title": it.get("title"),
                "share": num(fmt.pct(share, 1), share, "share"),
                "unit": it.get("unit") or "of step time",
                "recoverable": None if rec is None else num(fmt.ms(rec), rec, "recoverable_us"),
                "mfu_after": None if after is None else num(fmt.pct(after), after, "mfu_after"),
                "term": it["term"].replace("_", " ") if it.get("term") else None,
                "lists": [(label, key, tag, it.get(key)) for label, key, tag in ADVICE_LISTS if it.get(key)],
                "cause_unknown": it.get("cause_known") is False,
            }
        )
    return str(_tpl().advice(shown))


ADVICE_LISTS = (("evidence", "evidence", "ul"), ("what to try", "remedies", "ol"), ("record next time", "record", "ul"))


GEMM_COLS = ("M", "N", "K", "batch")


def gemm_section(g: pl.DataFrame | None) -> str:
    """GEMM shapes by time, with their tiles, waves and the wave-quantization hint."""
    if g is None or g.height == 0:
        return (
            '<p class="mute">No GEMM shapes: no matmul op with recorded input shapes (profile with '
            "record_shapes=True).</p>"
        )
    rows = []
    for r in g.head(MAX_ROWS).iter_rows(named=True):
        rows.append(
            [
                *[num(str(r[c]), r[c], c) for c in GEMM_COLS],
                r.get("dtype") or "—",
                ", ".join(r.get("ops") or []),
                num(str(r["count"]), r["count"], "count"),
                num(fmt.ms(r["time_us"]), r["time_us"], "time_us"),
                num(fmt.pct(r["share"]), r["share"], "share"),
                num("—" if r.get("tflops") is None else f"{r['tflops']:.1f}", r.get("tflops"), "tflops"),
                num("—" if r.get("tiles") is None else str(r["tiles"]), r.get("tiles"), "tiles"),
                num("—" if r.get("waves") is None else f"{r['waves']:.2f}", r.get("waves"), "waves"),
                num(fmt.pct(r.get("wave_efficiency")), r.get("wave_efficiency"), "wave_efficiency"),
                num(fmt.pct(r.get("last_wave_fill")), r.get("last_wave_fill"), "last_wave_fill"),
                r.get("hint") or "",
            ]
        )
    out = table(
        [
            "M",
            "N",
            "K",
            "batch",
            "dtype",
            "ops",
            "calls",
            "time",
            "share",
            "TFLOP/s",
            "tiles",
            "waves",
            "wave eff.",
            "last wave",
            "hint",
        ],
        rows,
        left=(4, 5),
        css_class="gemm-shapes",
        explain_last=True,
    )
    hinted = int(g["wave_hint"].sum()) if "wave_hint" in g.columns else 0
    more = f" Top {MAX_ROWS} of {g.height} shapes by time." if g.height > MAX_ROWS else ""
    note = (
        f"{hinted} of {g.height} shapes lose time to wave quantization (the last wave of output tiles leaves compute "
        "units idle)."
        if hinted
        else "No shape loses much to wave quantization."
        if g["waves"].null_count() < g.height
        else "Waves unknown: the device's compute-unit count is not known (name it with --hardware)."
    )
    note += (
        " Share: of matmul time. Waves: output tiles over the device's compute units; wave efficiency: the share of"
        " compute-unit slots the waves fill; last wave: how full the final wave is."
    )
    return str(_tpl().gemm(out, note + more))


def step_stats_section(ss: StepStats | None) -> str:
    """How steady the steps are: spread, outlier steps (with the time class that moved) and warm-up steps."""
    if ss is None or not ss.count:
        return '<p class="mute">No steps: no step statistics.</p>'
    out = table(
        ["steps", "mean", "median", "std dev", "coefficient of variation", "median abs. deviation"],
        [
            [
                num(str(ss.count), ss.count, "count"),
                num(fmt.ms(ss.mean_us), ss.mean_us, "mean_us"),
                num(fmt.ms(ss.median_us), ss.median_us, "median_us"),
                num("—" if ss.std_us is None else fmt.ms(ss.std_us), ss.std_us, "std_us"),
                num(fmt.pct(ss.cv), ss.cv, "cv"),
                num(fmt.ms(ss.mad_us), ss.mad_us, "mad_us"),
            ]
        ],
        left=(),
        css_class="step-spread",
    )
    outliers = warmup = None
    if ss.outliers:
        outliers = table(
            ["step", "window", "from median", "time class that moved", "its change", "rule"],
            [
                [
                    num(str(o.step), o.step, "step"),
                    num(fmt.ms(o.window_us), o.window_us, "window_us"),
                    num(fmt.pct(o.deviation_frac), o.deviation_frac, "deviation_frac"),
                    PART_LABELS.get(o.term, o.term) if o.term else "—",
                    num(
                        "—" if o.term_delta_us is None else fmt.ms(o.term_delta_us, True),
                        o.term_delta_us,
                        "term_delta_us",
                    ),
                    ", ".join(OUTLIER_RULES.get(x, x) for x in o.rules)
                    + (" (warm-up)" if o.warmup else "")
                    + (" (last)" if o.last else ""),
                ]
                for o in ss.outliers
            ],
            left=(3, 5),
            css_class="step-outliers",
        )
    if ss.warmup:
        warmup = table(
            ["step", "window", "× median"],
            [
                [
                    num(str(w.step), w.step, "step"),
                    num(fmt.ms(w.window_us), w.window_us, "window_us"),
                    num(f"{w.ratio:.2f}×", w.ratio, "ratio"),
                ]
                for w in ss.warmup
            ],
            css_class="step-warmup",
        )
    return str(_tpl().step_stats(out, outliers, warmup))


PATH_COLORS = {
    "host": "#dd6b20",
    "launch": "#f6ad55",
    "device_matmul": "#2b6cb0",
    "device_other": "#4fd1c5",
    "memcpy": "#ecc94b",
    "communication": "#9f7aea",
    "sync": "#e53e3e",
    "idle": "#cbd5e0",
}


def critical_path_section(ps: PathSummary | None) -> str:
    """Per step, what bounded it by kind (a stacked bar whose length is the step's window), the kinds explained, the
    longest stretches."""
    if ps is None:
        return (
            '<p class="mute">No critical path in this analysis (made by an older traceflops: analyse the trace '
            "again).</p>"
        )
    if not ps.available:
        return str(_tpl().no_path(present(ps.why)))
    us = ps.us or {}
    kinds = list(us)
    colors = {k: PATH_COLORS.get(k, "#718096") for k in kinds}
    labels = {k: k.replace("_", " ") for k in kinds}
    steps = ps.steps or []
    rows = [(f"step {s.step}", s.us, f"{fmt.ms(s.length_us)}") for s in steps[:MAX_STEPS]]
    more = (MAX_STEPS, len(steps)) if len(steps) > MAX_STEPS else None
    share, meaning = ps.share or {}, ps.meaning or {}
    kinds_table = table(
        ["kind", "on the path", "share", "what it means"],
        [
            [
                labels[k],
                num(fmt.ms(us[k]), us[k], k),
                num(fmt.pct(share.get(k)), share.get(k), f"{k}:share"),
                meaning.get(k, ""),
            ]
            for k in kinds
        ],
        css_class="cp-kinds",
        explain_last=True,
    )
    top = _segments_table(ps.top, "cp-top") if ps.top else None
    per_step = [(s.step, _segments_table(s.top, "cp-step-top")) for s in steps[:MAX_STEPS] if s.top]
    return str(
        _tpl().critical_path(
            legend(colors, labels),
            stacked_rows_svg(rows, colors, labels, css_class="critical-path"),
            more,
            kinds_table,
            present(ps.note),
            top,
            per_step,
        )
    )


def _segments_table(top: list[PathStretch], css_class: str) -> str:
    return table(
        ["kind", "name", "time", "segments"],
        [
            [
                t.kind.replace("_", " "),
                t.name,
                num(fmt.ms(t.us), t.us, "us"),
                num(str(t.segments), t.segments, "segments"),
            ]
            for t in top
        ],
        name_cols=(1,),
        css_class=css_class,
    )


def _where(a: Analysis) -> str:
    parts = [f"{a.meta.get('format') or 'unknown'} trace"]
    if a.meta.get("rank") is not None:
        parts.append(f"rank {a.meta['rank']}")
    if a.meta.get("world_size") is not None:
        parts.append(f"world size {a.meta['world_size']}")
    return " · ".join(parts)


def communication_section(rows: pl.DataFrame | None, per_rank: pl.DataFrame | None = None) -> str:
    """Exposed and hidden communication per dimension (the group's role), phase and kind; a job's with its ranks."""
    if rows is None or rows.height == 0:
        return '<p class="mute">No communication in the counted steps.</p>'
    job = "ranks" in rows.columns
    pct = lambda r, k: num(fmt.pct(r[k]), r[k], k)
    out = [
        [
            r["role"],
            r["phase"],
            r["kind"],
            num(str(r["calls"]), r["calls"], "calls"),
            num(fmt.ms(r["time_us"]), r["time_us"], "time_us"),
            pct(r, "exposed_share"),
            pct(r, "overlapped_share"),
            *(
                [
                    num(str(r["ranks"]), r["ranks"], "ranks"),
                    pct(r, "max_exposed_share"),
                    num(str(r["max_rank"]), r["max_rank"], "max_rank"),
                ]
                if job
                else []
            ),
        ]
        for r in rows.head(MAX_ROWS).iter_rows(named=True)
    ]
    html = table(
        [
            "dimension",
            "phase",
            "kind",
            "calls",
            "time",
            "exposed",
            "hidden",
            *(["ranks", "most exposed rank's share", "that rank"] if job else []),
        ],
        out,
        left=(0, 1, 2),
        css_class="communication",
    )
    by_rank = None
    if per_rank is not None and per_rank.height:
        by_rank = table(
            ["rank", "dimension", "phase", "kind", "calls", "time", "exposed", "hidden"],
            [
                [
                    r["rank"],
                    r["role"],
                    r["phase"],
                    r["kind"],
                    r["calls"],
                    fmt.ms(r["time_us"]),
                    pct(r, "exposed_share"),
                    pct(r, "overlapped_share"),
                ]
                for r in per_rank.head(MAX_ROWS * 4).iter_rows(named=True)
            ],
            left=(1, 2, 3),
        )
    return str(_tpl().communication(html, by_rank))


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
        "advice": advice_section(a.advice),
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
    body = _tpl().report(
        title,
        _where(a),
        len(a.warnings),
        len(a.advice),
        fmt.budget_unknown_words(unknown) if unknown else None,
        sections,
        outside,
    )
    return page(title, [str(body)])
