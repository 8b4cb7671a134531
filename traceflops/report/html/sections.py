"""The report sections built from one typed result each, not a whole `Analysis` (so the job report shares some): what
to try (`advice_section`), what removing each loss would buy (`what_if_section`), GEMM shapes, step statistics, the
critical path and communication by dimension.

A renderer: every number comes from the result it is given; the macros of `templates/single.html` lay it out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.sections import AdviceItem, PathStretch, PathSummary, StepStats, WhatIf
from traceflops.core.vocab import OUTLIER_RULES
from traceflops.report import present
from traceflops.report.html.charts import PART_LABELS, stacked_rows_svg
from traceflops.report.html.page import MAX_ROWS, legend, macros, num, table

MAX_STEPS = 64


def tpl():
    """The section macros of `templates/single.html`."""
    return macros("single.html")


def advice_section(items: list[AdviceItem] | list[dict[str, Any]] | None, what_if: list[WhatIf] | None = None) -> str:
    """What to try, largest recoverable share first: each item's numbers, what it would buy at most (MFU now → after,
    the "if …" clause of its term, why no more), evidence, remedies, what to record next time.

    Read as mappings: the items are an Analysis' (`AdviceItem`) or a Job's (plain dicts, `views.job.job_advice`, without
    `recoverable_us` or `record`, most without `mfu_after`). `what_if`: the analysis' counterfactuals, for the MFU and
    step time now and each term's clause."""
    if not items:
        return (
            '<p class="mute">No advice: nothing in this trace stood out (or there was no step time to share out).</p>'
        )
    by_term = {w.term: w for w in what_if or []}
    now = what_if[0] if what_if else None
    shown = []
    for it in items:
        share, rec = it.get("share"), it.get("recoverable_us")
        clause = by_term[it["term"]].title if "findings" in it and it.get("term") in by_term else "if it were recovered"
        buys = _buys(
            it.get("mfu") if now is None else now.mfu,
            it.get("mfu_after"),
            it.get("step_time_us") if now is None else now.step_time_us,
            it.get("step_time_after_us"),
            clause,
        )
        shown.append(
            {
                "kind": it.get("kind"),
                "title": it.get("title"),
                "share": num(fmt.pct(share, 1), share, "share"),
                "unit": it.get("unit") or "of step time",
                "recoverable": None if rec is None else num(fmt.ms(rec), rec, "recoverable_us"),
                "buys": buys,
                "bound": it.get("bound"),
                "term": it["term"].replace("_", " ") if it.get("term") else None,
                "lists": [(label, key, tag, it.get(key)) for label, key, tag in ADVICE_LISTS if it.get(key)],
                "cause_unknown": it.get("cause_known") is False,
            }
        )
    return str(tpl().advice(shown))


def _buys(
    mfu: float | None, mfu_after: float | None, step: float | None, step_after: float | None, clause: str
) -> dict[str, Any] | None:
    """'MFU 31% → ≤ 44% if …' (or the step time, without an MFU) as the advice and the budget show it; None when
    nothing after is known."""
    if mfu_after is None and step_after is None:
        return None
    return {
        "mfu": None if mfu is None else num(fmt.pct(mfu), mfu, "mfu"),
        "mfu_after": None if mfu_after is None else num(fmt.pct(mfu_after), mfu_after, "mfu_after"),
        "step": None if step is None else num(fmt.ms(step), step, "step_time_us"),
        "step_after": None if step_after is None else num(fmt.ms(step_after), step_after, "step_time_after_us"),
        "clause": clause,
    }


def what_if_section(what_if: list[WhatIf] | None) -> str:
    """What removing each loss would buy at most: MFU and step time now → after, and why it cannot be more."""
    if not what_if:
        return ""
    rows = [
        _buys(w.mfu, w.mfu_after, w.step_time_us, w.step_time_after_us, w.title)
        or {"mfu": None, "mfu_after": None, "step": None, "step_after": None, "clause": w.title}
        for w in what_if
    ]
    return str(tpl().what_if([(w.term, row, w.bound) for w, row in zip(what_if, rows, strict=True)]))


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
    return str(tpl().gemm(out, note + more))


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
    return str(tpl().step_stats(out, outliers, warmup))


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
        return str(tpl().no_path(present(ps.why)))
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
    top = segments_table(ps.top, "cp-top") if ps.top else None
    per_step = [(s.step, segments_table(s.top, "cp-step-top")) for s in steps[:MAX_STEPS] if s.top]
    return str(
        tpl().critical_path(
            legend(colors, labels),
            stacked_rows_svg(rows, colors, labels, css_class="critical-path"),
            more,
            kinds_table,
            present(ps.note),
            top,
            per_step,
        )
    )


def segments_table(top: list[PathStretch], css_class: str) -> str:
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
    return str(tpl().communication(html, by_rank))
