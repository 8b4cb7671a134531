"""The CI gate's rules: a measure of a trace (the median over its counted steps), a threshold, a verdict and why.

Two uses, one set of measures:

* `check(a, rules, ...)`: `traceflops check` (`--min-mfu`, `--min-hfu`, `--max-loss TERM=X`), each rule on one trace;
* `diff_gate(a, b, rules, ...)`: `traceflops diff --fail-if RULE`, each rule on the change from `a` (before) to `b`.

A measure is the median over the counted steps: the steps the report's totals count (asked with
`--exclude-step`, cut, and the unbounded last left out) whose value is known. The median keeps one slow
step (a warm-up, a checkpoint save) from deciding the verdict. Each rule comes out `pass`, `fail` or
`unknown` with why; `unknown` has a `cause`: `steps` (fewer counted steps than `min_steps`) or `value`
(the number cannot be known from the trace, such as MFU without a peak). The gate's result is `fail`
when a rule failed, else `unknown` when a rule is unknown (a `value` one is let pass with
`allow_unknown`), else `pass`.

`--fail-if` grammar (`parse_diff_rule`):

    RULE  := mfu-drop>LIMIT | hfu-drop>LIMIT | step-time-rise>LIMIT | loss-rise:TERM>LIMIT
    LIMIT := N%        relative to the before value (mfu-drop>2%: MFU fell by more than 2% of its before value)
           | Npp       percentage points, on shares (mfu-drop>1pp: fell by more than 0.01)
           | N         a share as a fraction (loss-rise:idle>0.03: rose by more than 3 pp); not for step time
           | Nms | Nus | Ns   a time, for step-time-rise only

The tolerance (absolute, on shares: MFU, HFU and the loss terms) is slack added to every share
threshold, so a run within it of the threshold passes; step times have none.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.errors import EXIT_CANNOT_JUDGE, EXIT_GATE_FAILED, OptionsError
from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis
from traceflops.metrics.budget import TERMS
from traceflops.stages.steps import counted_steps

CHECK_SCHEMA = "traceflops.check/1"
PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
DEFAULT_TOLERANCE = 0.005  # half a percentage point
DEFAULT_MIN_STEPS = 2
LOSS_TERMS = tuple(t for t in TERMS if t != "mfu")  # the budget's losses: every term but the MFU it leaves
EXIT_CODES = {PASS: 0, FAIL: EXIT_GATE_FAILED, UNKNOWN: EXIT_CANNOT_JUDGE}


@dataclass(frozen=True)
class Rule:
    """One rule as the user wrote it (`text`) and what it means."""

    text: str
    metric: str  # 'mfu' | 'hfu' | 'step_time' | 'loss:TERM'
    bound: str  # check: 'min' | 'max'; diff: 'drop' | 'rise'
    threshold: float  # a fraction for shares, µs for step time; relative rules: a fraction of the before value
    relative: bool = False


def is_share(metric: str) -> bool:
    return metric != "step_time"


# ------------------------------------------------------------------ parsing


def _number(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise OptionsError(None, f"{what}: '{text}' is not a number", "write it as 0.35 or 35%")
    return v


def share(text: str, what: str, lo: float = 0.0, hi: float = 1.0) -> float:
    """A share from the command line: a fraction (0.35) or a percentage (35%), within [lo, hi]."""
    t = text.strip()
    v = _number(t[:-1], what) / 100 if t.endswith("%") else _number(t, what)
    if not lo <= v <= hi:
        raise OptionsError(
            None,
            f"{what}: {text} is outside {lo:g}..{hi:g} (as a fraction; {lo:.0%}..{hi:.0%})",
            "give a fraction such as 0.35, or a percentage such as 35%",
        )
    return v


def _term(term: str, what: str) -> str:
    if term not in LOSS_TERMS:
        raise OptionsError(None, f"{what}: unknown loss-budget term '{term}'", f"use one of {', '.join(LOSS_TERMS)}")
    return term


def check_rules(min_mfu: str | None = None, min_hfu: str | None = None, max_loss=()) -> list[Rule]:
    """`check`'s options as rules: `--min-mfu`, `--min-hfu` (shares), `--max-loss TERM=X` (any number of them)."""
    rules = []
    if min_mfu is not None:
        rules.append(Rule(f"mfu>={min_mfu}", "mfu", "min", share(min_mfu, "--min-mfu")))
    if min_hfu is not None:
        rules.append(Rule(f"hfu>={min_hfu}", "hfu", "min", share(min_hfu, "--min-hfu")))
    for item in max_loss:
        term, sep, value = item.partition("=")
        if not sep:
            raise OptionsError(None, f"--max-loss {item}: no '='", "write TERM=SHARE, e.g. communication_exposed=0.15")
        term = _term(term.strip(), f"--max-loss {item}")
        rules.append(
            Rule(f"{term}<={value.strip()}", f"loss:{term}", "max", share(value, f"--max-loss {item}", -1.0, 1.0))
        )
    return rules


