"""A notebook's small view of an `Analysis` or a `Job`: the headline, the loss budget's largest terms, the top advice.

Self-contained, escaped, no script: what IPython shows for a value (`_repr_html_`); the whole page is `report.html`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from traceflops.core import fmt
from traceflops.core.results import Analysis, Job, top_terms, utilization_words
from traceflops.core.sections import AdviceItem, JobAdviceItem, JobTotals, Totals


def card(value: Analysis | Job) -> str:
    """The card of an analysis (its file, steps, wall, hardware) or a job (its ranks and steps, the ranks' mean
    budget)."""
    if isinstance(value, Job):
        head = f"{len(value.summaries)} ranks, {value.steps.height} steps, wall {fmt.duration(value.totals.wall_us)}"
        return _card(
            "traceflops.Job",
            None,
            head,
            value.totals,
            value.mean_budget(),
            "loss budget, mean over ranks",
            value.advice,
            value.warnings,
        )
    t, hw = value.totals, value.hardware
    head = (
        f"{t.step_count.counted} of {t.step_count.in_trace} steps counted, "
        f"wall {fmt.duration(t.wall_us)}, on {(hw.name if hw is not None else None) or 'unknown hardware'}"
    )
    return _card(
        "traceflops.Analysis",
        value.meta.get("path"),
        head,
        t,
        t.loss_budget,
        "loss budget (share of step time at peak)",
        value.advice,
        value.warnings,
    )


def _card(
    kind: str,
    path,
    head: str,
    totals: Totals | JobTotals,
    budget: dict[str, Any] | None,
    budget_title: str,
    advice: Sequence[AdviceItem | JobAdviceItem],
    warnings: list[str],
) -> str:
    """The card's HTML; `advice` is an Analysis' items or a Job's (`views.job.job_advice`): both have a title, a
    share and a unit."""
    e = lambda v: html.escape(fmt.printable(v), quote=True)
    rows = "".join(
        f"<tr><td>{e(k)}</td><td style='text-align:right'>{e(fmt.pct(v))}</td></tr>" for k, v in top_terms(budget, 10)
    )
    tips = "".join(
        f"<li>{e(t.title)} <span style='color:#718096'>({e(fmt.pct(t.share))} {e(t.unit or '')})</span></li>"
        for t in advice[:3]
    )
    where = f" <code>{e(path)}</code>" if path else ""
    return (
        f"<div class='traceflops'><b>{e(kind)}</b>{where}<br>"
        f"<b>{e(utilization_words(totals))}</b>; {e(head)}; {len(warnings)} warnings"
        f"<br><b>{e(budget_title)}</b><table>{rows or '<tr><td>unknown</td></tr>'}</table>"
        f"<b>what to try</b><ol>{tips or '<li>nothing above the threshold</li>'}</ol>"
        f"<span style='color:#718096'>the full report: .to_html(); the numbers: .to_dict(), .to_pandas()</span></div>"
    )
