"""Before/after: what moved between two analyses (a change to a model, a kernel, a setting).

`diff(a, b)` compares the analyses' own numbers; it derives nothing but
differences (after − before) and per-step means:

* `headline`: MFU, MFU without attention, HFU, FLOPs coverage, mean step time
  (wall / steps), matmul FLOPs per step by phase;
* `flops_per_token`: matmul FLOPs by phase per token of this device, when both
  analyses know their tokens per step (`model['tokens_per_step']`: given, or
  inferred from the input embedding when the model is described; a job's
  global tokens are divided by its world size), else null;
* `largest_change`: the phase whose matmul FLOPs moved most, per token when
  `flops_per_token` is known (runs with different batch or micro-batch counts
  compare), else per step; `basis` says which; null when nothing moved;
* `loss_budget`: each term's fractions and delta, sorted by |delta| (unknown
  deltas last);
* `time_us`: the time partition per step (mean);
* `kernels`: kernel names whose time per step moved most (rollup.by_kernel:
  all the trace's kernels, outside-steps ones included, over its number of
  steps, so runs of different lengths compare);
* `modules`: modules whose time per step moved most, with their recompute time
  (rollup.by_module, per step likewise), when both traces have device kernels.

Renderers: `render_terminal` (rich), `render_json`, `render_diff_html`.
"""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl

from traceflops.pipeline import Analysis
from traceflops.core.vocab import PHASES
from traceflops.core.vocab import PARTITION

SCHEMA = "traceflops.views.diff/1"
TOP = 20


def _delta(x, y):
    return None if x is None or y is None else y - x


def _pair(x, y) -> dict[str, Any]:
    return {"before": x, "after": y, "delta": _delta(x, y)}


def _steps(a: Analysis) -> int:
    return a.steps.height


def _per_step(v, n: int):
    return None if v is None or not n else v / n


def _side(a: Analysis) -> dict[str, Any]:
    hw = a.hardware or {}
    return {
        "path": a.meta.get("path"),
        "format": a.meta.get("format"),
        "rank": a.meta.get("rank"),
        "hardware": hw.get("name"),
        "precision": hw.get("precision"),
        "peak_flops": hw.get("peak_flops"),
        "model_source": (a.model or {}).get("source"),
        "steps": _steps(a),
        "wall_us": a.totals.get("wall_us"),
    }


def _device_tokens(a: Analysis) -> float | None:
    """Tokens per step on this trace's device: the model's (global) tokens over the world size it was split by."""
    m = a.model or {}
    tokens = m.get("tokens_per_step")
    if not tokens:
        return None
    whole, share = m.get("flops_per_step"), m.get("flops_per_step_device")
    world = round(whole / share) if whole and share else 1
    return tokens / max(world, 1)


def _largest_change(by_phase: dict[str, dict], basis: str) -> dict[str, Any] | None:
    """The phase (never `executed`, their sum) whose FLOPs moved most; ties go to the earlier phase."""
    best = None
    for p in PHASES:
        v = by_phase[p]
        if v["delta"] is None or v["delta"] == 0:
            continue
        if best is None or abs(v["delta"]) > abs(best["delta"]):
            rel = None if not v["before"] else v["delta"] / v["before"]
            best = {"phase": p, "basis": basis, **v, "relative": rel}
    return best


def _moved(fa: pl.DataFrame | None, fb: pl.DataFrame | None, key: str, value: str, na: int, nb: int, extra: tuple[str, ...] = ()) -> list[dict]:
    """Rows of two roll-ups joined on `key`, per-step `value` before/after/delta, by |delta|."""
    if fa is None or fb is None:
        return []
    cols = [key, value, *extra]
    a = fa.select(cols).rename({c: f"{c}_before" for c in cols if c != key})
    b = fb.select(cols).rename({c: f"{c}_after" for c in cols if c != key})
    j = a.join(b, on=key, how="full", coalesce=True, nulls_equal=True)
    j = j.with_columns(
        (pl.col(f"{value}_before").fill_null(0.0) / max(na, 1)).alias("before_per_step"),
        (pl.col(f"{value}_after").fill_null(0.0) / max(nb, 1)).alias("after_per_step"),
    ).with_columns(delta_per_step=pl.col("after_per_step") - pl.col("before_per_step"))
    j = j.sort(pl.col("delta_per_step").abs(), key, descending=[True, False], nulls_last=True).head(TOP)
    return j.to_dicts()


