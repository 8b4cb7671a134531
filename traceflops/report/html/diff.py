"""The diff page (`render_diff_html`): two analyses side by side (`views.diff.diff`): headline, loss-budget
terms by size of change (each explained), per-step times and FLOPs, and the kernels and modules that moved.

Its own module because a diff renders a finished comparison, not an `Analysis`; `report.diff` (terminal and
JSON) shares its `largest_change_line`.
"""

from __future__ import annotations

from typing import Any

from traceflops.core import fmt
from traceflops.report.html.charts import PART_LABELS, TERM_HELP, paired_bars_svg
from traceflops.report.html.page import (
    Num,
    cards,
    macros,
    num,
    page,
    table,
    warnings_list,
)


def largest_change_line(lc: dict[str, Any] | None, why: str | None = None) -> str:
    """One line: which phase's matmul FLOPs moved most (the diff view's `largest_change`), or why none did."""
    if not lc:
        return f"Largest change: none: {why or 'no phase matmul FLOPs moved, or one side is unknown'}"
    unit = "per token" if lc["basis"] == "flops_per_token" else "per step"
    rel = "" if lc["relative"] is None else f", {lc['relative'] * 100:+.1f}%"
    sign = "+" if lc["delta"] > 0 else "−"
    return (
        f"Largest change: {lc['phase']} FLOPs {unit}, {sign}{fmt.flops(abs(lc['delta']))} "
        f"({fmt.flops(lc['before'])} → {fmt.flops(lc['after'])}{rel})"
    )


def _moved(v: dict[str, Any], key: str, show=fmt.ms, signed: bool = True) -> list[Num]:
    return [
        num(show(v["before"]), v["before"], f"{key}:before"),
        num(show(v["after"]), v["after"], f"{key}:after"),
        num(show(v["delta"], True) if signed else show(v["delta"]), v["delta"], f"{key}:delta"),
    ]


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff view (`views.diff.diff`) as one self-contained page: what moved, each budget term explained."""
    b, a, h = d["before"], d["after"], d["headline"]
    title = "traceflops diff"
    pp = lambda v, signed=False: fmt.pp(v, signed)
    si = lambda v, signed=False: fmt.si(v, "FLOP")
    kernels = modules = None
    if d["kernels"]:
        kernels = table(
            ["kernel", "before", "after", "delta"],
            [
                [
                    r["name"],
                    *_moved(
                        {"before": r["before_per_step"], "after": r["after_per_step"], "delta": r["delta_per_step"]},
                        "kernel",
                    ),
                ]
                for r in d["kernels"]
            ],
            name_cols=(0,),
            css_class="diff-kernels",
        )
    if d["modules"]:
        modules = table(
            ["module", "before", "after", "delta", "recompute before", "recompute after"],
            [
                [
                    r["module"],
                    *_moved(
                        {"before": r["before_per_step"], "after": r["after_per_step"], "delta": r["delta_per_step"]},
                        "module",
                    ),
                    fmt.ms(r["recompute_per_step"]["before"]),
                    fmt.ms(r["recompute_per_step"]["after"]),
                ]
                for r in d["modules"]
            ],
            name_cols=(0,),
            css_class="diff-modules",
        )
    s = {
        "cards": cards(
            [
                (
                    "MFU",
                    fmt.pp(h["mfu"]["after"]),
                    f"{fmt.pp(h['mfu']['delta'], True)} from {fmt.pp(h['mfu']['before'])}",
                ),
                (
                    "HFU",
                    fmt.pp(h["hfu"]["after"]),
                    f"{fmt.pp(h['hfu']['delta'], True)} from {fmt.pp(h['hfu']['before'])}",
                ),
                (
                    "step time",
                    fmt.ms(h["step_us"]["after"]),
                    f"{fmt.ms(h['step_us']['delta'], True)} from {fmt.ms(h['step_us']['before'])}",
                ),
            ]
        ),
        "warnings": warnings_list(d["warnings"]),
        "headline": table(
            ["", "before", "after", "delta"],
            [
                [k.replace("_", " "), *_moved(h[k], k, pp)]
                for k in ("mfu", "mfu_no_attention", "hfu", "flops_coverage")
                if k in h
            ]
            + [["step time (mean)", *_moved(h["step_us"], "step_us")]],
            css_class="diff-headline",
        ),
        "budget_bars": paired_bars_svg(d["loss_budget"]),
        "budget": table(
            ["term", "before", "after", "delta", "what it means"],
            [
                [r["term"].replace("_", " "), *_moved(r, r["term"], pp), TERM_HELP.get(r["term"], "")]
                for r in d["loss_budget"]
            ],
            css_class="diff-budget",
            explain_last=True,
        ),
        "steps": table(
            ["", "before", "after", "delta"],
            [[f"time: {PART_LABELS.get(k, k)}", *_moved(v, f"time_{k}")] for k, v in d["time_us_per_step"].items()]
            + [[f"{p} FLOPs", *_moved(v, f"flops_{p}", si)] for p, v in d["flops_per_step"].items()]
            + [
                [f"{p} FLOPs per token", *_moved(v, f"flops_per_token_{p}", si)]
                for p, v in (d.get("flops_per_token") or {}).items()
            ],
            css_class="diff-steps",
        ),
        "kernels": kernels,
        "modules": modules,
    }
    side = lambda x: {"path": x["path"], "steps": x["steps"], "hardware": x["hardware"]}
    lc = largest_change_line(d.get("largest_change"), d.get("largest_change_why"))
    body = macros("diff.html").report(title, side(b), side(a), lc, len(d["warnings"]), s, d["notes"])
    return page(title, [str(body)])
