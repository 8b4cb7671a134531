"""One self-contained HTML file per analysis, job or diff: inline CSS and SVG, no script, no network.

A package of renderers, one job per module, so each report can change without wading through the others:
`page` (the shell, CSS, CSP and the escaped building blocks), `charts` (the SVG charts), `single` (one
trace's report), `sections` (sections built from one result each, shared with the job report), `job` (the job
report), `diff` (the diff page). Every number comes from the `Analysis`,
`Job` or diff; these modules gather the values and the Jinja2 templates of `templates/` lay them out, with
autoescaping on (as `page.e`, `html.escape`, escapes): only markup we build ourselves (charts, tables, sections)
is inserted raw, marked `|safe`. A Content-Security-Policy forbids scripts and remote loads, so a hostile name
can neither run nor phone home. Numbers a test (or a person) may want to read back carry their exact value in
`data-value` (the float's repr) next to the formatted text.

This module re-exports what outside code uses (`render_html`, `render_job_html`, `render_diff_html`, and
the sections and constants tests read), so `traceflops.report.html` keeps its former names.
"""

from __future__ import annotations

from traceflops.report.html.charts import (
    CLS_COLORS,
    MAX_POINTS,
    PART_COLORS,
    PART_LABELS,
    PHASE_COLORS,
    TERM_COLORS,
    TERM_HELP,
    paired_bars_svg,
    roofline_svg,
    stacked_rows_svg,
    waterfall_svg,
)
from traceflops.report.html.diff import largest_change_line, render_diff_html
from traceflops.report.html.job import (
    JOB_ADVICE_NONE,
    STRAGGLER_WHY,
    collectives_table,
    rank_budgets,
    render_job_html,
    stragglers_table,
)
from traceflops.report.html.page import (
    CSP,
    CSS,
    MAX_ROWS,
    NAME_CHARS,
    Num,
    cards,
    e,
    h2,
    legend,
    num,
    page,
    span,
    table,
    warnings_list,
)
from traceflops.report.html.sections import (
    GEMM_COLS,
    MAX_STEPS,
    PATH_COLORS,
    advice_section,
    communication_section,
    critical_path_section,
    gemm_section,
    step_stats_section,
)
from traceflops.report.html.single import (
    budget_terms_table,
    headline,
    kernels_tables,
    modules_svg,
    phase_flops_table,
    render_html,
    steps_svg,
    time_table,
)

__all__ = [
    "CLS_COLORS",
    "CSP",
    "CSS",
    "GEMM_COLS",
    "JOB_ADVICE_NONE",
    "MAX_POINTS",
    "MAX_ROWS",
    "MAX_STEPS",
    "NAME_CHARS",
    "PART_COLORS",
    "PART_LABELS",
    "PATH_COLORS",
    "PHASE_COLORS",
    "STRAGGLER_WHY",
    "TERM_COLORS",
    "TERM_HELP",
    "Num",
    "advice_section",
    "budget_terms_table",
    "cards",
    "collectives_table",
    "communication_section",
    "critical_path_section",
    "e",
    "gemm_section",
    "h2",
    "headline",
    "kernels_tables",
    "largest_change_line",
    "legend",
    "modules_svg",
    "num",
    "page",
    "paired_bars_svg",
    "phase_flops_table",
    "rank_budgets",
    "render_diff_html",
    "render_html",
    "render_job_html",
    "roofline_svg",
    "span",
    "stacked_rows_svg",
    "step_stats_section",
    "steps_svg",
    "stragglers_table",
    "table",
    "time_table",
    "warnings_list",
    "waterfall_svg",
]