def diff(a: Analysis, b: Analysis) -> dict[str, Any]:
    """What moved from analysis `a` (before) to `b` (after)."""
    from traceflops.report.tables import by_kernel_frame, by_module_frame

    ta, tb = a.totals, b.totals
    na, nb = _steps(a), _steps(b)
    warnings = []
    ha, hb = (a.hardware or {}), (b.hardware or {})
    if ha.get("peak_flops") != hb.get("peak_flops"):
        warnings.append(f"the peaks differ ({ha.get('name')} {ha.get('precision')} vs {hb.get('name')} {hb.get('precision')}): utilization deltas mix hardware and code")
    if (a.model or {}).get("source") != (b.model or {}).get("source"):
        warnings.append("model FLOPs come from different sources: MFU deltas are not like for like")
    if na != nb:
        warnings.append(f"different numbers of steps ({na} vs {nb}): times and FLOPs are compared per step")
    headline = {k: _pair(ta.get(k), tb.get(k)) for k in ("mfu", "mfu_no_attention", "hfu", "flops_coverage")}
    headline["step_us"] = _pair(_per_step(ta.get("wall_us"), na), _per_step(tb.get("wall_us"), nb))
    flops = {p: _pair(_per_step(ta["flops"][p], na), _per_step(tb["flops"][p], nb)) for p in (*PHASES, "executed")}
    tok_a, tok_b = _device_tokens(a), _device_tokens(b)
    per_token = None
    if tok_a and tok_b:
        per_token = {p: _pair(_per_step(v["before"], tok_a), _per_step(v["after"], tok_b)) for p, v in flops.items()}
        basis = "flops_per_token"
    else:
        basis = "flops_per_step"
        if tok_a != tok_b:
            warnings.append("tokens per step known for only one trace: FLOPs compared per step, not per token")
    largest = _largest_change(per_token or flops, basis)
    la, lb = ta.get("loss_budget") or {}, tb.get("loss_budget") or {}
    terms = [{"term": k, **_pair(la.get(k), lb.get(k))} for k in dict.fromkeys([*la, *lb])]
    terms.sort(key=lambda r: (r["delta"] is None, -abs(r["delta"] or 0.0)))
    time_us = {c: _pair(_per_step((ta.get("time_us") or {}).get(c), na), _per_step((tb.get("time_us") or {}).get(c), nb)) for c in PARTITION}
    kernels = _moved(by_kernel_frame(a), by_kernel_frame(b), "name", "total_us", na, nb, ("count", "cls"))
    modules = _moved(by_module_frame(a), by_module_frame(b), "module", "time_us", na, nb, ("time_recompute", "recompute_share"))
    for m in modules:
        m["recompute_per_step"] = _pair(_per_step(m.get("time_recompute_before"), na) if m.get("time_recompute_before") is not None else None,
                                        _per_step(m.get("time_recompute_after"), nb) if m.get("time_recompute_after") is not None else None)
    notes = []
    if not kernels:
        notes.append("no device kernels in one or both traces: no per-kernel comparison")
    return {
        "schema": SCHEMA,
        "before": _side(a),
        "after": _side(b),
        "headline": headline,
        "flops_per_step": flops,
        "flops_per_token": per_token,
        "largest_change": largest,
        "loss_budget": terms,
        "time_us_per_step": time_us,
        "kernels": kernels,
        "modules": modules,
        "warnings": warnings,
        "notes": notes,
    }


# --- renderers --------------------------------------------------------------------