_DIFF_RULE = re.compile(
    r"^\s*(mfu-drop|hfu-drop|step-time-rise|loss-rise:([A-Za-z_]+))\s*>\s*([0-9.eE+-]+)\s*(%|pp|ms|us|µs|s)?\s*$"
)
_TIME_UNITS = {"ms": 1e3, "us": 1.0, "µs": 1.0, "s": 1e6}


def parse_diff_rule(text: str) -> Rule:
    """One `--fail-if` rule (the grammar in the module's docstring)."""
    m = _DIFF_RULE.match(text)
    if not m:
        raise OptionsError(
            None,
            f"--fail-if '{text}': not a rule",
            "write METRIC>LIMIT: mfu-drop>2%, hfu-drop>1pp, step-time-rise>5% (or >3ms), loss-rise:TERM>0.03",
        )
    name, term, number, unit = m.group(1), m.group(2), m.group(3), m.group(4)
    value = _number(number, f"--fail-if '{text}'")
    if value < 0:
        raise OptionsError(
            None, f"--fail-if '{text}': a negative limit", "give the change that fails the gate as a positive number"
        )
    metric = {"mfu-drop": "mfu", "hfu-drop": "hfu", "step-time-rise": "step_time"}.get(name)
    if metric is None:
        metric = f"loss:{_term(term, f'--fail-if {text!r}')}"
    bound = "rise" if name.endswith("rise") or name.startswith("loss-rise") else "drop"
    if unit == "%":
        return Rule(text.strip(), metric, bound, value / 100, relative=True)
    if metric == "step_time":
        if unit not in _TIME_UNITS:
            raise OptionsError(
                None,
                f"--fail-if '{text}': a step time needs a unit",
                "write step-time-rise>5% (relative) or >3ms, >500us, >0.1s",
            )
        return Rule(text.strip(), metric, bound, value * _TIME_UNITS[unit])
    if unit in _TIME_UNITS:
        raise OptionsError(
            None,
            f"--fail-if '{text}': a time unit on a share",
            "write a share as 0.03, 3pp, or 5% (relative to before)",
        )
    return Rule(text.strip(), metric, bound, value / 100 if unit == "pp" else value)


# ------------------------------------------------------------------ measures


def measured_steps(a: Analysis, exclude_steps=()) -> tuple[pl.DataFrame, list[int]]:
    """The step rows the gate measures (the totals' counted steps less `exclude_steps`), and the ids left out."""
    rows = counted_steps(a.steps, {*a.totals.step_count.excluded, *exclude_steps})
    kept = set(rows["step"].to_list())
    return rows, [s for s in a.steps["step"].to_list() if s not in kept]


def _values(rows: pl.DataFrame, metric: str) -> list[float | None]:
    if metric == "step_time":
        return rows["window"].to_list()
    if metric in ("mfu", "hfu"):
        return rows[metric].to_list() if metric in rows.columns else [None] * rows.height
    term = metric.split(":", 1)[1]
    budgets = rows["loss_budget"].to_list() if "loss_budget" in rows.columns else [None] * rows.height
    return [(b or {}).get(term) for b in budgets]


def _unknown_why(a: Analysis, metric: str) -> str:
    if metric in ("mfu", "hfu") or metric.startswith("loss:"):
        if not (a.hardware and a.hardware.peak_flops):
            return "the peak is unknown (no hardware in the table for this trace): give --hardware or --peak-tflops"
        if not a.totals.flops_known:
            return "the matmul FLOPs are unknown (no recorded shapes): re-profile with record_shapes=True"
    return "unknown in every counted step (the report's warnings say why)"


