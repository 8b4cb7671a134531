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
- what to try: `Analysis.advice`, each item with its evidence, remedies and
  what to record next time; GEMM shapes with their wave quantization
  (`by_gemm_shape`); step variance, outliers and warm-up (`step_stats`).
- the critical path (`Analysis.path_summary`, from `views.critical_path`; a
  caller may pass its own: renderers import no view): a stacked bar per step
  of what bounded it, its kinds explained, and the longest stretches.
- the loss budget's terms each with a visible one-line explanation
  (`TERM_HELP`), in the single-trace, job and diff reports alike.

Numbers a test (or a person) may want to read back carry their exact value in
`data-value` (the float's repr) next to the formatted text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from html import escape
from typing import Any, NamedTuple

import polars as pl

from traceflops.core import fmt
from traceflops.core.results import Analysis
from traceflops.core.version import VERSION
from traceflops.core.vocab import OUTLIER_RULES, PARTITION, PHASES

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
TERM_HELP = {  # one line per loss-budget term, shown beside it (not only as a tooltip)
    "mfu": "the model's own FLOPs at peak: the useful work (this term is the MFU)",
    "extra_executed": "FLOPs the device executed beyond the model's count (not recompute): padding, extra layers, uncounted work",
    "recompute": "forward FLOPs run again in backward (activation checkpointing): memory bought with compute",
    "attention_mask_credit": "FLOPs the model count credits to masked attention that its kernels skipped (never positive)",
    "matmul_below_peak": "matmul time beyond what its FLOPs would take at peak: shapes, dtypes, tiles, small GEMMs",
    "matmul_flops_unknown": "matmul time whose FLOPs are unknown (no recorded shapes): cannot be split further",
    "non_matmul": "time in other compute kernels (elementwise, normalization, softmax, reductions): fusion candidates",
    "memcpy_exposed": "copies and memsets with no compute running beside them",
    "communication_exposed": "collectives with nothing else running: communication not overlapped with compute",
    "idle": "the device did nothing: host-bound, input pipeline, synchronisations or gaps between steps",
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
td:not(.name):not(.l):not(.explain){white-space:nowrap}
td.name{text-align:left;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;max-width:560px}
ul.warn li{color:#975a16;margin:2px 0;word-break:break-word}
svg{display:block;max-width:100%;height:auto}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#2d3748}
svg .axis{stroke:#a0aec0;stroke-width:1}
svg .grid{stroke:#edf2f7;stroke-width:1}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;color:var(--mute);margin:4px 0}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px;border-radius:2px}
footer{margin-top:32px;color:var(--mute);font-size:12px}
h3{font-size:15px;margin:18px 0 6px}
.advice{border:1px solid var(--line);border-left:4px solid #dd6b20;border-radius:6px;padding:8px 14px;margin:10px 0;background:var(--card)}
.advice h3{margin:2px 0 4px}
.advice ul,.advice ol{margin:4px 0 6px;padding-left:22px}
.advice li{margin:2px 0;word-break:break-word}
.advice .lbl{font-size:12px;color:var(--mute);text-transform:uppercase;letter-spacing:.04em;margin-top:6px}
td.explain{text-align:left;color:var(--mute);white-space:normal;min-width:240px;max-width:420px}
table.gemm-shapes td.explain{min-width:200px;max-width:300px}
.pair{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
details summary{cursor:pointer;color:var(--mute);margin:6px 0}
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
            f"<title>{e(fmt.printable(title))}</title><style>{CSS}</style></head><body>\n",
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


class Num(NamedTuple):
    """A formatted number that keeps its exact value (`data-value`, the repr) for whoever reads the page back."""

    text: str
    value: Any
    key: str = ""

    def attrs(self) -> str:
        key = f' data-key="{e(self.key)}"' if self.key else ""
        return key + ("" if self.value is None else f' data-value="{e(repr(self.value))}"')


def num(text: str, value: Any, key: str = "") -> Num:
    return Num(text, value, key)


def span(n: Num, cls: str = "num") -> str:
    """A number inline in running text."""
    return f'<span class="{cls}"{n.attrs()}>{e(n.text)}</span>'


def table(headers: list[str], rows: list[list[Any]], left: Iterable[int] = (0,), name_cols: Iterable[int] = (), css_class: str = "",
          explain_last: bool = False) -> str:
    """A table of escaped cells; `name_cols` are monospace, wrapped (kernel names); `Num` cells keep their value;
    `explain_last`: the last column is a one-line explanation (wrapped, muted)."""
    left, name_cols = set(left), set(name_cols)
    explain = len(headers) - 1 if explain_last else -1
    cls = lambda i: ' class="explain"' if i == explain else ' class="name"' if i in name_cols else (' class="l"' if i in left else "")
    lcls = ' class="l"'
    head = "".join(f"<th{lcls if i in left or i in name_cols or i == explain else ''}>{e(h)}</th>" for i, h in enumerate(headers))
    def cell(i: int, c: Any) -> str:
        if isinstance(c, Num):
            return f"<td{cls(i)}{c.attrs()}>{e(c.text)}</td>"
        if i in name_cols and c is not None and len(str(c)) > NAME_CHARS:
            return f'<td class="name" title="{e(c)}">{e(fmt.short(c, NAME_CHARS))}</td>'
        return f"<td{cls(i)}>{e(c)}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(r)) + "</tr>" for r in rows)
    tcls = f' class="{e(css_class)}"' if css_class else ""
    return f"<table{tcls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
        out.append(f'<g class="bar" data-label="{e(label)}">')
        for k, c in colors.items():
            v = _f(parts.get(k))
            if v <= 0:
                continue
            w = v / total * (x1 - x0)
            amount = fmt.ms(v) if unit_us else f"{v:.4g}"
            tip = f"{label}: {labels.get(k, k)} {amount} ({fmt.pct(v / whole if whole else None)})"
            out.append(f'<rect data-part="{e(k)}" data-value="{v!r}" x="{_xy(x)}" y="{y + 3}" width="{_xy(max(w, 0.5))}" height="{row - 6}" fill="{c}"><title>{e(tip)}</title></rect>')
            x += w
        out.append("</g>")
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



def _steps_counted(a) -> str:
    """'N step(s)', or 'N of M steps counted' when the totals leave some out (asked, cut, or the unbounded last)."""
    sc = a.totals.get("step_count") or {}
    counted, have = sc.get("counted", a.steps.height), sc.get("in_trace", a.steps.height)
    return f"{counted} step(s)" if counted == have else f"{counted} of {have} steps counted"

def headline(a: Analysis) -> str:
    t, hw, m = a.totals, a.hardware or {}, a.model or {}
    peak = hw.get("peak_flops")
    items = [
        ("MFU", fmt.pct(t.get("mfu")), f"no attention {fmt.pct(t.get('mfu_no_attention'))}"),
        ("HFU", fmt.pct(t.get("hfu")), "executed FLOPs, recompute included"),
        ("band", m.get("band") or "—", "dense training rule of thumb" if m.get("band") else "not applicable"),
        ("peak", fmt.si(peak, "FLOP/s") if peak else "unknown", f"{hw.get('name') or 'hardware unknown'}, dense {hw.get('precision') or '?'}"),
        ("model FLOPs", str(m.get("source") or "—"), f"{m.get('mode') or ''}; coverage {fmt.pct(t.get('flops_coverage'))}"),
        ("wall", fmt.ms(t.get("wall_us")), _steps_counted(a)),
    ]
    if m.get("seq_len") is not None:
        items.append(("T", str(m["seq_len"]), (f"sequence length, from the {m.get('seq_len_source')}; "
                                                   f"{m.get('tokens_per_step')} tokens per step")))
    out = cards(items)
    if t.get("flops_lower_bound"):
        out += (f'<p class="sub"><b>FLOPs known for only {e(fmt.pct(t.get("flops_coverage")))} of matmul time: {fmt.bound_words(t)}.'
                '</b> Largest matmul kernels with unknown FLOPs: ' + e("; ".join(
                    f"{fmt.ms(k['time_us'])} in {k['count']} × {fmt.short(k['name'], 80)} ({k['why']})"
                    for k in t.get("unknown_matmul_kernels") or [])) + "</p>")
    if t.get("mfu_by_precision"):
        out += ('<p class="sub">MFU by peak: ' + e(", ".join(f"{p} {fmt.pct(v)}" for p, v in t["mfu_by_precision"].items())
                                                    + fmt.precision_words(t["mfu_by_precision"])) + "</p>")
    if t.get("loss_budget_unknown"):
        out += f'<p class="sub"><b>{e(fmt.budget_unknown_words(t["loss_budget_unknown"]))}</b></p>'
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


def budget_terms_table(lb: dict[str, float | None] | None) -> str:
    """Each loss-budget term, its value and what it means, as visible text."""
    if not lb:
        return ""
    rows = [[k.replace("_", " "), num("unknown" if v is None else fmt.pct(v, 2), v, k), TERM_HELP.get(k, "")] for k, v in lb.items()]
    return table(["term", "share of peak × step time", "what it means"], rows, css_class="budget-terms", explain_last=True)


def advice_section(items: list[dict[str, Any]] | None) -> str:
    """What to try, largest recoverable share first: each item's numbers, evidence, remedies, what to record next time."""
    if not items:
        return '<p class="mute">No advice: nothing in this trace stood out (or there was no step time to share out).</p>'
    out = []
    for i, it in enumerate(items, 1):
        share = it.get("share")
        head = [span(num(fmt.pct(share, 1), share, "share")) + f" {e(it.get('unit') or 'of step time')}"]
        if it.get("recoverable_us") is not None:
            head.append(span(num(fmt.ms(it["recoverable_us"]), it["recoverable_us"], "recoverable_us")))
        if it.get("mfu_after") is not None:
            head.append("MFU if recovered " + span(num(fmt.pct(it["mfu_after"]), it["mfu_after"], "mfu_after")))
        if it.get("term"):
            head.append(f"budget term: {e(it['term'].replace('_', ' '))}")
        parts = [f'<div class="advice" data-kind="{e(it.get("kind"))}" data-rank="{i}">',
                 f"<h3>{i}. {e(it.get('title'))}</h3>", f'<p class="sub">{" · ".join(head)}</p>']
        for label, key, tag in (("evidence", "evidence", "ul"), ("what to try", "remedies", "ol"), ("record next time", "record", "ul")):
            lines = it.get(key) or []
            if lines:
                parts.append(f'<div class="lbl">{e(label)}</div><{tag} class="{key}">' + "".join(f"<li>{e(x)}</li>" for x in lines) + f"</{tag}>")
        if it.get("cause_known") is False:
            parts.append('<p class="mute">The trace cannot tell the cause: record what is listed above next time.</p>')
        parts.append("</div>")
        out.append("".join(parts))
    return "".join(out)


GEMM_COLS = ("M", "N", "K", "batch")


def gemm_section(g: pl.DataFrame | None) -> str:
    """GEMM shapes by time, with their tiles, waves and the wave-quantization hint."""
    if g is None or g.height == 0:
        return '<p class="mute">No GEMM shapes: no matmul op with recorded input shapes (profile with record_shapes=True).</p>'
    rows = []
    for r in g.head(MAX_ROWS).iter_rows(named=True):
        rows.append([
            *[num(str(r[c]), r[c], c) for c in GEMM_COLS], r.get("dtype") or "—", ", ".join(r.get("ops") or []),
            num(str(r["count"]), r["count"], "count"), num(fmt.ms(r["time_us"]), r["time_us"], "time_us"),
            num(fmt.pct(r["share"]), r["share"], "share"),
            num("—" if r.get("tflops") is None else f"{r['tflops']:.1f}", r.get("tflops"), "tflops"),
            num("—" if r.get("tiles") is None else str(r["tiles"]), r.get("tiles"), "tiles"),
            num("—" if r.get("waves") is None else f"{r['waves']:.2f}", r.get("waves"), "waves"),
            num(fmt.pct(r.get("wave_efficiency")), r.get("wave_efficiency"), "wave_efficiency"),
            num(fmt.pct(r.get("last_wave_fill")), r.get("last_wave_fill"), "last_wave_fill"),
            r.get("hint") or "",
        ])
    out = table(["M", "N", "K", "batch", "dtype", "ops", "calls", "time", "share", "TFLOP/s", "tiles", "waves",
                 "wave eff.", "last wave", "hint"], rows, left=(4, 5), css_class="gemm-shapes", explain_last=True)
    hinted = int(g["wave_hint"].sum()) if "wave_hint" in g.columns else 0
    more = f" Top {MAX_ROWS} of {g.height} shapes by time." if g.height > MAX_ROWS else ""
    note = (f"{hinted} of {g.height} shapes lose time to wave quantization (the last wave of output tiles leaves compute units idle)."
            if hinted else "No shape loses much to wave quantization." if g["waves"].null_count() < g.height
            else "Waves unknown: the device's compute-unit count is not known (name it with --hardware).")
    note += (" Share: of matmul time. Waves: output tiles over the device's compute units; wave efficiency: the share of"
             " compute-unit slots the waves fill; last wave: how full the final wave is.")
    return out + f'<p class="sub">{e(note + more)}</p>'


def step_stats_section(ss: dict[str, Any] | None) -> str:
    """How steady the steps are: spread, outlier steps (with the time class that moved) and warm-up steps."""
    if not ss or not ss.get("count"):
        return '<p class="mute">No steps: no step statistics.</p>'
    cv = ss.get("cv")
    out = table(["steps", "mean", "median", "std dev", "coefficient of variation", "median abs. deviation"], [[
        num(str(ss["count"]), ss["count"], "count"), num(fmt.ms(ss.get("mean_us")), ss.get("mean_us"), "mean_us"),
        num(fmt.ms(ss.get("median_us")), ss.get("median_us"), "median_us"),
        num("—" if ss.get("std_us") is None else fmt.ms(ss["std_us"]), ss.get("std_us"), "std_us"),
        num(fmt.pct(cv), cv, "cv"), num(fmt.ms(ss.get("mad_us")), ss.get("mad_us"), "mad_us")]], left=(), css_class="step-spread")
    outl, warm = ss.get("outliers") or [], ss.get("warmup") or []
    if outl:
        out += "<h3>Outlier steps</h3>" + table(
            ["step", "window", "from median", "time class that moved", "its change", "rule"],
            [[num(str(o["step"]), o["step"], "step"), num(fmt.ms(o["window_us"]), o["window_us"], "window_us"),
              num(fmt.pct(o.get("deviation_frac")), o.get("deviation_frac"), "deviation_frac"),
              PART_LABELS.get(o.get("term"), o.get("term") or "—"),
              num("—" if o.get("term_delta_us") is None else fmt.ms(o["term_delta_us"], True), o.get("term_delta_us"), "term_delta_us"),
              ", ".join(OUTLIER_RULES.get(x, x) for x in o.get("rules") or []) + (" (warm-up)" if o.get("warmup") else "") + (" (last)" if o.get("last") else "")]
             for o in outl], left=(3, 5), css_class="step-outliers")
    else:
        out += '<p class="mute">No outlier step.</p>'
    if warm:
        out += "<h3>Warm-up steps</h3>" + table(["step", "window", "× median"],
                                                [[num(str(w["step"]), w["step"], "step"), num(fmt.ms(w["window_us"]), w["window_us"], "window_us"),
                                                  num(f"{w['ratio']:.2f}×", w["ratio"], "ratio")] for w in warm], css_class="step-warmup")
    else:
        out += '<p class="mute">No warm-up step.</p>'
    return out


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


def critical_path_section(ps: dict[str, Any] | None) -> str:
    """Per step, what bounded it by kind (a stacked bar whose length is the step's window), the kinds explained, the longest stretches."""
    if ps is None:
        return '<p class="mute">No critical path in this analysis (made by an older traceflops: analyse the trace again).</p>'
    if not ps.get("available"):
        return f'<p class="mute cp-why">No critical path: {e(ps.get("why"))}</p>'
    kinds = list(ps.get("us") or {})
    colors = {k: PATH_COLORS.get(k, "#718096") for k in kinds}
    labels = {k: k.replace("_", " ") for k in kinds}
    steps = ps.get("steps") or []
    rows = [(f"step {s['step']}", s["us"], f"{fmt.ms(s['length_us'])}") for s in steps[:MAX_STEPS]]
    out = legend(colors, labels) + stacked_rows_svg(rows, colors, labels, css_class="critical-path")
    if len(steps) > MAX_STEPS:
        out += f'<p class="mute">First {MAX_STEPS} of {len(steps)} steps.</p>'
    share, meaning = ps.get("share") or {}, ps.get("meaning") or {}
    out += table(["kind", "on the path", "share", "what it means"],
                                   [[labels[k], num(fmt.ms(ps["us"][k]), ps["us"][k], k), num(fmt.pct(share.get(k)), share.get(k), f"{k}:share"), meaning.get(k, "")]
                                    for k in kinds], css_class="cp-kinds", explain_last=True)
    if ps.get("note"):
        out += f'<p class="sub">{e(ps["note"])}</p>'
    if ps.get("top"):
        out += "<h3>Longest stretches on the path</h3>" + _segments_table(ps["top"], "cp-top")
    if steps:
        per = "".join(f"<h3>step {e(s['step'])}</h3>" + _segments_table(s["top"], "cp-step-top") for s in steps[:MAX_STEPS] if s.get("top"))
        if per:
            out += f"<details><summary>Longest stretches per step</summary>{per}</details>"
    return out


def _segments_table(top: list[dict[str, Any]], css_class: str) -> str:
    return table(["kind", "name", "time", "segments"],
                 [[t["kind"].replace("_", " "), t["name"], num(fmt.ms(t["us"]), t["us"], "us"), num(str(t["segments"]), t["segments"], "segments")]
                  for t in top], name_cols=(1,), css_class=css_class)


def _where(a: Analysis) -> str:
    parts = [f"{a.meta.get('format') or 'unknown'} trace"]
    if a.meta.get("rank") is not None:
        parts.append(f"rank {a.meta['rank']}")
    if a.meta.get("world_size") is not None:
        parts.append(f"world size {a.meta['world_size']}")
    return " · ".join(parts)


def h2(title: str, anchor: str) -> str:
    return f'<h2 id="{e(anchor)}">{e(title)}</h2>'


def render_html(a: Analysis, title: str | None = None, critical_path: dict[str, Any] | None = None) -> str:
    """The single-analysis report as one self-contained HTML document.

    `critical_path` is `views.critical_path.path_summary(a)` (a renderer imports no view): given by the caller, else
    the Analysis' own `path_summary` (the pipeline's, as the JSON report has it).
    """
    from traceflops.report.tables import roofline_frame

    path = a.meta.get("path")
    title = fmt.printable(title or f"traceflops: {path}")  # control characters visible, as the terminal shows them
    lb = (a.totals or {}).get("loss_budget")
    body = [
        f"<h1>{e(title)}</h1>",
        f'<p class="sub">{e(_where(a))}</p>',
        headline(a),
        h2(f"Warnings ({len(a.warnings)})", "warnings"),
        warnings_list(a.warnings),
        h2("Where peak × time went (loss budget)", "budget"),
        ('<p class="sub">Fractions of peak FLOP/s × step time, summing to 100%: the first terms are FLOPs the device did, the rest time it '
         'spent not doing them.</p>' if not a.totals.get("loss_budget_unknown") else
         f'<p class="sub">Fractions of peak FLOP/s × step time: {e(fmt.budget_unknown_words(a.totals["loss_budget_unknown"]))}.</p>'),
        waterfall_svg(lb),
        budget_terms_table(lb),
        h2("What bounded each step (critical path)", "critical-path"),
        '<p class="sub">Walked back from each step\'s end: the chain of work the step waited on, by kind; each bar is the step\'s window.</p>',
        critical_path_section(critical_path if critical_path is not None else getattr(a, "path_summary", None)),
        h2(f"What to try ({len(a.advice or [])})", "advice"),
        advice_section(a.advice),
        h2("Time partition per step", "steps"),
        steps_svg(a),
        time_table(a),
        h2("Communication by dimension and phase", "communication"),
        communication_section(getattr(a, "communication", None)),
        h2("Step variance", "step-stats"),
        step_stats_section(a.step_stats),
        h2("Matmul FLOPs by phase", "phases"),
        phase_flops_table(a),
        h2("GEMM shapes and wave quantization", "gemm"),
        gemm_section(a.by_gemm_shape),
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


def rank_budgets(summaries) -> str:
    """Each rank's loss budget side by side: a stacked bar per rank and a table of terms × ranks, each term explained."""
    budgets = [(s.rank, (s.totals or {}).get("loss_budget")) for s in summaries]
    if not any(b for _, b in budgets):
        return '<p class="mute">No loss budget on any rank (no step time, or no device activity).</p>'
    terms = list(dict.fromkeys(k for _, b in budgets for k in (b or {})))
    colors = {k: TERM_COLORS.get(k, "#718096") for k in terms}
    labels = {k: k.replace("_", " ") for k in terms}
    bars = [(f"rank {r}", {k: v for k, v in (b or {}).items() if v is not None}, "" if b else "no budget") for r, b in budgets]
    out = legend(colors, labels) + stacked_rows_svg(bars, colors, labels, unit_us=False, css_class="rank-budgets")
    rows = [[labels[k], *[num("—" if (b or {}).get(k) is None else fmt.pct(b[k], 2), (b or {}).get(k), f"{r}:{k}") for r, b in budgets],
             TERM_HELP.get(k, "")] for k in terms]
    return out + table(["term", *[f"rank {r}" for r, _ in budgets], "what it means"], rows, css_class="rank-budget-terms", explain_last=True)


JOB_ADVICE_NONE = ('<p class="mute job-advice-none">Nothing stands out across the ranks: each rank\'s own advice is in its report '
                   "(traceflops analyze RANK_TRACE --html PATH); the stragglers and collectives above say which rank and which collective to look at.</p>")

STRAGGLER_WHY = {
    "compute": "it computed longer than the median rank in that step (more or slower kernels)",
    "idle": "its device idled longer than the median rank's (host-bound, synchronisation, launch gaps)",
    "input_pipeline": "it waited longer on input (data loading) than the median rank",
    "unclear": "none of its compute, idle or input time exceeds the median rank's: look at its collectives",
}


def stragglers_table(st: pl.DataFrame | None) -> str:
    """Per step, the rank the others waited for, its time against the median rank's, and why."""
    if st is None or st.height == 0:
        return '<p class="mute">No straggler: no collective matched across ranks.</p>'
    rows = [[num(str(r["step"]), r["step"], "step"), num(str(r["rank"]), r["rank"], "rank"), num(fmt.ms(r["wait_us"]), r["wait_us"], "wait_us"),
             num(fmt.ms(r.get("excess_compute_us"), True), r.get("excess_compute_us"), "excess_compute_us"),
             num(fmt.ms(r.get("excess_idle_us"), True), r.get("excess_idle_us"), "excess_idle_us"),
             num(fmt.ms(r.get("excess_input_pipeline_us"), True), r.get("excess_input_pipeline_us"), "excess_input_pipeline_us"),
             r["reason"], STRAGGLER_WHY.get(r["reason"], "")] for r in st.iter_rows(named=True)]
    return table(["step", "rank", "others waited", "compute vs median", "idle vs median", "input vs median", "reason", "what it means"],
                 rows, left=(6,), css_class="stragglers", explain_last=True)


def collectives_table(c: pl.DataFrame | None) -> str:
    """The collectives with the most arrival skew: who came last, how long the transfer took, and its bus bandwidth."""
    if c is None or c.height == 0:
        return '<p class="mute">No collective matched across ranks.</p>'
    top = c.sort("arrival_skew_us", descending=True).head(MAX_ROWS)
    g = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"
    roles = "role" in c.columns and c["role"].is_not_null().any()  # the group's mesh dimension, where the trace says
    rows = [[r["pg"], *([r.get("role") or "—"] if roles else []), num(str(r["seq"]), r["seq"], "seq"), r["kind"], num(str(r["step"]), r["step"], "step"), num(fmt.si(r["bytes"], "B"), r["bytes"], "bytes"),
             num(str(r["ranks"]), r["ranks"], "ranks"), num(fmt.ms(r["arrival_skew_us"]), r["arrival_skew_us"], "arrival_skew_us"),
             num(str(r["last_rank"]), r["last_rank"], "last_rank"), num(fmt.ms(r["transfer_us"]), r["transfer_us"], "transfer_us"),
             num(g(r.get("algbw_gbps")), r.get("algbw_gbps"), "algbw_gbps"), num(g(r.get("busbw_gbps")), r.get("busbw_gbps"), "busbw_gbps"),
             num(fmt.pct(r.get("busbw_of_nvlink")), r.get("busbw_of_nvlink"), "busbw_of_nvlink")] for r in top.iter_rows(named=True)]
    out = table(["group", *(["role"] if roles else []), "seq", "kind", "step", "bytes", "ranks", "arrival skew", "last rank", "transfer",
                 "alg GB/s", "bus GB/s", "of link"], rows, left=(0, 1, 3) if roles else (0, 2), css_class="collectives")
    more = f" Top {MAX_ROWS} of {c.height}." if c.height > MAX_ROWS else ""
    return out + ('<p class="sub">Arrival skew: how long the first rank waited for the last one to arrive (time lost to imbalance, not to the network). '
                  "Transfer: from the last arrival to the end. Bus bandwidth: the payload the links carried per second "
                  f"(algorithm bandwidth × the collective's bus factor), comparable to the link's peak.{e(more)}</p>")


def communication_section(rows: pl.DataFrame | None, per_rank: pl.DataFrame | None = None) -> str:
    """Exposed and hidden communication per dimension (the group's role), phase and kind; a job's with its ranks."""
    if rows is None or rows.height == 0:
        return '<p class="mute">No communication in the counted steps.</p>'
    job = "ranks" in rows.columns
    pct = lambda r, k: num(fmt.pct(r[k]), r[k], k)
    out = [[r["role"], r["phase"], r["kind"], num(str(r["calls"]), r["calls"], "calls"), num(fmt.ms(r["time_us"]), r["time_us"], "time_us"),
            pct(r, "exposed_share"), pct(r, "overlapped_share"),
            *([num(str(r["ranks"]), r["ranks"], "ranks"), pct(r, "max_exposed_share"), num(str(r["max_rank"]), r["max_rank"], "max_rank")] if job else [])]
           for r in rows.head(MAX_ROWS).iter_rows(named=True)]
    html = table(["dimension", "phase", "kind", "calls", "time", "exposed", "hidden",
                  *(["ranks", "most exposed rank's share", "that rank"] if job else [])], out, left=(0, 1, 2), css_class="communication")
    if per_rank is not None and per_rank.height:
        html += "<details><summary>Per rank</summary>" + table(
            ["rank", "dimension", "phase", "kind", "calls", "time", "exposed", "hidden"],
            [[r["rank"], r["role"], r["phase"], r["kind"], r["calls"], fmt.ms(r["time_us"]), pct(r, "exposed_share"), pct(r, "overlapped_share")]
             for r in per_rank.head(MAX_ROWS * 4).iter_rows(named=True)], left=(1, 2, 3)) + "</details>"
    return html + ('<p class="sub">Exposed: step time when the collective ran with no compute beside it; hidden: under compute. '
                   "Time in flight together is cut evenly among the collectives, so the rows add up to the time partition's "
                   "communication. A dimension is the group's role (DP, TP, PP, EP, CP, world), else its description.</p>")


def render_job_html(job, title: str | None = None) -> str:
    """The job view (many ranks): job MFU/HFU, per-rank bars, steps, stragglers, collectives."""
    t = job.totals
    title = fmt.printable(title or f"traceflops: job of {t.get('world_size')} ranks")
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
    from traceflops.report.jobreport import (
        warning_lines,  # a rank's warning once for all the ranks that gave it
    )

    said = warning_lines(job)
    body = [f"<h1>{e(title)}</h1>", cards(items), f"<h2>Warnings ({len(said)})</h2>", warnings_list(said)]
    body.append("<h2>Per rank: time partition</h2>")
    rows = []
    for r in job.ranks.iter_rows(named=True):
        parts = {c: r.get(f"time_{c}") for c in PARTITION}
        rows.append((f"rank {r['rank']}", parts, f"{fmt.ms(r['wall_us'])} · device MFU {fmt.pct(r['device_mfu'])} · HFU {fmt.pct(r['hfu'])}"))
    body.append(legend(PART_COLORS, PART_LABELS) + stacked_rows_svg(rows, PART_COLORS, PART_LABELS, css_class="ranks"))
    body.append(table(["rank", "trace", "wall", "device MFU", "HFU", "executed FLOPs", "recompute FLOPs"],
                      [[r["rank"], r["path"], fmt.ms(r["wall_us"]), fmt.pct(r["device_mfu"]), fmt.pct(r["hfu"]), fmt.si(r["executed_flops"], "FLOP"),
                        fmt.si(r["recompute_flops"], "FLOP")] for r in job.ranks.iter_rows(named=True)], left=(1,), name_cols=(1,)))
    body.append(h2("Loss budget per rank", "budget") + rank_budgets(job.summaries))
    if job.steps is not None and job.steps.height:
        body.append("<h2>Job steps</h2>")
        body.append(table(["step", "step time (slowest rank)", "slowest rank", "ranks", "MFU", "HFU"],
                          [[r["step"], fmt.ms(r["step_us"]), r["slowest_rank"], r["ranks"], fmt.pct(r["mfu"]), fmt.pct(r["hfu"])]
                           for r in job.steps.iter_rows(named=True)]))
    body.append(h2("Stragglers (the rank the others waited for)", "stragglers") + stragglers_table(job.stragglers))
    body.append(h2("Collectives with the most arrival skew", "collectives") + collectives_table(job.collectives))
    body.append(h2("Communication by dimension and phase", "communication")
                + communication_section(getattr(job, "communication", None), getattr(job, "communication_by_rank", None)))
    if getattr(job, "experts", None) is not None and job.experts.height:
        x = lambda r, k: num("—" if r[k] is None else f"{r[k]:.2f}×", r[k], k)
        body.append(h2("Experts per rank", "experts") + table(
            ["rank", "EP group", "expert FLOPs / step", "vs group mean", "all-to-all / step", "vs group mean"],
            [[r["rank"], r["ep_group"] or "?", num(fmt.si(r["expert_flops_per_step"], "FLOP"), r["expert_flops_per_step"], "expert_flops_per_step"),
              x(r, "flops_vs_group_mean"), num(fmt.nbytes(r["a2a_bytes_per_step"]), r["a2a_bytes_per_step"], "a2a_bytes_per_step"),
              x(r, "bytes_vs_group_mean")] for r in job.experts.iter_rows(named=True)], left=(1,))
            + '<p class="sub">Expert FLOPs: the matmuls of the rank\'s grouped-GEMM and fused-MoE ops; all-to-all: the payloads of '
              "its EP group's all-to-alls. An EP group's ranks run the same layers on different tokens: a rank above its "
              "group's mean is the one its all-to-alls wait for.</p>")
    items = job.advice  # shaped like Analysis.advice (views.job.job_advice)
    body.append(h2("What to try", "advice") + (advice_section(items) if items else JOB_ADVICE_NONE))
    if job.pipeline is not None and job.pipeline.height:
        p = job.pipeline.sort("stage", "rank", "step", nulls_last=True)
        first = p.row(0, named=True)
        body.append("<h2>Pipeline bubbles</h2>")
        body.append(f"<p>{first['stages'] if first['stages'] is not None else '?'} stages, "
                    f"{first['microbatches'] if first['microbatches'] is not None else '?'} micro-batches "
                    f"({first['stages_source'] or 'unknown'}); the bubble is the time a stage was blocked on receives with no "
                    "compute running (or its P2P time where the trace records no direction), against the ideal (p−1)/(m+p−1).</p>")
        body.append(table(["stage", "rank", "step", "blocked on recv", "P2P", "bubble", "ideal bubble", "sends", "recvs", "matched",
                           "forward / backward"],
                          [[r["stage"], r["rank"], r["step"], fmt.ms(r["recv_blocked_us"]), fmt.ms(r["p2p_us"]), fmt.pct(r["bubble"]),
                            fmt.pct(r["ideal_bubble"]), r["sends"], r["recvs"], r["matched"],
                            f"{r['forward_p2p']} / {r['backward_p2p']}"] for r in p.iter_rows(named=True)]))
    return page(title, body)


# --- diff ---------------------------------------------------------------------


def largest_change_line(lc: dict[str, Any] | None, why: str | None = None) -> str:
    """One line: which phase's matmul FLOPs moved most (the diff view's `largest_change`), or why none did."""
    if not lc:
        return f"Largest change: none: {why or 'no phase matmul FLOPs moved, or one side is unknown'}"
    unit = "per token" if lc["basis"] == "flops_per_token" else "per step"
    rel = "" if lc["relative"] is None else f", {lc['relative'] * 100:+.1f}%"
    sign = "+" if lc["delta"] > 0 else "−"
    return (f"Largest change: {lc['phase']} FLOPs {unit}, {sign}{fmt.flops(abs(lc['delta']))} "
            f"({fmt.flops(lc['before'])} → {fmt.flops(lc['after'])}{rel})")


def paired_bars_svg(terms: list[dict[str, Any]], width: int = 900) -> str:
    """Per budget term, before (light) and after (dark) bars with the delta; exact values in data-*."""
    known = [r for r in terms if r["before"] is not None or r["after"] is not None]
    if not known:
        return '<p class="mute">No loss budget on either side.</p>'
    vals = [v for r in known for v in (r["before"], r["after"]) if v is not None]
    lo, hi = min([0.0, *vals]), max([0.0, *vals]) or 1.0
    lab, x0, x1, row = 200, 210, width - 150, 30
    sx = lambda v: x0 + (v - lo) / (hi - lo) * (x1 - x0)
    h = len(known) * row + 8
    out = [f'<svg class="budget-diff" viewBox="0 0 {width} {h}" width="{width}" height="{h}" role="img">']
    for i, r in enumerate(known):
        y = 4 + i * row
        color = TERM_COLORS.get(r["term"], "#718096")
        out.append(f'<text x="{lab}" y="{y + 17}" text-anchor="end">{e(r["term"].replace("_", " "))}</text>')
        for j, (side, v) in enumerate((("before", r["before"]), ("after", r["after"]))):
            if v is None:
                continue
            xa, xb = sorted((sx(0.0), sx(v)))
            out.append(f'<rect data-term="{e(r["term"])}" data-side="{side}" data-value="{v!r}" x="{_xy(xa)}" y="{y + 2 + j * 12}" '
                       f'width="{_xy(max(xb - xa, 0.75))}" height="11" fill="{color}" fill-opacity="{0.4 if side == "before" else 1.0}">'
                       f"<title>{e(r['term'])} {side}: {fmt.pp(v)}</title></rect>")
        out.append(f'<text x="{x1 + 8}" y="{y + 17}">{e(fmt.pp(r["delta"], True))}</text>')
    out.append("</svg>")
    return '<div class="legend"><span>light: before</span><span>dark: after</span></div>' + "".join(out)


def _moved(v: dict[str, Any], key: str, show=fmt.ms, signed: bool = True) -> list[Num]:
    return [num(show(v["before"]), v["before"], f"{key}:before"), num(show(v["after"]), v["after"], f"{key}:after"),
            num(show(v["delta"], True) if signed else show(v["delta"]), v["delta"], f"{key}:delta")]


def render_diff_html(d: dict[str, Any]) -> str:
    """The diff view (`views.diff.diff`) as one self-contained page: what moved, each budget term explained."""
    b, a, h = d["before"], d["after"], d["headline"]
    title = "traceflops diff"
    pp = lambda v, signed=False: fmt.pp(v, signed)
    si = lambda v, signed=False: fmt.si(v, "FLOP")
    body = [
        f"<h1>{e(title)}</h1>",
        (f'<p class="sub">before: {e(b["path"])} ({e(b["steps"])} steps, {e(b["hardware"])})<br>'
         f'after: {e(a["path"])} ({e(a["steps"])} steps, {e(a["hardware"])})</p>'),
        cards([
            ("MFU", fmt.pp(h["mfu"]["after"]), f"{fmt.pp(h['mfu']['delta'], True)} from {fmt.pp(h['mfu']['before'])}"),
            ("HFU", fmt.pp(h["hfu"]["after"]), f"{fmt.pp(h['hfu']['delta'], True)} from {fmt.pp(h['hfu']['before'])}"),
            ("step time", fmt.ms(h["step_us"]["after"]), f"{fmt.ms(h['step_us']['delta'], True)} from {fmt.ms(h['step_us']['before'])}"),
        ]),
        f'<p class="largest-change"><b>{e(largest_change_line(d.get("largest_change"), d.get("largest_change_why")))}</b></p>',
        h2(f"Warnings ({len(d['warnings'])})", "warnings"),
        warnings_list(d["warnings"]),
        h2("Headline", "headline"),
        table(["", "before", "after", "delta"],
              [[k.replace("_", " "), *_moved(h[k], k, pp)] for k in ("mfu", "mfu_no_attention", "hfu", "flops_coverage") if k in h]
              + [["step time (mean)", *_moved(h["step_us"], "step_us")]], css_class="diff-headline"),
        h2("Loss budget terms, by size of change", "budget"),
        '<p class="sub">Fractions of peak FLOP/s × step time on each side; the delta is after − before, in percentage points.</p>',
        paired_bars_svg(d["loss_budget"]),
        table(["term", "before", "after", "delta", "what it means"],
              [[r["term"].replace("_", " "), *_moved(r, r["term"], pp), TERM_HELP.get(r["term"], "")] for r in d["loss_budget"]],
              css_class="diff-budget", explain_last=True),
        h2("Per step", "steps"),
        table(["", "before", "after", "delta"],
              [[f"time: {PART_LABELS.get(k, k)}", *_moved(v, f"time_{k}")] for k, v in d["time_us_per_step"].items()]
              + [[f"{p} FLOPs", *_moved(v, f"flops_{p}", si)] for p, v in d["flops_per_step"].items()]
              + [[f"{p} FLOPs per token", *_moved(v, f"flops_per_token_{p}", si)] for p, v in (d.get("flops_per_token") or {}).items()],
              css_class="diff-steps"),
    ]
    if d["kernels"]:
        body += [h2("Kernels whose time per step moved most", "kernels"),
                 table(["kernel", "before", "after", "delta"],
                       [[r["name"], *_moved({"before": r["before_per_step"], "after": r["after_per_step"], "delta": r["delta_per_step"]}, "kernel")]
                        for r in d["kernels"]], name_cols=(0,), css_class="diff-kernels")]
    if d["modules"]:
        body += [h2("Modules whose time per step moved most", "modules"),
                 table(["module", "before", "after", "delta", "recompute before", "recompute after"],
                       [[r["module"], *_moved({"before": r["before_per_step"], "after": r["after_per_step"], "delta": r["delta_per_step"]}, "module"),
                         fmt.ms(r["recompute_per_step"]["before"]), fmt.ms(r["recompute_per_step"]["after"])] for r in d["modules"]],
                       name_cols=(0,), css_class="diff-modules")]
    for n in d["notes"]:
        body.append(f'<p class="mute">{e(n)}</p>')
    return page(title, body)
