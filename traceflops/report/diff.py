"""A diff of two analyses as text: JSON, a terminal table, an HTML page."""

from __future__ import annotations

from typing import Any

import orjson

from traceflops.core import fmt
from traceflops.report import html as H


def render_json(d: dict[str, Any]) -> str:
    return orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def largest_change_text(d: dict[str, Any]) -> str:
    """One line: which phase's matmul FLOPs moved most, and by how much."""
    lc = d.get("largest_change")
    if not lc:
        return "Largest change: no phase's matmul FLOPs moved"
    unit = "per token" if lc["basis"] == "flops_per_token" else "per step"
    rel = "" if lc["relative"] is None else f", {lc['relative'] * 100:+.1f}%"
    sign = "+" if lc["delta"] > 0 else "−"
    return (f"Largest change: {lc['phase']} FLOPs {unit}, {sign}{fmt.flops(abs(lc['delta']))} "
            f"({fmt.flops(lc['before'])} → {fmt.flops(lc['after'])}{rel})")


def render_terminal(d: dict[str, Any], console=None) -> None:
    from rich.table import Table

    from traceflops.report.terminal import console as printable_console
    from traceflops.report.terminal import text

    c = console or printable_console()
    c.print(f"[bold]before[/bold] {text(d['before']['path'])}  ({text(d['before']['steps'])} steps)")
    c.print(f"[bold]after[/bold]  {text(d['after']['path'])}  ({text(d['after']['steps'])} steps)")
    h = d["headline"]
    ht = Table(title="Headline")
    for col in ("", "before", "after", "delta"):
        ht.add_column(col, justify="right")
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
        bt.add_column(col, justify="right")
    for r in d["loss_budget"]:
        bt.add_row(text(r["term"]), fmt.pp(r["before"]), fmt.pp(r["after"]), fmt.pp(r["delta"], True))
    c.print(bt)
    if d["kernels"]:
        kt = Table(title="Kernels whose time per step moved most")
        for col in ("kernel", "before", "after", "delta"):
            kt.add_column(col, justify="right" if col != "kernel" else "left", overflow="fold")
        for r in d["kernels"]:
            kt.add_row(text(r["name"]), fmt.ms(r["before_per_step"]), fmt.ms(r["after_per_step"]), fmt.ms(r["delta_per_step"], True))
        c.print(kt)
    if d["modules"]:
        mt = Table(title="Modules whose time per step moved most")
        for col in ("module", "before", "after", "delta", "recompute before", "recompute after"):
            mt.add_column(col, justify="right" if col != "module" else "left", overflow="fold")
        for r in d["modules"]:
            rc = r["recompute_per_step"]
            mt.add_row(text(r["module"]), fmt.ms(r["before_per_step"]), fmt.ms(r["after_per_step"]), fmt.ms(r["delta_per_step"], True),
                       fmt.ms(rc["before"]), fmt.ms(rc["after"]))
        c.print(mt)
    for n in d["notes"]:
        c.print(f"[dim]{text(n)}[/dim]")
    for w in d["warnings"]:
        c.print(f"[yellow]warning:[/yellow] {text(w)}")


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained HTML page (escaped, no scripts, no network)."""
    b, a = d["before"], d["after"]
    title = "traceflops diff"
    h = d["headline"]
    body = [
        f"<h1>{H.e(title)}</h1>",
        (f'<p class="sub">before: {H.e(b["path"])} ({H.e(b["steps"])} steps, {H.e(b["hardware"])})<br>'
         f'after: {H.e(a["path"])} ({H.e(a["steps"])} steps, {H.e(a["hardware"])})</p>'),
        H.cards([
            ("MFU", fmt.pp(h["mfu"]["after"]), f"{fmt.pp(h['mfu']['delta'], True)} from {fmt.pp(h['mfu']['before'])}"),
            ("HFU", fmt.pp(h["hfu"]["after"]), f"{fmt.pp(h['hfu']['delta'], True)} from {fmt.pp(h['hfu']['before'])}"),
            ("step time", fmt.ms(h["step_us"]["after"]), f"{fmt.ms(h['step_us']['delta'], True)} from {fmt.ms(h['step_us']['before'])}"),
        ]),
        f'<p class="largest-change"><b>{H.e(largest_change_text(d))}</b></p>',
        H.h2(f"Warnings ({len(d['warnings'])})", "warnings"),
        H.warnings_list(d["warnings"]),
        H.h2("Loss budget terms, by size of change", "budget"),
        _budget_svg(d["loss_budget"]),
        H.table(["term", "before", "after", "delta"], [[r["term"], fmt.pp(r["before"]), fmt.pp(r["after"]), fmt.pp(r["delta"], True)] for r in d["loss_budget"]]),
        H.h2("Per step", "steps"),
        H.table(["", "before", "after", "delta"],
                [[f"time: {H.PART_LABELS.get(k, k)}", fmt.ms(v["before"]), fmt.ms(v["after"]), fmt.ms(v["delta"], True)] for k, v in d["time_us_per_step"].items()]
                + [[f"{p} FLOPs", fmt.si(v["before"], "FLOP"), fmt.si(v["after"], "FLOP"), fmt.si(v["delta"], "FLOP")] for p, v in d["flops_per_step"].items()]
                + [[f"{p} FLOPs per token", fmt.si(v["before"], "FLOP"), fmt.si(v["after"], "FLOP"), fmt.si(v["delta"], "FLOP")]
                   for p, v in (d.get("flops_per_token") or {}).items()]),
    ]
    if d["kernels"]:
        body += [H.h2("Kernels whose time per step moved most", "kernels"),
                 H.table(["kernel", "before", "after", "delta"],
                         [[r["name"], fmt.ms(r["before_per_step"]), fmt.ms(r["after_per_step"]), fmt.ms(r["delta_per_step"], True)] for r in d["kernels"]],
                         name_cols=(0,))]
    if d["modules"]:
        body += [H.h2("Modules whose time per step moved most", "modules"),
                 H.table(["module", "before", "after", "delta", "recompute before", "recompute after"],
                         [[r["module"], fmt.ms(r["before_per_step"]), fmt.ms(r["after_per_step"]), fmt.ms(r["delta_per_step"], True),
                           fmt.ms(r["recompute_per_step"]["before"]), fmt.ms(r["recompute_per_step"]["after"])] for r in d["modules"]],
                         name_cols=(0,))]
    for n in d["notes"]:
        body.append(f'<p class="mute">{H.e(n)}</p>')
    return H.page(title, body)


def _budget_svg(terms: list[dict], width: int = 900) -> str:
    """Paired bars per term: before (light) and after (dark), with the delta; exact values in data-*."""
    known = [r for r in terms if r["before"] is not None or r["after"] is not None]
    if not known:
        return '<p class="mute">No loss budget on either side.</p>'
    vals = [v for r in known for v in (r["before"], r["after"]) if v is not None]
    lo, hi = min([0.0, *vals]), max([0.0, *vals]) or 1.0
    lab, x0, x1, row = 200, 210, width - 150, 30
    sx = lambda v: x0 + (v - lo) / (hi - lo) * (x1 - x0)
    out = [f'<svg class="budget-diff" viewBox="0 0 {width} {len(known) * row + 8}" width="{width}" height="{len(known) * row + 8}" role="img">']
    for i, r in enumerate(known):
        y = 4 + i * row
        color = H.TERM_COLORS.get(r["term"], "#718096")
        out.append(f'<text x="{lab}" y="{y + 17}" text-anchor="end">{H.e(r["term"].replace("_", " "))}</text>')
        for j, (side, v) in enumerate((("before", r["before"]), ("after", r["after"]))):
            if v is None:
                continue
            xa, xb = sorted((sx(0.0), sx(v)))
            out.append(f'<rect data-term="{H.e(r["term"])}" data-side="{side}" data-value="{v!r}" x="{xa:.2f}" y="{y + 2 + j * 12}" width="{max(xb - xa, 0.75):.2f}" height="11" '
                       f'fill="{color}" fill-opacity="{0.4 if side == "before" else 1.0}"><title>{H.e(r["term"])} {side}: {fmt.pp(v)}</title></rect>')
        out.append(f'<text x="{x1 + 8}" y="{y + 17}">{H.e(fmt.pp(r["delta"], True))}</text>')
    out.append("</svg>")
    return '<div class="legend"><span>light: before</span><span>dark: after</span></div>' + "".join(out)
