"""One self-contained HTML file per analysis (or job): inline CSS and SVG, no script, no network.

A renderer: every number comes from the `Analysis` (or `Job`); this module
only lays them out. Every string that comes from a trace (kernel and op
names, module names, paths, warnings) goes through `html.escape`, and a
Content-Security-Policy forbids scripts and remote loads, so a hostile name
can neither run nor phone home. Trace metadata (`metadata`, environment
variables) is never copied in.

Charts:
- the loss budget as a waterfall: each term of `totals['loss_budget']` is a
  bar from the running sum to the running sum plus the term; the last bar is
  the total (100% when every term is known). Each bar carries its exact value
  in `data-value` and `<title>`, so tests (and people) can read it back.
- per step, a stacked bar of the time partition (`steps.time_*`).
- a roofline scatter of kernels (intensity vs achieved FLOP/s under the roofs
  of the device), from `traceflops.stages.roofline`.
- per module, kernel time split by phase with its recompute share
  (`traceflops.views.rollup.by_module`).
- tables: top kernels by time, most recoverable time, idle reasons, warnings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from html import escape
from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.version import VERSION
from traceflops.core.vocab import PARTITION, PHASES

MAX_POINTS = 1500  # roofline points drawn (the longest kernels)
MAX_STEPS = 64
MAX_ROWS = 25
NAME_CHARS = 140  # kernel names longer than this are cut (the full name is the cell's tooltip)

PART_COLORS = {
    "matmul": "#2b6cb0",
    "other_compute": "#4fd1c5",
    "memcpy": "#ecc94b",
    "communication_exposed": "#9f7aea",
    "idle": "#cbd5e0",
}
PART_LABELS = {
    "matmul": "matmul",
    "other_compute": "other compute",
    "memcpy": "memcpy/memset (exposed)",
    "communication_exposed": "communication (exposed)",
    "idle": "idle",
}
PHASE_COLORS = {
    "forward": "#3182ce",
    "backward": "#38a169",
    "recompute": "#e53e3e",
    "optimizer": "#d69e2e",
    "other": "#a0aec0",
}
TERM_COLORS = {
    "mfu": "#2f855a",
    "extra_executed": "#68d391",
    "recompute": "#e53e3e",
    "attention_mask_credit": "#a0aec0",
    "matmul_below_peak": "#2b6cb0",
    "matmul_flops_unknown": "#90cdf4",
    "non_matmul": "#4fd1c5",
    "memcpy_exposed": "#ecc94b",
    "communication_exposed": "#9f7aea",
    "idle": "#cbd5e0",
}
TERM_HELP = {
    "mfu": "model FLOPs at peak",
    "extra_executed": "executed FLOPs beyond the model's (not recompute)",
    "recompute": "recomputed forward FLOPs (activation checkpointing)",
    "attention_mask_credit": "FLOPs credited to masked attention that its kernels skipped",
    "matmul_below_peak": "matmul time beyond what its FLOPs take at peak",
    "matmul_flops_unknown": "matmul time whose FLOPs are unknown",
    "non_matmul": "other compute kernels",
    "memcpy_exposed": "memcpy/memset not under compute",
    "communication_exposed": "communication under nothing else",
    "idle": "device idle",
}
CLS_COLORS = {"matmul": "#2b6cb0", "other_compute": "#dd6b20"}

CSS = """
:root{--fg:#1a202c;--mute:#4a5568;--line:#e2e8f0;--bg:#fff;--card:#f7fafc}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg);margin:0;padding:24px 32px;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
p.sub,.mute{color:var(--mute)}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:14px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:150px}
.card .k{font-size:12px;color:var(--mute);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:24px;font-weight:600}
.card .s{font-size:12px;color:var(--mute)}
table{border-collapse:collapse;width:auto;min-width:560px;max-width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:right;vertical-align:top}
th{background:var(--card);font-weight:600}
td.l,th.l{text-align:left}
td:not(.name):not(.l){white-space:nowrap}
td.name{text-align:left;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;max-width:560px}
ul.warn li{color:#975a16;margin:2px 0;word-break:break-word}
svg{display:block;max-width:100%;height:auto}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#2d3748}
svg .axis{stroke:#a0aec0;stroke-width:1}
svg .grid{stroke:#edf2f7;stroke-width:1}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;color:var(--mute);margin:4px 0}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px;border-radius:2px}
footer{margin-top:32px;color:var(--mute);font-size:12px}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# --- formatting -------------------------------------------------------------


def e(v: Any) -> str:
    """Escaped text of any value (every trace string passes through here)."""
    return escape("" if v is None else str(v), quote=True)


def _f(v) -> float:
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _xy(v: float) -> str:
    return f"{v:.2f}"


# --- page -------------------------------------------------------------------


def page(title: str, body: Iterable[str]) -> str:
    """The document shell: CSP forbids scripts and every remote load."""
    pkg, version = "traceflops", VERSION
    return "".join(
        [
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width,initial-scale=1">',
            f"<title>{e(title)}</title><style>{CSS}</style></head><body>\n",
            *body,
            f"\n<footer>{e(pkg)} {e(version)} · self-contained report: no scripts, no network loads.</footer>",
            "</body></html>\n",
        ]
    )


def cards(items: list[tuple[str, str, str]]) -> str:
    out = ['<div class="cards">']
    for k, v, s in items:
        out.append(f'<div class="card"><div class="k">{e(k)}</div><div class="v">{e(v)}</div><div class="s">{e(s)}</div></div>')
    out.append("</div>")
    return "".join(out)


def legend(colors: dict[str, str], labels: dict[str, str] | None = None) -> str:
    labels = labels or {}
    items = "".join(f'<span><i style="background:{c}"></i>{e(labels.get(k, k))}</span>' for k, c in colors.items())
    return f'<div class="legend">{items}</div>'


def table(headers: list[str], rows: list[list[Any]], left: Iterable[int] = (0,), name_cols: Iterable[int] = ()) -> str:
    """A table of escaped cells; `name_cols` are monospace, wrapped (kernel names)."""
    left, name_cols = set(left), set(name_cols)
    cls = lambda i: ' class="name"' if i in name_cols else (' class="l"' if i in left else "")
    lcls = ' class="l"'
    head = "".join(f"<th{lcls if i in left or i in name_cols else ''}>{e(h)}</th>" for i, h in enumerate(headers))
    def cell(i: int, c: Any) -> str:
        if i in name_cols and c is not None and len(str(c)) > NAME_CHARS:
            return f'<td class="name" title="{e(c)}">{e(fmt.short(c, NAME_CHARS))}</td>'
        return f"<td{cls(i)}>{e(c)}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def warnings_list(warnings: list[str]) -> str:
    if not warnings:
        return '<p class="mute">No warnings.</p>'
    return '<ul class="warn">' + "".join(f"<li>{e(w)}</li>" for w in warnings) + "</ul>"


# --- charts -----------------------------------------------------------------


def waterfall_svg(budget: dict[str, float | None] | None, width: int = 900) -> str:
    """The loss budget as a horizontal waterfall; bars carry data-term / data-value (repr of the float)."""
    if not budget:
        return '<p class="mute">No loss budget (no step time, or no device activity).</p>'
    terms = list(budget.items())
    cum, spans = 0.0, []
    for k, v in terms:
        if v is None:
            spans.append((k, None, cum, cum))
            continue
        spans.append((k, v, cum, cum + v))
        cum += v
    known_all = all(v is not None for _, v in terms)
    lo = min([0.0, *(min(a, b) for _, _, a, b in spans)])
    hi = max([1.0, *(max(a, b) for _, _, a, b in spans)])
    lab, x0, x1 = 200, 210, width - 90
    row, top = 24, 22
    sx = lambda v: x0 + (v - lo) / (hi - lo) * (x1 - x0)
    n = len(spans) + 1
    h = top + n * row + 28
    out = [f'<svg class="waterfall" viewBox="0 0 {width} {h}" width="{width}" height="{h}" role="img" aria-label="loss budget waterfall">']
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        if lo <= g <= hi:
            x = _xy(sx(g))
            out.append(f'<line class="grid" x1="{x}" y1="{top - 6}" x2="{x}" y2="{top + n * row}"/>')
            out.append(f'<text x="{x}" y="{top - 9}" text-anchor="middle">{g:.0%}</text>')
    for i, (k, v, a, b) in enumerate(spans):
        y = top + i * row
        out.append(f'<text x="{lab}" y="{y + row * 0.68:.1f}" text-anchor="end">{e(k.replace("_", " "))}</text>')
        if v is None:
            out.append(f'<text class="wf-unknown" data-term="{e(k)}" x="{x0 + 4}" y="{y + row * 0.68:.1f}" fill="#718096">unknown</text>')
            continue
        xa, xb = sorted((sx(a), sx(b)))
        w = max(xb - xa, 0.75)
        color = TERM_COLORS.get(k, "#718096")
        tip = f"{k}: {fmt.pct(v, 2)} of peak × step time — {TERM_HELP.get(k, '')}"
        out.append(
            f'<rect class="wf" data-term="{e(k)}" data-value="{v!r}" x="{_xy(xa)}" y="{y + 3}" width="{_xy(w)}" height="{row - 6}" fill="{color}">'
            f"<title>{e(tip)}</title></rect>"
        )
        out.append(f'<text x="{_xy(xb + 6)}" y="{y + row * 0.68:.1f}">{fmt.pct(v, 2)}</text>')
        if i + 1 < len(spans):
            out.append(f'<line x1="{_xy(sx(b))}" y1="{y + row - 3}" x2="{_xy(sx(b))}" y2="{y + row + 3}" stroke="#718096" stroke-dasharray="2,2"/>')
    y = top + len(spans) * row
    total_label = "total" if known_all else "total (known terms)"
    out.append(f'<text x="{lab}" y="{y + row * 0.68:.1f}" text-anchor="end" font-weight="600">{total_label}</text>')
    out.append(
        f'<rect class="wf-total" data-value="{cum!r}" x="{_xy(sx(0))}" y="{y + 3}" width="{_xy(max(sx(cum) - sx(0), 0.75))}" height="{row - 6}" fill="#2d3748">'
        f"<title>sum of the terms: {fmt.pct(cum, 3)}</title></rect>"
    )
    out.append(f'<text x="{_xy(sx(max(cum, 0)) + 6)}" y="{y + row * 0.68:.1f}" font-weight="600">{fmt.pct(cum, 2)}</text>')
    out.append("</svg>")
    return "".join(out)


def stacked_rows_svg(rows: list[tuple[str, dict[str, float], str]], colors: dict[str, str], labels: dict[str, str] | None = None,
                     unit_us: bool = True, width: int = 900, css_class: str = "stacked") -> str:
    """Horizontal stacked bars, one per row (label, {part: value}, right-hand note), on a shared scale."""
    if not rows:
        return '<p class="mute">Nothing to show.</p>'
    labels = labels or {}
    lab, x0, x1, row = 190, 200, width - 280, 22
    total = max((sum(_f(v) for v in parts.values()) for _, parts, _ in rows), default=0.0) or 1.0
    h = len(rows) * row + 8
    out = [f'<svg class="{css_class}" viewBox="0 0 {width} {h}" width="{width}" height="{h}" role="img">']
    for i, (label, parts, note) in enumerate(rows):
        y = 4 + i * row
        out.append(f'<text x="{lab}" y="{y + row * 0.66:.1f}" text-anchor="end"><title>{e(label)}</title>{e(fmt.short(label, 28))}</text>')
        x = float(x0)
        whole = sum(_f(v) for v in parts.values())
        for k, c in colors.items():
            v = _f(parts.get(k))
            if v <= 0:
                continue
            w = v / total * (x1 - x0)
            amount = fmt.ms(v) if unit_us else f"{v:.4g}"
            tip = f"{label}: {labels.get(k, k)} {amount} ({fmt.pct(v / whole if whole else None)})"
            out.append(f'<rect data-part="{e(k)}" data-value="{v!r}" x="{_xy(x)}" y="{y + 3}" width="{_xy(max(w, 0.5))}" height="{row - 6}" fill="{c}"><title>{e(tip)}</title></rect>')
            x += w
        out.append(f'<text x="{_xy(x + 6)}" y="{y + row * 0.66:.1f}">{e(note)}</text>')
    out.append("</svg>")
    return "".join(out)


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def roofline_svg(roof: pl.DataFrame | None, width: int = 900, height: int = 440) -> str:
    """Kernels as points (FLOP/byte, FLOP/s), log-log, under each roof min(peak, intensity × bandwidth)."""
    if roof is None or roof.height == 0:
        return '<p class="mute">No device kernels in this trace: no roofline.</p>'
    pts = roof.filter(
        (pl.col("intensity") > 0) & (pl.col("roof_flops") > 0) & (pl.col("dur") > 0)
    ).with_columns(achieved=pl.col("roof_flops") / (pl.col("dur") * 1e-6))
    roofs = (
        roof.filter(pl.col("peak_flops").is_not_null() & pl.col("peak_bytes_per_s").is_not_null())
        .group_by("cls").agg(pl.col("peak_flops").first(), pl.col("peak_bytes_per_s").first()).sort("cls")
    )
    if pts.height == 0:
        return '<p class="mute">No kernel has both FLOPs and bytes known: no roofline points (shapes not recorded?).</p>'
    total = pts.height
    pts = pts.sort("dur", descending=True).head(MAX_POINTS)
    xs, ys = pts["intensity"].to_list(), pts["achieved"].to_list()
    peaks = roofs["peak_flops"].to_list()
    bws = roofs["peak_bytes_per_s"].to_list()
    xlo, xhi = min(xs) / 2, max([max(xs) * 2, *(p / b * 4 for p, b in zip(peaks, bws))])
    ylo, yhi = min(ys) / 2, max([max(ys), *peaks]) * 2
    ylo = min([ylo, *(xlo * b for b in bws)])
    ylo = max(ylo, yhi / 1e9)
    L, R, T, B = 70, width - 20, 16, height - 44
    lx = lambda v: L + (math.log10(v) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo)) * (R - L)
    ly = lambda v: B - (math.log10(max(v, ylo)) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) * (B - T)
    out = [f'<svg class="roofline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="roofline">']
    for t in _log_ticks(xlo, xhi):
        if xlo <= t <= xhi:
            out.append(f'<line class="grid" x1="{_xy(lx(t))}" y1="{T}" x2="{_xy(lx(t))}" y2="{B}"/><text x="{_xy(lx(t))}" y="{B + 16}" text-anchor="middle">{t:g}</text>')
    for t in _log_ticks(ylo, yhi):
        if ylo <= t <= yhi:
            out.append(f'<line class="grid" x1="{L}" y1="{_xy(ly(t))}" x2="{R}" y2="{_xy(ly(t))}"/><text x="{L - 6}" y="{_xy(ly(t) + 4)}" text-anchor="end">{e(fmt.si(t))}</text>')
    out.append(f'<line class="axis" x1="{L}" y1="{B}" x2="{R}" y2="{B}"/><line class="axis" x1="{L}" y1="{T}" x2="{L}" y2="{B}"/>')
    out.append(f'<text x="{(L + R) / 2}" y="{height - 8}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>')
    out.append(f'<text transform="translate(14,{(T + B) / 2}) rotate(-90)" text-anchor="middle">achieved FLOP/s</text>')
    for cls, p, b in zip(roofs["cls"].to_list(), peaks, bws):
        ridge = p / b
        xa = xlo
        pts_line = [(xa, xa * b), (ridge, p), (xhi, p)] if ridge > xlo else [(xlo, p), (xhi, p)]
        path = " ".join(f"{_xy(lx(x))},{_xy(ly(y))}" for x, y in pts_line)
        color = CLS_COLORS.get(cls, "#4a5568")
        what = "tensor peak" if cls == "matmul" else "vector fp32 peak"
        out.append(f'<polyline class="roof" points="{path}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="6,3"><title>{e(cls)} roof: {e(what)} {e(fmt.si(p, "FLOP/s"))}, HBM {e(fmt.si(b, "B/s"))}, ridge {ridge:.3g} FLOP/byte</title></polyline>')
        out.append(f'<text x="{_xy(lx(max(ridge, xlo)) + 4)}" y="{_xy(ly(p) - 5)}" fill="{color}">{e(what)} {e(fmt.si(p, "FLOP/s"))}</text>')
    for r in pts.iter_rows(named=True):
        color = CLS_COLORS.get(r["cls"], "#4a5568")
        tip = f"{r['name']} — {r['cls']}, {r['dur']:.1f} µs, {r['intensity']:.3g} FLOP/B, {fmt.si(r['achieved'], 'FLOP/s')}, {r['bound'] or 'bound unknown'}"
        out.append(f'<circle cx="{_xy(lx(r["intensity"]))}" cy="{_xy(ly(r["achieved"]))}" r="3" fill="{color}" fill-opacity="0.55"><title>{e(tip)}</title></circle>')
    out.append("</svg>")
    note = f"{pts.height} of {total} kernels with known FLOPs and bytes shown (the longest)." if total > pts.height else f"{total} kernels with known FLOPs and bytes."
    if roofs.height == 0:
        note += " No roof: the device's peak or memory bandwidth is not in the hardware table (give --hardware)."
    return out[0] + "".join(out[1:]) + legend({k: v for k, v in CLS_COLORS.items()}) + f'<p class="mute">{e(note)}</p>'


# --- sections of one analysis -----------------------------------------------


def headline(a: Analysis) -> str:
    t, hw, m = a.totals, a.hardware or {}, a.model or {}
    peak = hw.get("peak_flops")
    items = [
        ("MFU", fmt.pct(t.get("mfu")), f"no attention {fmt.pct(t.get('mfu_no_attention'))}"),
        ("HFU", fmt.pct(t.get("hfu")), "executed FLOPs, recompute included"),
        ("band", m.get("band") or "—", "dense training rule of thumb" if m.get("band") else "not applicable"),
        ("peak", fmt.si(peak, "FLOP/s") if peak else "unknown", f"{hw.get('name') or 'hardware unknown'}, dense {hw.get('precision') or '?'}"),
        ("model FLOPs", str(m.get("source") or "—"), f"{m.get('mode') or ''}; coverage {fmt.pct(t.get('flops_coverage'))}"),
        ("wall", fmt.ms(t.get("wall_us")), f"{a.steps.height} step(s)"),
    ]
    if m.get("seq_len") is not None:
        items.append(("T", str(m["seq_len"]), f"sequence length, from the {m.get('seq_len_source')}; "
                                                  f"{m.get('tokens_per_step')} tokens per step"))
    out = cards(items)
    if t.get("mfu_by_precision"):
        out += '<p class="sub">MFU by peak: ' + e(", ".join(f"{p} {fmt.pct(v)}" for p, v in t["mfu_by_precision"].items())) + "</p>"
    if m.get("note"):
        out += f'<p class="sub">{e(m["note"])}</p>'
    if hw.get("source"):
        out += f'<p class="sub">Peak source: {e(hw["source"])}</p>'
    return out


def phase_flops_table(a: Analysis) -> str:
    t = a.totals
    rows = [[p, t["matmul_count"][p], fmt.si(t["flops"][p], "FLOP")] for p in PHASES]
    rows.append(["executed", sum(t["matmul_count"].values()), fmt.si(t["flops"]["executed"], "FLOP")])
    return table(["phase", "matmul ops", "FLOPs"], rows)


def steps_svg(a: Analysis) -> str:
    rows = []
    for s in a.steps.head(MAX_STEPS).iter_rows(named=True):
        parts = {c: s.get(f"time_{c}") for c in PARTITION}
        note = f"{fmt.ms(s['window'])} · MFU {fmt.pct(s.get('mfu'))}" + (" (last)" if s.get("last") else "")
        rows.append((s["name"], parts, note))
    more = f'<p class="mute">First {MAX_STEPS} of {a.steps.height} steps.</p>' if a.steps.height > MAX_STEPS else ""
    return legend(PART_COLORS, PART_LABELS) + stacked_rows_svg(rows, PART_COLORS, PART_LABELS, css_class="steps") + more


def time_table(a: Analysis) -> str:
    t = a.totals
    wall = t.get("wall_us") or 0.0
    rows = [[PART_LABELS[k], fmt.ms(v), fmt.pct(v / wall if wall else None)] for k, v in (t.get("time_us") or {}).items()]
    out = table(["time class", "time", "share of wall"], rows)
    ov = t.get("overlay_us") or {}
    if ov:
        out += '<p class="sub">Overlays (cut across the partition): ' + e(", ".join(f"{k.replace('_', ' ')} {fmt.ms(v)}" for k, v in ov.items())) + "</p>"
    ir = t.get("idle_us_by_reason")
    if ir and any(ir.values()):
        out += table(["idle reason", "time"], [[k.replace("_", " "), fmt.ms(v)] for k, v in ir.items() if v])
    return out


def modules_svg(a: Analysis) -> str:
    from traceflops.report.tables import by_module_frame

    bm = by_module_frame(a)
    if bm is None or bm.height == 0:
        return '<p class="mute">No device kernels in this trace: no per-module roll-up.</p>'
    top = bm.filter(pl.col("module").is_not_null()).sort("time_us", descending=True).head(20)
    rows = [
        (r["module"], {p: r[f"time_{p}"] for p in PHASES}, f"{fmt.ms(r['time_us'])} · recompute {fmt.pct(r['recompute_share'])}")
        for r in top.iter_rows(named=True)
    ]
    rec = bm["time_recompute"].sum()
    note = f'<p class="sub">Recompute: {e(fmt.ms(rec))} of {e(fmt.ms(bm["time_us"].sum()))} kernel time. Top {len(rows)} of {bm.height} modules by kernel time.</p>'
    return legend(PHASE_COLORS) + stacked_rows_svg(rows, PHASE_COLORS, css_class="modules") + note


def kernels_tables(a: Analysis) -> str:
    from traceflops.report.tables import by_kernel_frame, top_kernels_frame

    bk = by_kernel_frame(a)
    if bk is None or bk.height == 0:
        return '<p class="mute">No device kernels in this trace.</p>'
    rows = [
        [r["name"], r["cls"], r["count"], fmt.ms(r["total_us"]), fmt.pct(r["share"]), f"{r['mean_us']:.1f}",
         "—" if r["tflops"] is None else f"{r['tflops']:.1f}", ", ".join(r["phases"] or [])]
        for r in bk.head(MAX_ROWS).iter_rows(named=True)
    ]
    out = table(["kernel", "class", "count", "time", "share", "mean µs", "TFLOP/s", "phases"], rows, left=(1, 7), name_cols=(0,))
    tk = top_kernels_frame(a)
    if tk is not None and tk.height and tk["recoverable_us"].sum():
        rows = [
            [r["name"], r["cls"], r["bound"] or "—", r["count"], fmt.ms(r["dur_us"]), fmt.ms(r["recoverable_us"]),
             "—" if r["median_intensity"] is None else f"{r['median_intensity']:.3g}",
             fmt.pct(r["median_flops_frac"]), fmt.pct(r["median_bw_frac"])]
            for r in tk.head(MAX_ROWS).iter_rows(named=True)
        ]
        out += "<h3>Most recoverable time (roofline floor)</h3>"
        out += table(["kernel", "class", "bound", "count", "time", "recoverable", "FLOP/B", "of peak FLOP/s", "of HBM B/s"], rows,
                     left=(1, 2), name_cols=(0,))
    return out


def _where(a: Analysis) -> str:
    parts = [f"{a.meta.get('format') or 'unknown'} trace"]
    if a.meta.get("rank") is not None:
        parts.append(f"rank {a.meta['rank']}")
    if a.meta.get("world_size") is not None:
        parts.append(f"world size {a.meta['world_size']}")
    return " · ".join(parts)


def h2(title: str, anchor: str) -> str:
    return f'<h2 id="{e(anchor)}">{e(title)}</h2>'


def render_html(a: Analysis, title: str | None = None) -> str:
    """The single-analysis report as one self-contained HTML document."""
    from traceflops.report.tables import roofline_frame

    path = a.meta.get("path")
    title = title or f"traceflops: {path}"
    lb = (a.totals or {}).get("loss_budget")
    body = [
        f"<h1>{e(title)}</h1>",
        f'<p class="sub">{e(_where(a))}</p>',
        headline(a),
        h2(f"Warnings ({len(a.warnings)})", "warnings"),
        warnings_list(a.warnings),
        h2("Where peak × time went (loss budget)", "budget"),
        '<p class="sub">Fractions of peak FLOP/s × step time, summing to 100%: the first terms are FLOPs the device did, the rest time it spent not doing them.</p>',
        waterfall_svg(lb),
        h2("Time partition per step", "steps"),
        steps_svg(a),
        time_table(a),
        h2("Matmul FLOPs by phase", "phases"),
        phase_flops_table(a),
        h2("Roofline", "roofline"),
        roofline_svg(roofline_frame(a)),
        h2("Recompute per module", "modules"),
        modules_svg(a),
        h2("Top kernels", "kernels"),
        kernels_tables(a),
    ]
    if a.outside_steps:
        o = a.outside_steps
        body.append(f'<p class="sub">Outside every step: {e(o["kernels"])} device activities, {e(fmt.ms(o["device_us"]))} (not in the totals).</p>')
    return page(title, body)


# --- job ----------------------------------------------------------------------


def render_job_html(job, title: str | None = None) -> str:
    """The job view (many ranks): job MFU/HFU, per-rank bars, steps, stragglers, collectives."""
    t = job.totals
    title = title or f"traceflops: job of {t.get('world_size')} ranks"
    first = job.summaries[0] if job.summaries else None
    hw = (first.hardware if first else None) or {}
    ck = job.clock or {}
    items = [
        ("job MFU", fmt.pct(t.get("mfu")), "step time = slowest rank's"),
        ("job HFU", fmt.pct(t.get("hfu")), f"devices = world size {t.get('world_size')}"),
        ("peak", fmt.si(hw.get("peak_flops"), "FLOP/s") if hw.get("peak_flops") else "unknown", f"{hw.get('name') or '?'}, dense {hw.get('precision') or '?'}"),
        ("wall", fmt.ms(t.get("wall_us")), f"{job.steps.height if job.steps is not None else 0} step(s), {len(job.summaries)} traces"),
        ("arrival skew", fmt.ms(t.get("arrival_skew_us")), f"transfer {fmt.ms(t.get('transfer_us'))}"),
        ("clock residual", "—" if ck.get("residual_skew_us") is None else f"{ck['residual_skew_us']:.2f} µs", f"{t.get('collectives_matched', 0)} matched collectives"),
    ]
    body = [f"<h1>{e(title)}</h1>", cards(items), f"<h2>Warnings ({len(job.warnings)})</h2>", warnings_list(job.warnings)]
    body.append("<h2>Per rank: time partition</h2>")
    rows = []
    for r in job.ranks.iter_rows(named=True):
        parts = {c: r.get(f"time_{c}") for c in PARTITION}
        rows.append((f"rank {r['rank']}", parts, f"{fmt.ms(r['wall_us'])} · device MFU {fmt.pct(r['device_mfu'])} · HFU {fmt.pct(r['hfu'])}"))
    body.append(legend(PART_COLORS, PART_LABELS) + stacked_rows_svg(rows, PART_COLORS, PART_LABELS, css_class="ranks"))
    body.append(table(["rank", "trace", "wall", "device MFU", "HFU", "executed FLOPs", "recompute FLOPs"],
                      [[r["rank"], r["path"], fmt.ms(r["wall_us"]), fmt.pct(r["device_mfu"]), fmt.pct(r["hfu"]), fmt.si(r["executed_flops"], "FLOP"),
                        fmt.si(r["recompute_flops"], "FLOP")] for r in job.ranks.iter_rows(named=True)], left=(1,), name_cols=(1,)))
    budgets = [(s.rank, (s.totals or {}).get("loss_budget")) for s in job.summaries]
    if any(b for _, b in budgets):
        terms = next(list(b) for _, b in budgets if b)
        body.append("<h2>Loss budget per rank</h2>")
        body.append(table(["rank", *[k.replace("_", " ") for k in terms]],
                          [[r, *[fmt.pct((b or {}).get(k)) for k in terms]] for r, b in budgets]))
    if job.steps is not None and job.steps.height:
        body.append("<h2>Job steps</h2>")
        body.append(table(["step", "step time (slowest rank)", "slowest rank", "ranks", "MFU", "HFU"],
                          [[r["step"], fmt.ms(r["step_us"]), r["slowest_rank"], r["ranks"], fmt.pct(r["mfu"]), fmt.pct(r["hfu"])]
                           for r in job.steps.iter_rows(named=True)]))
    if job.stragglers is not None and job.stragglers.height:
        body.append("<h2>Stragglers (the rank the others waited for)</h2>")
        body.append(table(["step", "rank", "others waited", "why"],
                          [[r["step"], r["rank"], fmt.ms(r["wait_us"]), r["reason"]] for r in job.stragglers.iter_rows(named=True)]))
    if job.collectives is not None and job.collectives.height:
        c = job.collectives.sort("arrival_skew_us", descending=True).head(MAX_ROWS)
        body.append("<h2>Collectives with the most arrival skew</h2>")
        body.append(table(["group", "seq", "kind", "step", "bytes", "ranks", "arrival skew", "last rank", "transfer", "bus GB/s"],
                          [[r["pg"], r["seq"], r["kind"], r["step"], fmt.si(r["bytes"], "B"), r["ranks"], fmt.ms(r["arrival_skew_us"]), r["last_rank"],
                            fmt.ms(r["transfer_us"]), "—" if r.get("busbw_gbps") is None else f"{r['busbw_gbps']:.1f}"] for r in c.iter_rows(named=True)],
                          left=(0, 2)))
    if job.pipeline is not None and job.pipeline.height:
        body.append("<h2>Pipeline bubbles (P2P time)</h2>")
        body.append(table(["rank", "step", "P2P", "share of step", "ideal bubble"],
                          [[r["rank"], r["step"], fmt.ms(r["p2p_us"]), fmt.pct(r["bubble"]), fmt.pct(r["ideal_bubble"])] for r in job.pipeline.iter_rows(named=True)]))
    return page(title, body)
