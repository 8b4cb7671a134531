"""The SVG charts, drawn inline (no script, no image file): the loss-budget waterfall, stacked bars on a
shared scale, the roofline scatter, and the diff's paired before/after bars; with the palettes and the loss
budget's term explanations they share.

Kept apart from the reports so each chart is drawn one way wherever it appears. Every bar or point carries
its exact value in `data-value` and a `<title>`, so tests (and people) can read it back:
- the loss budget as a waterfall: each term of `totals.loss_budget` is a bar from the running sum to the
  running sum plus the term; the last bar is the total (100% when every term is known).
- a roofline scatter of kernels (intensity vs achieved FLOP/s under the roofs of the device), from
  `traceflops.stages.roofline`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.report.html.page import e, legend

MAX_POINTS = 1500  # roofline points drawn (the longest kernels)

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
    "extra_executed": "FLOPs the device executed beyond the model's count (not recompute): padding, extra layers, "
    "uncounted work",
    "recompute": "forward FLOPs run again in backward (activation checkpointing): memory bought with compute",
    "attention_mask_credit": "FLOPs the model count credits to masked attention that its kernels skipped (never "
    "positive)",
    "matmul_below_peak": "matmul time beyond what its FLOPs would take at peak: shapes, dtypes, tiles, small GEMMs",
    "matmul_flops_unknown": "matmul time whose FLOPs are unknown (no recorded shapes): cannot be split further",
    "non_matmul": "time in other compute kernels (elementwise, normalization, softmax, reductions): fusion candidates",
    "memcpy_exposed": "copies and memsets with no compute running beside them",
    "communication_exposed": "collectives with nothing else running: communication not overlapped with compute",
    "idle": "the device did nothing: host-bound, input pipeline, synchronisations or gaps between steps",
}
CLS_COLORS = {"matmul": "#2b6cb0", "other_compute": "#dd6b20"}


def _f(v) -> float:
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _xy(v: float) -> str:
    return f"{v:.2f}"


# --- charts -----------------------------------------------------------------


def waterfall_svg(budget: dict[str, float | None] | None, width: int = 900) -> str:
    """The loss budget as a horizontal waterfall; bars carry data-term / data-value (repr of the float)."""
    if not budget:
        return '<p class="mute">No loss budget (no step time, or no device activity).</p>'
    terms = list(budget.items())
    cum = 0.0
    spans: list[tuple[str, float | None, float, float]] = []
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
    out = [
        f'<svg class="waterfall" viewBox="0 0 {width} {h}" width="{width}" height="{h}" role="img" aria-label="loss '
        'budget waterfall">'
    ]
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        if lo <= g <= hi:
            x = _xy(sx(g))
            out.append(f'<line class="grid" x1="{x}" y1="{top - 6}" x2="{x}" y2="{top + n * row}"/>')
            out.append(f'<text x="{x}" y="{top - 9}" text-anchor="middle">{g:.0%}</text>')
    for i, (k, v, a, b) in enumerate(spans):
        y = top + i * row
        out.append(f'<text x="{lab}" y="{y + row * 0.68:.1f}" text-anchor="end">{e(k.replace("_", " "))}</text>')
        if v is None:
            out.append(
                f'<text class="wf-unknown" data-term="{e(k)}" x="{x0 + 4}" y="{y + row * 0.68:.1f}" '
                'fill="#718096">unknown</text>'
            )
            continue
        xa, xb = sorted((sx(a), sx(b)))
        w = max(xb - xa, 0.75)
        color = TERM_COLORS.get(k, "#718096")
        tip = f"{k}: {fmt.pct(v, 2)} of peak × step time — {TERM_HELP.get(k, '')}"
        out.append(
            f'<rect class="wf" data-term="{e(k)}" data-value="{v!r}" x="{_xy(xa)}" y="{y + 3}" width="{_xy(w)}" '
            f'height="{row - 6}" fill="{color}">'
            f"<title>{e(tip)}</title></rect>"
        )
        out.append(f'<text x="{_xy(xb + 6)}" y="{y + row * 0.68:.1f}">{fmt.pct(v, 2)}</text>')
        if i + 1 < len(spans):
            out.append(
                f'<line x1="{_xy(sx(b))}" y1="{y + row - 3}" x2="{_xy(sx(b))}" y2="{y + row + 3}" stroke="#718096" '
                'stroke-dasharray="2,2"/>'
            )
    y = top + len(spans) * row
    total_label = "total" if known_all else "total (known terms)"
    out.append(f'<text x="{lab}" y="{y + row * 0.68:.1f}" text-anchor="end" font-weight="600">{total_label}</text>')
    out.append(
        f'<rect class="wf-total" data-value="{cum!r}" x="{_xy(sx(0))}" y="{y + 3}" '
        f'width="{_xy(max(sx(cum) - sx(0), 0.75))}" height="{row - 6}" fill="#2d3748">'
        f"<title>sum of the terms: {fmt.pct(cum, 3)}</title></rect>"
    )
    out.append(
        f'<text x="{_xy(sx(max(cum, 0)) + 6)}" y="{y + row * 0.68:.1f}" font-weight="600">{fmt.pct(cum, 2)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def stacked_rows_svg(
    rows: Sequence[tuple[str, Mapping[str, float | None], str]],
    colors: dict[str, str],
    labels: dict[str, str] | None = None,
    unit_us: bool = True,
    width: int = 900,
    css_class: str = "stacked",
) -> str:
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
        out.append(
            f'<text x="{lab}" y="{y + row * 0.66:.1f}" '
            f'text-anchor="end"><title>{e(label)}</title>{e(fmt.short(label, 28))}</text>'
        )
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
            out.append(
                f'<rect data-part="{e(k)}" data-value="{v!r}" x="{_xy(x)}" y="{y + 3}" width="{_xy(max(w, 0.5))}" '
                f'height="{row - 6}" fill="{c}"><title>{e(tip)}</title></rect>'
            )
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
    pts = roof.filter((pl.col("intensity") > 0) & (pl.col("roof_flops") > 0) & (pl.col("dur") > 0)).with_columns(
        achieved=pl.col("roof_flops") / (pl.col("dur") * 1e-6)
    )
    roofs = (
        roof.filter(pl.col("peak_flops").is_not_null() & pl.col("peak_bytes_per_s").is_not_null())
        .group_by("cls")
        .agg(pl.col("peak_flops").first(), pl.col("peak_bytes_per_s").first())
        .sort("cls")
    )
    if pts.height == 0:
        return (
            '<p class="mute">No kernel has both FLOPs and bytes known: no roofline points (shapes not recorded?).</p>'
        )
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
    out = [
        f'<svg class="roofline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        'aria-label="roofline">'
    ]
    for t in _log_ticks(xlo, xhi):
        if xlo <= t <= xhi:
            out.append(
                f'<line class="grid" x1="{_xy(lx(t))}" y1="{T}" x2="{_xy(lx(t))}" y2="{B}"/><text x="{_xy(lx(t))}" '
                f'y="{B + 16}" text-anchor="middle">{t:g}</text>'
            )
    for t in _log_ticks(ylo, yhi):
        if ylo <= t <= yhi:
            out.append(
                f'<line class="grid" x1="{L}" y1="{_xy(ly(t))}" x2="{R}" y2="{_xy(ly(t))}"/><text x="{L - 6}" '
                f'y="{_xy(ly(t) + 4)}" text-anchor="end">{e(fmt.si(t))}</text>'
            )
    out.append(
        f'<line class="axis" x1="{L}" y1="{B}" x2="{R}" y2="{B}"/><line class="axis" x1="{L}" y1="{T}" x2="{L}" '
        f'y2="{B}"/>'
    )
    out.append(f'<text x="{(L + R) / 2}" y="{height - 8}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>')
    out.append(f'<text transform="translate(14,{(T + B) / 2}) rotate(-90)" text-anchor="middle">achieved FLOP/s</text>')
    for cls, p, b in zip(roofs["cls"].to_list(), peaks, bws):
        ridge = p / b
        xa = xlo
        pts_line = [(xa, xa * b), (ridge, p), (xhi, p)] if ridge > xlo else [(xlo, p), (xhi, p)]
        path = " ".join(f"{_xy(lx(x))},{_xy(ly(y))}" for x, y in pts_line)
        color = CLS_COLORS.get(cls, "#4a5568")
        what = "tensor peak" if cls == "matmul" else "vector fp32 peak"
        out.append(
            f'<polyline class="roof" points="{path}" fill="none" stroke="{color}" stroke-width="2" '
            f'stroke-dasharray="6,3"><title>{e(cls)} roof: {e(what)} {e(fmt.si(p, "FLOP/s"))}, HBM '
            f"{e(fmt.si(b, 'B/s'))}, ridge {ridge:.3g} FLOP/byte</title></polyline>"
        )
        out.append(
            f'<text x="{_xy(lx(max(ridge, xlo)) + 4)}" y="{_xy(ly(p) - 5)}" fill="{color}">{e(what)} '
            f"{e(fmt.si(p, 'FLOP/s'))}</text>"
        )
    for r in pts.iter_rows(named=True):
        color = CLS_COLORS.get(r["cls"], "#4a5568")
        tip = (
            f"{r['name']} — {r['cls']}, {r['dur']:.1f} µs, {r['intensity']:.3g} FLOP/B, "
            f"{fmt.si(r['achieved'], 'FLOP/s')}, {r['bound'] or 'bound unknown'}"
        )
        out.append(
            f'<circle cx="{_xy(lx(r["intensity"]))}" cy="{_xy(ly(r["achieved"]))}" r="3" fill="{color}" '
            f'fill-opacity="0.55"><title>{e(tip)}</title></circle>'
        )
    out.append("</svg>")
    note = (
        f"{pts.height} of {total} kernels with known FLOPs and bytes shown (the longest)."
        if total > pts.height
        else f"{total} kernels with known FLOPs and bytes."
    )
    if roofs.height == 0:
        note += " No roof: the device's peak or memory bandwidth is not in the hardware table (give --hardware)."
    return out[0] + "".join(out[1:]) + legend({k: v for k, v in CLS_COLORS.items()}) + f'<p class="mute">{e(note)}</p>'


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
            out.append(
                f'<rect data-term="{e(r["term"])}" data-side="{side}" data-value="{v!r}" x="{_xy(xa)}" '
                f'y="{y + 2 + j * 12}" '
                f'width="{_xy(max(xb - xa, 0.75))}" height="11" fill="{color}" '
                f'fill-opacity="{0.4 if side == "before" else 1.0}">'
                f"<title>{e(r['term'])} {side}: {fmt.pp(v)}</title></rect>"
            )
        out.append(f'<text x="{x1 + 8}" y="{y + 17}">{e(fmt.pp(r["delta"], True))}</text>')
    out.append("</svg>")
    return '<div class="legend"><span>light: before</span><span>dark: after</span></div>' + "".join(out)
