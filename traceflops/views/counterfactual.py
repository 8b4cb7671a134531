"""What fixing one loss would buy: for each loss-budget term, and each advice item, the mean step time and the MFU
after it were removed, as bounds that never promise more than the trace shows the steps waited on.

Over the counted steps (window sum W, n steps, T = W / n), removing a term saves S µs in all; T' = (W - S) / n and,
model FLOPs unchanged, MFU' = MFU × T / T'. What each term can save, at most:

  communication_exposed  the communication with no compute beside it; hiding it leaves every other class of time, so
                         a step never gets shorter than its compute
  idle                   the idle time: the device-busy time (T - idle) is left
  recompute              the recompute kernels' own time (the `recompute` overlay: what they took, more than their
                         FLOPs at peak, which is the budget's term)
  matmul_below_peak      the matmul time with known FLOPs less those FLOPs at peak (the budget's term)
  non_matmul             the other compute's time;  memcpy_exposed: the copies' and memsets' time beside no compute
  extra_executed         (when positive) the FLOPs beyond the model's at peak, at most the matmul time with known FLOPs
  matmul_flops_unknown   cannot be bounded: how far below peak those matmuls ran is unknown

and, in each step with a critical path, at most the path's time through that kind of work (communication; device
matmul; device non-matmul; memcpy; matmul and non-matmul for recompute): work the step did not wait on cannot shorten
it. Idle needs no cap (an idle device is never on the path's device kinds).

Unknown is None, never 0: without a peak or model FLOPs the MFU after is unknown (the step time after is still
known), and without a peak matmul_below_peak cannot be bounded.

An advice item saves its `recoverable_us`, at most its term's saving; a loss-budget entry (an item with `findings`)
is its term, so it carries the term's numbers (for recompute the kernels' time, not the headline's FLOPs at peak).
Sums are column expressions over the steps table (one row per step): no per-event work.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce

import polars as pl

from traceflops.core import fmt, sections
from traceflops.core.results import Analysis
from traceflops.core.sections import AdviceItem, WhatIf
from traceflops.metrics import budget as bd
from traceflops.stages.steps import counted_steps

TITLES = {  # the "if …" clause of each term's counterfactual
    "communication_exposed": "if the exposed communication were hidden",
    "idle": "if the device never sat idle",
    "recompute": "if nothing were recomputed",
    "matmul_below_peak": "if every matmul of known FLOPs ran at peak",
    "non_matmul": "if the non-matmul compute took no time",
    "memcpy_exposed": "if the copies and memsets with no compute beside them were hidden",
    "extra_executed": "if the matmuls did only the model's FLOPs",
    "matmul_flops_unknown": "if the matmuls of unknown FLOPs ran at peak",
}
_SUMS = ("window", "communication_exposed", "on_path", "idle", "recompute", "matmul_known", "matmul_unknown")


@dataclass(frozen=True)
class Saving:
    us: float | None  # over the counted steps; None: it cannot be bounded
    why: str  # one line: why it cannot be more
    loss_us: float | None = None  # the loss itself before the critical path caps it (None: unknown)


@dataclass(frozen=True)
class Counterfactuals:
    """The counted steps' mean step time and MFU, and what each loss term could save at most (`by_term`: loss terms
    the trace holds; a term with nothing to save is 0)."""

    steps: int
    window_us: float
    mfu: float | None
    by_term: dict[str, Saving]

    @property
    def step_time_us(self) -> float:
        return self.window_us / self.steps

    def after(self, saved_us: float | None) -> tuple[float | None, float | None]:
        """(step time, MFU) with `saved_us` (over the counted steps) gone; None where unknown."""
        if saved_us is None:
            return None, None
        left = self.window_us - max(0.0, saved_us)
        mfu = self.mfu * self.window_us / left if self.mfu is not None and left > 0 else None
        return left / self.steps, mfu

    def what_if(self) -> list[WhatIf]:
        """One counterfactual per term that is a loss (the critical path may still cap its saving at 0) or cannot be
        bounded: largest saving first, the unbounded last."""
        out = []
        for term, s in self.by_term.items():
            if s.us is not None and not (s.loss_us or 0.0) > 0:
                continue
            step, mfu = self.after(s.us)
            out.append(
                WhatIf(
                    term=term,
                    title=TITLES[term],
                    step_time_us=self.step_time_us,
                    step_time_after_us=step,
                    mfu=self.mfu,
                    mfu_after=mfu,
                    bound=s.why,
                )
            )
        return sorted(out, key=lambda w: (w.step_time_after_us is None, w.step_time_after_us or 0.0))

    def bound(self, items: list[AdviceItem]) -> list[AdviceItem]:
        """The items (and the findings folded into them) with their step time and MFU after, bounded by their term."""
        return [self._bound(it) for it in items]

    def _bound(self, it: AdviceItem) -> AdviceItem:
        entry = "findings" in it  # a loss-budget entry is its term
        term = self.by_term.get(it.term)
        saved: float | None
        if term is None:
            saved, why = it.recoverable_us, "its recoverable time: no loss-budget term bounds it"
        elif entry or term.us is None:
            saved, why = term.us, term.why
        elif it.recoverable_us > term.us:
            saved, why = term.us, f"at most its term's ({it.term.replace('_', ' ')}): {term.why}"
        else:
            saved = it.recoverable_us
            why = f"its recoverable time, {fmt.duration(saved / self.steps)} per step; {term.why}"
        step, mfu = self.after(saved)
        findings = [self._bound(f) for f in it.findings] if entry and it.findings else it.findings
        return sections.replace(it, mfu_after=mfu, step_time_after_us=step, bound=why, findings=findings)


def program_peak(a: Analysis) -> float | None:
    """The peak of every device that ran the program (a JAX process's chips together), FLOP/s: the MFU's."""
    hw = a.hardware
    if not hw or not hw.peak_flops:
        return None
    return hw.peak_flops * (hw.devices or 1)


def of_analysis(a: Analysis, exclude_steps=None) -> Counterfactuals | None:
    """The counterfactuals of an analysis' counted steps (`exclude_steps`: by default those its totals left out);
    None without step time."""
    if exclude_steps is None:
        exclude_steps = tuple(a.totals.step_count.excluded)
    return counterfactuals(counted_steps(a.steps, exclude_steps), program_peak(a))


def _col(steps: pl.DataFrame, name: str) -> pl.Expr:
    return pl.col(name).cast(pl.Float64).fill_null(0.0) if name in steps.columns else pl.lit(0.0, pl.Float64)


def _path(steps: pl.DataFrame, *kinds: str) -> pl.Expr:
    """The step's critical path through these kinds, µs; null where the step has no path."""
    if any(f"path_{k}" not in steps.columns for k in kinds):
        return pl.lit(None, pl.Float64)
    return reduce(operator.add, [pl.col(f"path_{k}").cast(pl.Float64) for k in kinds])  # null stays null


def _losses(steps: pl.DataFrame, peak_flops: float | None) -> dict[str, tuple[pl.Expr, pl.Expr]]:
    """Each term's loss per step (µs) and the critical path through what the loss is made of (the most removing it
    can shorten the step: work the step did not wait on cannot); idle needs none (device idle time is never on the
    path's device kinds)."""
    out = {
        "communication_exposed": (_col(steps, "time_communication_exposed"), _path(steps, "communication")),
        "idle": (_col(steps, "time_idle"), pl.lit(None, pl.Float64)),
        "recompute": (_col(steps, "time_recompute"), _path(steps, "device_matmul", "device_other")),
        "non_matmul": (_col(steps, "time_other_compute"), _path(steps, "device_other")),
        "memcpy_exposed": (_col(steps, "time_memcpy"), _path(steps, "memcpy")),
    }
    if peak_flops:
        us = 1e6 / peak_flops  # µs per FLOP at peak
        credit = _col(steps, "attention_full_flops") - _col(steps, "attention_effective_flops")
        known = _col(steps, "time_matmul_known")
        out["matmul_below_peak"] = (
            known - (_col(steps, "flops_executed") - credit) * us,
            _path(steps, "device_matmul"),
        )
        extra = (_col(steps, "flops_executed") - _col(steps, "flops_recompute") - _col(steps, "model_flops")) * us
        out["extra_executed"] = (pl.min_horizontal(extra, known), _path(steps, "device_matmul"))
    return out


def counterfactuals(steps: pl.DataFrame, peak_flops: float | None) -> Counterfactuals | None:
    """What each loss term could save over `steps` (the counted steps, with their `time_<class>` and `path_<kind>`
    columns), against `peak_flops` (all devices of the program); None without step time."""
    if steps.height == 0 or float(steps["window"].sum()) <= 0:
        return None
    losses = _losses(steps, peak_flops)
    t = steps.select(
        window=_col(steps, "window").sum(),
        busy=(_col(steps, "window") - _col(steps, "time_idle")).sum(),
        matmul_known=_col(steps, "time_matmul_known").sum(),
        matmul_unknown=_col(steps, "time_matmul_unknown").sum(),
        model_known=pl.col("model_flops").is_not_null().all() if "model_flops" in steps.columns else pl.lit(False),
        model=_col(steps, "model_flops").sum(),
        path_known=pl.col("path_communication").is_not_null().any()
        if "path_communication" in steps.columns
        else pl.lit(False),
        **{f"loss_{k}": loss.sum() for k, (loss, _) in losses.items()},
        **{f"saved_{k}": pl.min_horizontal(loss, cap.fill_null(loss)).sum() for k, (loss, cap) in losses.items()},
    ).row(0, named=True)
    n, w = steps.height, float(t["window"])
    budget = bd.steps_budget(steps, peak_flops) or {}
    mfu = t["model"] / (w * 1e-6 * peak_flops) if peak_flops and t["model_known"] else None
    return Counterfactuals(steps=n, window_us=w, mfu=mfu, by_term=_savings(t, budget, n))


def _savings(t: dict, budget: dict, n: int) -> dict[str, Saving]:
    """Each loss term's saving over the steps (`t`: the steps' sums) and why it is at most that."""

    def per(us: float) -> str:
        return fmt.duration(us / n)

    def saving(term: str, why: str) -> Saving:
        loss, saved = float(t[f"loss_{term}"]), max(0.0, float(t[f"saved_{term}"]))
        if saved < loss and term != "communication_exposed":
            why += (
                f"; only {per(saved)} of it per step is on the critical path"
                if saved
                else "; none of it is on the critical path"
            )
        return Saving(saved, why, loss)

    out = {
        "communication_exposed": saving(
            "communication_exposed",
            "hiding it cannot make a step shorter than its compute; "
            + (
                f"{per(t['saved_communication_exposed'])} of the exposed {per(t['loss_communication_exposed'])} per "
                "step is on the critical path"
                if t["path_known"]
                else f"without a critical path all the exposed {per(t['loss_communication_exposed'])} per step counts"
            ),
        ),
        "idle": saving("idle", f"removing every idle gap leaves the device-busy time, {per(t['busy'])} per step"),
        "recompute": saving(
            "recompute",
            f"at most the recompute kernels' own time, {per(t['loss_recompute'])} per step (what they took, not "
            "their FLOPs at peak)",
        ),
        "non_matmul": saving(
            "non_matmul", f"at most the non-matmul compute's own time, {per(t['loss_non_matmul'])} per step"
        ),
        "memcpy_exposed": saving(
            "memcpy_exposed",
            f"at most the time copies and memsets ran beside no compute, {per(t['loss_memcpy_exposed'])} per step",
        ),
    }
    if "loss_matmul_below_peak" in t:
        out["matmul_below_peak"] = saving(
            "matmul_below_peak",
            f"the matmul time with known FLOPs, {per(t['matmul_known'])} per step, less those FLOPs at peak, "
            f"{per(t['matmul_known'] - t['loss_matmul_below_peak'])}",
        )
    elif t["matmul_known"] > 0:
        out["matmul_below_peak"] = Saving(
            None, "cannot be bounded: no peak, so how far below it the matmuls ran is unknown"
        )
    extra = budget.get("extra_executed")
    if extra is not None and extra > 0 and "loss_extra_executed" in t:
        out["extra_executed"] = saving(
            "extra_executed",
            f"the FLOPs beyond the model's at peak, {per(extra * t['window'])} per step, at most the matmul time "
            "with known FLOPs",
        )
    if t["matmul_unknown"] > 0:
        out["matmul_flops_unknown"] = Saving(
            None,
            f"cannot be bounded: the FLOPs of {per(t['matmul_unknown'])} per step of matmuls are unknown, so how far "
            "below peak they ran cannot be told",
        )
    return {k: out[k] for k in bd.TERMS if k in out}  # the budget's order
