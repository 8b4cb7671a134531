"""Terminal report (rich).

Every string that comes from a trace goes through `text`: control characters
shown as `\\xNN` (no escape sequence reaches the terminal: clear-screen,
window titles, hyperlinks), then cut, then rich markup escaped (a kernel named
`[link=...]` prints as written). `console()` is the renderers' default
console and shows control characters in any string it renders, the guard for a
value a renderer did not pass through `text`.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.vocab import PHASES
from traceflops.report.jsonreport import step_rows


class _PrintableConsole(Console):
    """A rich console whose rendered strings never carry control characters (newlines kept: rich lays out lines)."""

    def render_str(self, text: str, **kw):
        return super().render_str(fmt.printable(text, keep_newlines=True), **kw)


def console(**kw) -> Console:
    """The console the terminal renderers print on by default (rich's Console arguments)."""
    return _PrintableConsole(**kw)


def text(v, n: int | None = None) -> str:
    """A value from a trace as rich markup that prints literally: control characters visible, cut to `n`, brackets escaped."""
    return escape(fmt.printable(v, n))


def render(a: Analysis, console: Console | None = None) -> None:
    c = console or _PrintableConsole()
    t = a.totals
    hw = a.hardware
    c.print(f"[bold]{text(a.meta.get('path'))}[/bold]  ({text(a.meta.get('format'))}, rank {text(a.meta.get('rank'))})")
    if hw:
        c.print(f"hardware: {text(hw['name'])}, dense {text(hw['precision'])} peak {fmt.flops(hw['peak_flops'])}FLOP/s [dim](source in --format json)[/dim]")
    else:
        c.print("hardware: unknown (give --hardware or --peak-tflops)")
    m = a.model or {}
    src = m.get("source")
    c.print(
        f"[bold]MFU {fmt.pct(t.get('mfu'))}[/bold] (no attention {fmt.pct(t.get('mfu_no_attention'))})   "
        f"[bold]HFU {fmt.pct(t.get('hfu'))}[/bold]   model FLOPs: {text(src)}, {text(m.get('mode'))}"
    )
    if m.get("seq_len") is not None:
        c.print(f"model: T = {m['seq_len']} (from the {text(m.get('seq_len_source'))}), {m.get('tokens_per_step')} tokens per step "
                f"({text(m.get('tokens_source'))}), {fmt.flops(m.get('flops_per_token'))}FLOP per token")
        for note in m.get("notes") or []:
            c.print(f"  [dim]{text(note)}[/dim]")
    if t.get("mfu_by_precision"):
        c.print("MFU by peak: " + ", ".join(f"{text(p)} {fmt.pct(v)}" for p, v in t["mfu_by_precision"].items()))
    if m.get("band"):
        c.print(f"band: {text(m['band'])}  [dim](dense training only; not for inference, small or MoE models)[/dim]")
    cov = t.get("flops_coverage")
    devices = (a.hardware or {}).get("devices") or 1
    on = f" on {devices} devices (time per device)" if devices > 1 else ""
    c.print(f"wall {fmt.duration(t['wall_us'])} over {a.steps.height} step(s){on}; FLOPs known for {fmt.pct(cov)} of matmul time")

    tab = Table(title="Matmul FLOPs by phase")
    tab.add_column("phase")
    tab.add_column("matmul ops", justify="right")
    tab.add_column("FLOPs", justify="right")
    for p in PHASES:
        tab.add_row(p, str(t["matmul_count"][p]), fmt.flops(t["flops"][p]))
    tab.add_row("[bold]executed[/bold]", str(sum(t["matmul_count"].values())), fmt.flops(t["flops"]["executed"]))
    c.print(tab)

    lb = t.get("loss_budget")
    if lb:
        bt = Table(title="Where peak x time went (loss budget, sums to 100%)")
        bt.add_column("term")
        bt.add_column("share", justify="right")
        bt.add_column("")
        for k, v in lb.items():
            bar = "" if v is None or v <= 0 else "█" * max(1, round(v * 40))
            bt.add_row(text(k), fmt.pct(v), bar)
        c.print(bt)
    tu = t.get("time_us")
    if tu:
        c.print("device time: " + ", ".join(f"{text(k)} {fmt.duration(v)}" for k, v in tu.items()))
    ir = t.get("idle_us_by_reason")
    if ir and any(ir.values()):
        c.print("idle by reason: " + ", ".join(f"{text(k)} {fmt.duration(v)}" for k, v in ir.items() if v))

    st = Table(title="Steps")
    for col in ("step", "start (us)", "dur (ms)", "executed", "recompute", "MFU", "HFU"):
        st.add_column(col, justify="right")
    for s in step_rows(a):
        st.add_row(
            text(s["name"]) + (" (last)" if s["last"] else ""),
            f"{s['start_us']:.1f}",
            f"{s['dur_us'] / 1e3:.3f}",
            fmt.flops(s["flops"]["executed"]),
            fmt.flops(s["flops"]["recompute"]),
            fmt.pct(s["mfu"]),
            fmt.pct(s["hfu"]),
        )
    c.print(st)
    if a.top_kernels is not None and a.top_kernels.height:
        kt = Table(title="Top recoverable kernels (duration - max(FLOPs/peak, bytes/bandwidth))")
        kt.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=44)
        for col in ("class", "bound", "count", "time (ms)", "recov. (ms)"):
            kt.add_column(col, justify="right", no_wrap=True)
        for r in a.top_kernels.head(8).iter_rows(named=True):
            kt.add_row(text(r["name"], 60), text(r["cls"]), text(r["bound"]), str(r["count"]), f"{r['dur_us'] / 1e3:.3f}", f"{(r['recoverable_us'] or 0) / 1e3:.3f}")
        c.print(kt)
    if a.by_module is not None and a.by_module.height and a.by_module["recompute_share"].max():
        mt = Table(title="Recompute by module")
        mt.add_column("module", no_wrap=True, overflow="ellipsis", max_width=50)
        for col in ("time (ms)", "recompute share"):
            mt.add_column(col, justify="right", no_wrap=True)
        for r in a.by_module.sort("time_recompute", descending=True).head(8).iter_rows(named=True):
            mt.add_row(text(r["module"], 60), f"{r['time_us'] / 1e3:.3f}", fmt.pct(r["recompute_share"]))
        c.print(mt)
    if a.outside_steps:
        o = a.outside_steps
        c.print(f"outside steps: {o['kernels']} device activities, {fmt.duration(o['device_us'])}")
    if a.advice:
        c.print("[bold]What to try, by the step time it would recover[/bold]")
        for i, item in enumerate(a.advice[:6], 1):
            c.print(f" {i}. {text(item['title'])}  [bold]{fmt.pct(item['recoverable'])}[/bold]")
            for ev in item["evidence"][:2]:
                c.print(f"    [dim]{text(ev)}[/dim]")
            c.print(f"    try: {text('; '.join(item['remedies'][:3]))}")
    ss = a.step_stats or {}
    flagged = [o for o in ss.get("outliers") or []] + [w for w in ss.get("warmup") or []]
    if flagged:
        c.print(f"steps: CV {fmt.pct(ss.get('cv'))}; flagged: " + ", ".join(text(x.get("name", x.get("step"))) for x in flagged))
    for w in a.warnings:
        c.print(f"[yellow]warning:[/yellow] {text(w)}")
