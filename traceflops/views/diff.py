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
  compare), else per step; `basis` says which; null when nothing moved or a
  side's FLOPs are unknown, and `largest_change_why` says which;
* `loss_budget`: each term's fractions and delta, sorted by |delta| (unknown
  deltas last);
* `time_us`: the time partition per step (mean);
* `kernels`: kernel names whose time per step moved most (rollup.by_kernel:
  all the trace's kernels, outside-steps ones included, over its number of
  steps, so runs of different lengths compare);
* `modules`: modules whose time per step moved most, with their recompute time
  (rollup.by_module, per step likewise), when both traces have device kernels.

Rendered by `report.diff` (terminal, JSON, HTML).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis
from traceflops.core.vocab import PARTITION, PHASES

SCHEMA = "traceflops.diff/1"
TOP = 20


def _delta(x, y):
    return None if x is None or y is None else y - x


def _pair(x, y) -> dict[str, Any]:
    return {"before": x, "after": y, "delta": _delta(x, y)}


def _known_flops(a: Analysis) -> dict[str, Any]:
    """The totals' FLOPs by phase, or all None where none is known (a trace without shapes): unknown, never 0."""
    t = a.totals
    return {k: None if not t.flops_known else v for k, v in t.flops.items()}


def _steps(a: Analysis) -> int:
    """The steps the totals cover (left out: asked, cut, or the unbounded last)."""
    return int(a.totals.step_count.counted)


def _per_step(v, n: float):
    return None if v is None or not n else v / n


def _side(a: Analysis) -> dict[str, Any]:
    hw = a.hardware
    return {
        "path": path_text(a.meta.get("path")),  # a name that is not UTF-8 as escapes: JSON and HTML take it
        "format": a.meta.get("format"),
        "rank": a.meta.get("rank"),
        "hardware": hw.name if hw else None,
        "precision": hw.precision if hw else None,
        "peak_flops": hw.peak_flops if hw else None,
        "model_source": _model_source(a),
        "steps": _steps(a),
        "wall_us": a.totals.wall_us,
    }


def _model_source(a: Analysis) -> str | None:
    return a.model.source if a.model else None


def _device_tokens(a: Analysis) -> float | None:
    """Tokens per step on this trace's device: the model's (global) tokens over the world size it was split by."""
    m = a.model
    tokens = m.tokens_per_step if m else None
    if not m or not tokens:  # unknown, or (UNSET) a model section from the trace
        return None
    whole, share = m.flops_per_step, m.flops_per_step_device
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


def _moved(
    fa: pl.DataFrame | None,
    fb: pl.DataFrame | None,
    key: str,
    value: str,
    na: int,
    nb: int,
    extra: tuple[str, ...] = (),
) -> list[dict]:
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
    ta, tb = a.totals, b.totals
    na, nb = _steps(a), _steps(b)
    warnings = []
    sa, sb = _side(a), _side(b)
    if sa["peak_flops"] != sb["peak_flops"]:
        warnings.append(
            f"the peaks differ ({sa['hardware']} {sa['precision']} vs {sb['hardware']} {sb['precision']}): utilization "
            "deltas mix hardware and code"
        )
    if sa["model_source"] != sb["model_source"]:
        warnings.append("model FLOPs come from different sources: MFU deltas are not like for like")
    if na != nb:
        warnings.append(f"different numbers of steps ({na} vs {nb}): times and FLOPs are compared per step")
    headline = {
        "mfu": _pair(ta.mfu, tb.mfu),
        "mfu_no_attention": _pair(ta.mfu_no_attention, tb.mfu_no_attention),
        "hfu": _pair(ta.hfu, tb.hfu),
        "flops_coverage": _pair(ta.flops_coverage, tb.flops_coverage),
    }
    headline["step_us"] = _pair(_per_step(ta.wall_us, na), _per_step(tb.wall_us, nb))
    fa, fb = _known_flops(a), _known_flops(b)
    for side, f in (("before", fa), ("after", fb)):
        if f["executed"] is None:
            warnings.append(f"matmul FLOPs are unknown {side} (no recorded shapes): FLOP changes are unknown, not 0")
    flops = {p: _pair(_per_step(fa[p], na), _per_step(fb[p], nb)) for p in (*PHASES, "executed")}
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
    if largest is not None:
        largest_why = None
    elif fa["executed"] is None or fb["executed"] is None:
        largest_why = "one side's matmul FLOPs are unknown (no recorded shapes; the warnings say which)"
    else:
        largest_why = "no phase's matmul FLOPs moved"
    la: dict[str, float | None] = ta.loss_budget or {}
    lb: dict[str, float | None] = tb.loss_budget or {}
    terms = [{"term": k, **_pair(la.get(k), lb.get(k))} for k in dict.fromkeys([*la, *lb])]
    terms.sort(key=lambda r: (r["delta"] is None, -abs(r["delta"] or 0.0)))
    ua: dict[str, float | None] = ta.time_us or {}
    ub: dict[str, float | None] = tb.time_us or {}
    time_us = {c: _pair(_per_step(ua.get(c), na), _per_step(ub.get(c), nb)) for c in PARTITION}
    ka, kb = a.steps.height, b.steps.height  # the roll-ups cover every step of the trace
    kernels = _moved(a.by_kernel, b.by_kernel, "name", "total_us", ka, kb, ("count", "cls"))
    modules = _moved(a.by_module, b.by_module, "module", "time_us", ka, kb, ("time_recompute", "recompute_share"))
    for m in modules:
        m["recompute_per_step"] = _pair(
            _per_step(m.get("time_recompute_before"), ka) if m.get("time_recompute_before") is not None else None,
            _per_step(m.get("time_recompute_after"), kb) if m.get("time_recompute_after") is not None else None,
        )
    notes = []
    if not kernels:
        notes.append("no device kernels in one or both traces: no per-kernel comparison")
    return {
        "schema": SCHEMA,
        "before": sa,
        "after": sb,
        "headline": headline,
        "flops_per_step": flops,
        "flops_per_token": per_token,
        "largest_change": largest,
        "largest_change_why": largest_why,  # why there is none (null when there is one)
        "loss_budget": terms,
        "time_us_per_step": time_us,
        "kernels": kernels,
        "modules": modules,
        "warnings": warnings,
        "notes": notes,
    }


# --- renderers --------------------------------------------------------------------
