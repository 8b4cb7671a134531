"""A diff of two analyses as text: JSON, a terminal table, an HTML page."""

from __future__ import annotations

from typing import Any

import orjson

from traceflops.core import fmt
from traceflops.core.sections import json_default
from traceflops.report import html as H


def render_json(d: dict[str, Any]) -> str:
    return orjson.dumps(
        d, default=json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    ).decode()


def largest_change_text(d: dict[str, Any]) -> str:
    """One line: which phase's matmul FLOPs moved most, and by how much."""
    return H.largest_change_line(d.get("largest_change"), d.get("largest_change_why"))


def render_terminal(d: dict[str, Any], console=None) -> None:
    from rich.table import Table

    from traceflops.report.console import printable_console, text

    c = console or printable_console()
    c.print(f"[bold]before[/bold] {text(d['before']['path'])}  ({text(d['before']['steps'])} steps)")
    c.print(f"[bold]after[/bold]  {text(d['after']['path'])}  ({text(d['after']['steps'])} steps)")
    h = d["headline"]
    ht = Table(title="Headline")
    for col in ("", "before", "after", "delta"):
        ht.add_column(col, justify="right", no_wrap=True)
    for k in ("mfu", "mfu_no_attention", "hfu", "flops_coverage"):
        ht.add_row(k, fmt.pp(h[k]["before"]), fmt.pp(h[k]["after"]), fmt.pp(h[k]["delta"], True))
    s = h["step_us"]
    ht.add_row("step time", fmt.ms(s["before"]), fmt.ms(s["after"]), fmt.ms(s["delta"], True))
    for p, v in d["flops_per_step"].items():
        ht.add_row(f"{text(p)} FLOPs/step", fmt.flops(v["before"]), fmt.flops(v["after"]), fmt.flops(v["delta"]))
    for p, v in (d.get("flops_per_token") or {}).items():
        ht.add_row(f"{text(p)} FLOPs/token", fmt.flops(v["before"]), fmt.flops(v["after"]), fmt.flops(v["delta"]))
    c.print(ht)
    c.print(f"[bold]{text(largest_change_text(d))}[/bold]")
    bt = Table(title="Loss budget terms, by size of change")
    for col in ("term", "before", "after", "delta"):
        bt.add_column(col, justify="right", no_wrap=True)
    for r in d["loss_budget"]:
        bt.add_row(text(r["term"]), fmt.pp(r["before"]), fmt.pp(r["after"]), fmt.pp(r["delta"], True))
    c.print(bt)
    if d["kernels"]:
        kt = Table(title="Kernels whose time per step moved most")
        kt.add_column("kernel", overflow="fold")
        for col in ("before", "after", "delta"):
            kt.add_column(col, justify="right", no_wrap=True)
        for r in d["kernels"]:
            kt.add_row(
                text(r["name"]),
                fmt.ms(r["before_per_step"]),
                fmt.ms(r["after_per_step"]),
                fmt.ms(r["delta_per_step"], True),
            )
        c.print(kt)
    if d["modules"]:
        mt = Table(title="Modules whose time per step moved most")
        mt.add_column("module", overflow="fold")
        for col in ("before", "after", "delta", "recompute before", "recompute after"):
            mt.add_column(col, justify="right", no_wrap=True)
        for r in d["modules"]:
            rc = r["recompute_per_step"]
            mt.add_row(
                text(r["module"]),
                fmt.ms(r["before_per_step"]),
                fmt.ms(r["after_per_step"]),
                fmt.ms(r["delta_per_step"], True),
                fmt.ms(rc["before"]),
                fmt.ms(rc["after"]),
            )
        c.print(mt)
    for n in d["notes"]:
        c.print(f"[dim]{text(n)}[/dim]")
    for w, n in fmt.counted(d["warnings"]):
        c.print(f"[yellow]warning:[/yellow] {text(fmt.times(w, n))}")


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained HTML page (escaped, no scripts, no network): the HTML renderer's diff page."""
    return H.render_diff_html(d)