def render_json(d: dict[str, Any]) -> str:
    return orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def _pp(v, signed: bool = False) -> str:
    """A fraction as percentage points."""
    if v is None:
        return "—"
    return f"{v * 100:+.2f} pp" if signed else f"{v * 100:.2f}%"


def _ms(us, signed: bool = False) -> str:
    if us is None:
        return "—"
    return f"{us / 1e3:+.3f} ms" if signed else f"{us / 1e3:.3f} ms"


def largest_change_text(d: dict[str, Any]) -> str:
    """One line: which phase's matmul FLOPs moved most, and by how much."""
    from traceflops.report.terminal import _flops

    lc = d.get("largest_change")
    if not lc:
        return "Largest change: no phase's matmul FLOPs moved"
    unit = "per token" if lc["basis"] == "flops_per_token" else "per step"
    rel = "" if lc["relative"] is None else f", {lc['relative'] * 100:+.1f}%"
    sign = "+" if lc["delta"] > 0 else "−"
    return (f"Largest change: {lc['phase']} FLOPs {unit}, {sign}{_flops(abs(lc['delta']))} "
            f"({_flops(lc['before'])} → {_flops(lc['after'])}{rel})")


def render_terminal(d: dict[str, Any], console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from traceflops.report.terminal import _flops

    c = console or Console()
    c.print(f"[bold]before[/bold] {escape(str(d['before']['path']))}  ({d['before']['steps']} steps)")
    c.print(f"[bold]after[/bold]  {escape(str(d['after']['path']))}  ({d['after']['steps']} steps)")
    h = d["headline"]
    ht = Table(title="Headline")
    for col in ("", "before", "after", "delta"):
        ht.add_column(col, justify="right")
    for k in ("mfu", "mfu_no_attention", "hfu", "flops_coverage"):
        ht.add_row(k, _pp(h[k]["before"]), _pp(h[k]["after"]), _pp(h[k]["delta"], True))
    s = h["step_us"]
    ht.add_row("step time", _ms(s["before"]), _ms(s["after"]), _ms(s["delta"], True))
    for p, v in d["flops_per_step"].items():
        ht.add_row(f"{p} FLOPs/step", _flops(v["before"]), _flops(v["after"]), _flops(v["delta"]))
    for p, v in (d.get("flops_per_token") or {}).items():
        ht.add_row(f"{p} FLOPs/token", _flops(v["before"]), _flops(v["after"]), _flops(v["delta"]))
    c.print(ht)
    c.print(f"[bold]{escape(largest_change_text(d))}[/bold]")
    bt = Table(title="Loss budget terms, by size of change")
    for col in ("term", "before", "after", "delta"):
        bt.add_column(col, justify="right")
    for r in d["loss_budget"]:
        bt.add_row(r["term"], _pp(r["before"]), _pp(r["after"]), _pp(r["delta"], True))
    c.print(bt)
    if d["kernels"]:
        kt = Table(title="Kernels whose time per step moved most")
        for col in ("kernel", "before", "after", "delta"):
            kt.add_column(col, justify="right" if col != "kernel" else "left", overflow="fold")
        for r in d["kernels"]:
            kt.add_row(escape(str(r["name"])), _ms(r["before_per_step"]), _ms(r["after_per_step"]), _ms(r["delta_per_step"], True))
        c.print(kt)
    if d["modules"]:
        mt = Table(title="Modules whose time per step moved most")
        for col in ("module", "before", "after", "delta", "recompute before", "recompute after"):
            mt.add_column(col, justify="right" if col != "module" else "left", overflow="fold")
        for r in d["modules"]:
            rc = r["recompute_per_step"]
            mt.add_row(escape(str(r["module"])), _ms(r["before_per_step"]), _ms(r["after_per_step"]), _ms(r["delta_per_step"], True),
                       _ms(rc["before"]), _ms(rc["after"]))
        c.print(mt)
    for n in d["notes"]:
        c.print(f"[dim]{escape(n)}[/dim]")
    for w in d["warnings"]:
        c.print(f"[yellow]warning:[/yellow] {escape(w)}")


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained HTML page (escaped, no scripts, no network)."""
    from traceflops.report import html as H

    b, a = d["before"], d["after"]
    title = "traceflops diff"
    h = d["headline"]
    body = [
        f"<h1>{H.e(title)}</h1>",
        (f'<p class="sub">before: {H.e(b["path"])} ({H.e(b["steps"])} steps, {H.e(b["hardware"])})<br>'
         f'after: {H.e(a["path"])} ({H.e(a["steps"])} steps, {H.e(a["hardware"])})</p>'),
        H.cards([
            ("MFU", _pp(h["mfu"]["after"]), f"{_pp(h['mfu']['delta'], True)} from {_pp(h['mfu']['before'])}"),
            ("HFU", _pp(h["hfu"]["after"]), f"{_pp(h['hfu']['delta'], True)} from {_pp(h['hfu']['before'])}"),
            ("step time", _ms(h["step_us"]["after"]), f"{_ms(h['step_us']['delta'], True)} from {_ms(h['step_us']['before'])}"),
        ]),
        f'<p class="largest-change"><b>{H.e(largest_change_text(d))}</b></p>',
        H.h2(f"Warnings ({len(d['warnings'])})", "warnings"),
        H.warnings_list(d["warnings"]),
        H.h2("Loss budget terms, by size of change", "budget"),
        _budget_svg(d["loss_budget"]),
        H.table(["term", "before", "after", "delta"], [[r["term"], _pp(r["before"]), _pp(r["after"]), _pp(r["delta"], True)] for r in d["loss_budget"]]),
        H.h2("Per step", "steps"),
        H.table(["", "before", "after", "delta"],
                [[f"time: {H.PART_LABELS.get(k, k)}", _ms(v["before"]), _ms(v["after"]), _ms(v["delta"], True)] for k, v in d["time_us_per_step"].items()]
                + [[f"{p} FLOPs", H.si(v["before"], "FLOP"), H.si(v["after"], "FLOP"), H.si(v["delta"], "FLOP")] for p, v in d["flops_per_step"].items()]
                + [[f"{p} FLOPs per token", H.si(v["before"], "FLOP"), H.si(v["after"], "FLOP"), H.si(v["delta"], "FLOP")]
                   for p, v in (d.get("flops_per_token") or {}).items()]),
    ]
    if d["kernels"]:
        body += [H.h2("Kernels whose time per step moved most", "kernels"),
                 H.table(["kernel", "before", "after", "delta"],
                         [[r["name"], _ms(r["before_per_step"]), _ms(r["after_per_step"]), _ms(r["delta_per_step"], True)] for r in d["kernels"]],
                         name_cols=(0,))]
    if d["modules"]:
        body += [H.h2("Modules whose time per step moved most", "modules"),
                 H.table(["module", "before", "after", "delta", "recompute before", "recompute after"],
                         [[r["module"], _ms(r["before_per_step"]), _ms(r["after_per_step"]), _ms(r["delta_per_step"], True),
                           _ms(r["recompute_per_step"]["before"]), _ms(r["recompute_per_step"]["after"])] for r in d["modules"]],
                         name_cols=(0,))]
    for n in d["notes"]:
        body.append(f'<p class="mute">{H.e(n)}</p>')
    return H.page(title, body)


def _budget_svg(terms: list[dict], width: int = 900) -> str:
    """Paired bars per term: before (light) and after (dark), with the delta; exact values in data-*."""
    from traceflops.report import html as H

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
                       f'fill="{color}" fill-opacity="{0.4 if side == "before" else 1.0}"><title>{H.e(r["term"])} {side}: {_pp(v)}</title></rect>')
        out.append(f'<text x="{x1 + 8}" y="{y + 17}">{H.e(_pp(r["delta"], True))}</text>')
    out.append("</svg>")
    return '<div class="legend"><span>light: before</span><span>dark: after</span></div>' + "".join(out)