def measure(a: Analysis, metric: str, exclude_steps=()) -> dict[str, Any]:
    """The median of `metric` over the counted steps where it is known, with the steps it covers."""
    rows, left_out = measured_steps(a, exclude_steps)
    ids = rows["step"].to_list()
    known = [(s, float(v)) for s, v in zip(ids, _values(rows, metric)) if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {
        "value": statistics.median(v for _, v in known) if known else None,
        "steps": [s for s, _ in known],
        "counted": ids,
        "left_out": left_out,
    }
    if not known:
        out["why"] = _unknown_why(a, metric) if ids else "no counted step"
    return out


def _warmup_steps(a: Analysis) -> list[int]:
    """The steps step statistics take for warm-up (none without step statistics)."""
    return [w.step for w in a.step_stats.warmup] if a.step_stats else []


def _steps_words(steps: list[int]) -> str:
    if not steps:
        return "no step"
    shown = ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]}..{steps[-1]}"
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''} ({shown})"


def _show(metric: str, v: float | None, signed: bool = False) -> str:
    if metric == "step_time":
        return fmt.ms(v, signed)
    return fmt.pp(v, True) if signed else fmt.pp(v)


def _name(metric: str) -> str:
    return {"mfu": "MFU", "hfu": "HFU", "step_time": "step time"}.get(metric) or metric.split(":", 1)[1]


def _too_few(m: dict[str, Any], min_steps: int, side: str = "") -> str | None:
    """Why the steps are too few to judge, or None."""
    n = len(m["steps"])
    if len(m["counted"]) < min_steps:
        left = f"; left out: {', '.join(map(str, m['left_out']))}" if m["left_out"] else ""
        return (
            f"{side}only {len(m['counted'])} counted step{'s' if len(m['counted']) != 1 else ''}{left}, and "
            "--min-steps is "
            f"{min_steps}: profile more active steps, or lower --min-steps"
        )
    if m["value"] is not None and n < min_steps:
        return f"{side}known in only {n} of {len(m['counted'])} counted steps, and --min-steps is {min_steps}"
    return None


def _with_warmup(a: Analysis, why: str, measured_steps: list[int]) -> str:
    """A warm-up step the gate counted is named, with the flag that leaves it out (the median already damps it)."""
    warm = [s for s in _warmup_steps(a) if s in measured_steps]
    if not warm:
        return why
    flags = " ".join(f"--exclude-step {s}" for s in warm)
    return (
        f"{why}; step{'s' if len(warm) > 1 else ''} {', '.join(map(str, warm))} look{'' if len(warm) > 1 else 's'} "
        f"like warm-up ({flags} leaves {'them' if len(warm) > 1 else 'it'} out)"
    )


def judge_one(a: Analysis, rule: Rule, tolerance: float, min_steps: int, exclude_steps=()) -> dict[str, Any]:
    """One `check` rule on one trace."""
    m = measure(a, rule.metric, exclude_steps)
    tol = tolerance if is_share(rule.metric) else 0.0
    op = ">=" if rule.bound == "min" else "<="
    out = {
        "rule": rule.text,
        "metric": rule.metric,
        "op": op,
        "threshold": rule.threshold,
        "tolerance": tol,
        "measured": m["value"],
        "steps": m["steps"],
        "status": UNKNOWN,
        "cause": None,
        "why": "",
    }
    few = _too_few(m, min_steps)
    name, v = _name(rule.metric), m["value"]
    if few:
        out.update(cause="steps", why=few)
    elif v is None:
        out.update(cause="value", why=f"{name} unknown: {m['why']}")
    else:
        limit = rule.threshold - tol if rule.bound == "min" else rule.threshold + tol
        ok = v >= limit if rule.bound == "min" else v <= limit
        word = (
            ("at least" if rule.bound == "min" else "within") if ok else ("below" if rule.bound == "min" else "above")
        )
        slack = f" {'-' if rule.bound == 'min' else '+'} {fmt.pp(tol, True).lstrip('+')} tolerance" if tol else ""
        why = (
            f"median {name} {_show(rule.metric, v)} over {_steps_words(m['steps'])} is {word} "
            f"{_show(rule.metric, rule.threshold)}{slack}"
        )
        out.update(status=PASS if ok else FAIL, why=_with_warmup(a, why, m["steps"]))
    return out


def result_of(rules: list[dict[str, Any]], allow_unknown: bool) -> str:
    """The gate's result from its rules' statuses."""
    if any(r["status"] == FAIL for r in rules):
        return FAIL
    if any(r["status"] == UNKNOWN and (r["cause"] == "steps" or not allow_unknown) for r in rules):
        return UNKNOWN
    return PASS


def check(
    analyses: list[Analysis],
    rules: list[Rule],
    tolerance: float = DEFAULT_TOLERANCE,
    min_steps: int = DEFAULT_MIN_STEPS,
    allow_unknown: bool = False,
    exclude_steps=(),
) -> dict[str, Any]:
    """Every rule on every trace (each judged on its own): `traceflops check`'s result (`schema:
    traceflops.check/1`)."""
    traces, judged = [], []
    for a in analyses:
        path = path_text(a.meta.get("path"))
        rows, left_out = measured_steps(a, exclude_steps)
        traces.append(
            {
                "path": path,
                "steps_in_trace": a.steps.height,
                "steps_counted": rows["step"].to_list(),
                "steps_left_out": left_out,
                "warmup": _warmup_steps(a),
            }
        )
        judged += [{"trace": path, **judge_one(a, r, tolerance, min_steps, exclude_steps)} for r in rules]
    result = result_of(judged, allow_unknown)
    return {
        "schema": CHECK_SCHEMA,
        "result": result,
        "exit_code": EXIT_CODES[result],
        "tolerance": tolerance,
        "min_steps": min_steps,
        "allow_unknown": allow_unknown,
        "measure": "median over the counted steps",
        "traces": traces,
        "rules": judged,
    }


def judge_change(
    a: Analysis, b: Analysis, rule: Rule, tolerance: float, min_steps: int, exclude_steps=()
) -> dict[str, Any]:
    """One `--fail-if` rule on the change from `a` (before) to `b` (after)."""
    ma, mb = measure(a, rule.metric, exclude_steps), measure(b, rule.metric, exclude_steps)
    tol = tolerance if is_share(rule.metric) else 0.0
    va, vb = ma["value"], mb["value"]
    change = None if va is None or vb is None else (va - vb if rule.bound == "drop" else vb - va)
    out = {
        "rule": rule.text,
        "metric": rule.metric,
        "direction": rule.bound,
        "before": va,
        "after": vb,
        "change": change,
        "threshold": rule.threshold,
        "relative": rule.relative,
        "tolerance": tol,
        "limit": None,
        "steps_before": ma["steps"],
        "steps_after": mb["steps"],
        "status": UNKNOWN,
        "cause": None,
        "why": "",
    }
    name = _name(rule.metric)
    few = _too_few(ma, min_steps, "before: ") or _too_few(mb, min_steps, "after: ")
    if few:
        out.update(cause="steps", why=few)
        return out
    if change is None:
        side, m = ("before", ma) if va is None else ("after", mb)
        out.update(cause="value", why=f"{name} unknown {side}: {m['why']}")
        return out
    limit = (rule.threshold * abs(va) if rule.relative else rule.threshold) + tol
    failed = change > limit
    moved = "fell" if rule.bound == "drop" else "rose"
    if change < 0:
        moved = "rose" if rule.bound == "drop" else "fell"
    amount = (
        (lambda v: _show(rule.metric, v, True).lstrip("+"))
        if is_share(rule.metric)
        else (lambda v: _show(rule.metric, v))
    )
    how = (
        f"{rule.threshold * 100:g}% of before = {amount(rule.threshold * abs(va))}"
        if rule.relative
        else amount(rule.threshold)
    )
    slack = f" + tolerance {fmt.pp(tol, True).lstrip('+')}" if tol else ""
    why = (
        f"median {name} {moved} from {_show(rule.metric, va)} to {_show(rule.metric, vb)} "
        f"({_show(rule.metric, vb - va, True)}); fails above a {rule.bound} of {how}{slack}"
    )
    out.update(status=FAIL if failed else PASS, limit=limit, why=why)
    return out


def diff_gate(
    a: Analysis,
    b: Analysis,
    rules: list[Rule],
    tolerance: float = DEFAULT_TOLERANCE,
    min_steps: int = DEFAULT_MIN_STEPS,
    allow_unknown: bool = False,
    exclude_steps=(),
) -> dict[str, Any]:
    """`diff --fail-if`: every rule on the change from `a` to `b` (the diff's `gate`)."""
    judged = [judge_change(a, b, r, tolerance, min_steps, exclude_steps) for r in rules]
    result = result_of(judged, allow_unknown)
    return {
        "result": result,
        "exit_code": EXIT_CODES[result],
        "tolerance": tolerance,
        "min_steps": min_steps,
        "allow_unknown": allow_unknown,
        "measure": "median over the counted steps of each side",
        "rules": judged,
    }
