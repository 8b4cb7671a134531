"""The loss budget: where peak × step time went, as fractions that sum to exactly 1.

The budget joins two accounts of the same window T on a device of peak P:
FLOPs (what the matmuls did) and time (the partition of the window). Its
terms, as fractions of P·T:

    mfu                    model FLOPs                          / P·T
  + extra_executed         (executed − recompute − model)       / P·T   (may be < 0)
  + recompute              recompute FLOPs                      / P·T
  + attention_mask_credit  −(attention full − effective)        / P·T   (≤ 0)
    ─────────────────────  = effective executed FLOPs / P·T: what ran, at peak
  + matmul_below_peak      matmul time with known FLOPs / T − the line above
  + matmul_flops_unknown   matmul time with unknown FLOPs / T
  + non_matmul             other compute / T
  + memcpy_exposed         memcpy and memset not under compute / T
  + communication_exposed  communication under nothing else / T
  + idle                   idle / T

The first four terms telescope to the effective executed FLOPs, which
`matmul_below_peak` subtracts again, so the sum is the partition's time over
T: 1 whenever the partition sums to the window (which `timeline.partition`
guarantees). `matmul_below_peak` is ≥ 0 unless FLOPs are over-counted (a
matmul faster than peak is impossible), which makes it a counting check too.

Executed FLOPs follow the full-attention convention; the mask credit removes
what masked (causal) attention kernels skipped, so that the time a matmul
"should" take is judged on the work it did.

Unknowns: without a peak, every FLOP term and `matmul_below_peak` are None
(the time terms stay); without model FLOPs, `mfu` and `extra_executed` are
None (their sum, executed − recompute, is still implied by the others). The
sum check runs only when every term is known. `unknown_terms` says which are
unknown, why, and what share they hold together (1 − the known terms), so a
report whose known terms do not reach 100% says so in its headline
(`totals.loss_budget_unknown`).

Totals: add the inputs of the steps (`BudgetInputs.__add__`, `sum_inputs`)
and take the budget of the sum; averaging per-step fractions would weight
short and long steps alike.

Per step over a whole table (`step_budgets`, and `steps_budget` given a
frame): the same formulas as polars expressions and sums in step order (a
cumulative sum: the left-to-right additions of `sum_inputs`, bit for bit), so
200 000 one-op steps cost column operations, not 200 000 dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceflops.core.errors import ConservationError
from traceflops.core.sections import BudgetUnknown, Hardware

TIME_KEYS = ("matmul_known", "matmul_unknown", "other_compute", "memcpy", "communication_exposed", "idle")
TERMS = (
    "mfu",
    "extra_executed",
    "recompute",
    "attention_mask_credit",
    "matmul_below_peak",
    "matmul_flops_unknown",
    "non_matmul",
    "memcpy_exposed",
    "communication_exposed",
    "idle",
)
SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class BudgetInputs:
    """Plain numbers for one step (or a sum of steps) on one device.

    window_us: the step window (µs); peak_flops: FLOP/s, dense, at the chosen
    precision (None: unknown); model_flops: None when unknown; executed_flops:
    all executed matmul-class FLOPs, recompute included (full-attention
    convention); recompute_flops: the recompute share of them;
    attention_full_flops / attention_effective_flops: attention FLOPs as
    credited and as the masked kernels did them; time_us: the partition, keys
    TIME_KEYS (missing keys are 0).
    """

    window_us: float
    peak_flops: float | None
    model_flops: float | None
    executed_flops: float
    recompute_flops: float = 0.0
    attention_full_flops: float = 0.0
    attention_effective_flops: float = 0.0
    time_us: Mapping[str, float] = field(default_factory=dict)

    def __add__(self, other: BudgetInputs) -> BudgetInputs:
        """Sum of two steps' inputs: the budget of a sum is the time-weighted budget.

        The peak must agree (one device kind); an unknown model FLOP count
        makes the sum's unknown too.
        """
        if self.peak_flops != other.peak_flops:
            raise ValueError(f"cannot add budgets with different peaks ({self.peak_flops} and {other.peak_flops})")
        keys = set(self.time_us) | set(other.time_us)
        return BudgetInputs(
            window_us=self.window_us + other.window_us,
            peak_flops=self.peak_flops,
            model_flops=None
            if self.model_flops is None or other.model_flops is None
            else self.model_flops + other.model_flops,
            executed_flops=self.executed_flops + other.executed_flops,
            recompute_flops=self.recompute_flops + other.recompute_flops,
            attention_full_flops=self.attention_full_flops + other.attention_full_flops,
            attention_effective_flops=self.attention_effective_flops + other.attention_effective_flops,
            time_us={k: self.time_us.get(k, 0.0) + other.time_us.get(k, 0.0) for k in keys},
        )


def sum_inputs(items: Iterable[BudgetInputs]) -> BudgetInputs | None:
    """The inputs of several steps added up (None for none)."""
    total = None
    for item in items:
        total = item if total is None else total + item
    return total


def _flop_terms(b: BudgetInputs, flops_at_peak: float | None) -> dict[str, float | None]:
    """The four FLOP terms; each None when what it needs is unknown."""
    if flops_at_peak is None:
        return {"mfu": None, "extra_executed": None, "recompute": None, "attention_mask_credit": None}
    model = b.model_flops
    return {
        "mfu": None if model is None else model / flops_at_peak,
        "extra_executed": None if model is None else (b.executed_flops - b.recompute_flops - model) / flops_at_peak,
        "recompute": b.recompute_flops / flops_at_peak,
        "attention_mask_credit": -(b.attention_full_flops - b.attention_effective_flops) / flops_at_peak,
    }


def loss_budget(b: BudgetInputs) -> dict[str, float | None] | None:
    """Fractions of peak × window, keys TERMS, summing to 1 (checked when all are known).

    None for an empty window: there is no time to share out.
    """
    if not b.window_us or b.window_us <= 0:
        return None
    t = b.window_us
    at_peak = b.peak_flops * t * 1e-6 if b.peak_flops else None
    out: dict[str, float | None] = _flop_terms(b, at_peak)
    time = {k: float(b.time_us.get(k, 0.0)) for k in TIME_KEYS}
    effective = b.executed_flops - (b.attention_full_flops - b.attention_effective_flops)
    out["matmul_below_peak"] = None if at_peak is None else time["matmul_known"] / t - effective / at_peak
    out["matmul_flops_unknown"] = time["matmul_unknown"] / t
    out["non_matmul"] = time["other_compute"] / t
    out["memcpy_exposed"] = time["memcpy"] / t
    out["communication_exposed"] = time["communication_exposed"] / t
    out["idle"] = time["idle"] / t
    check_budget(out)
    return out


def check_budget(budget: Mapping[str, float | None], tol: float = SUM_TOLERANCE) -> None:
    """Raise if a fully known budget does not sum to 1 within `tol`.

    A budget that misses its sum means the partition did not cover the
    window, or an input was counted twice: a bug, never a result to print.
    """
    vals = [budget.get(k) for k in TERMS]
    known = [v for v in vals if v is not None]
    if len(known) < len(vals):
        return
    total = sum(known)
    if abs(total - 1.0) > tol:
        raise ConservationError(
            "loss budget", f"loss budget sums to {total!r}, not 1 (|error| > {tol}): {dict(budget)}"
        )


FLOP_TERMS = ("mfu", "extra_executed", "recompute", "attention_mask_credit", "matmul_below_peak")


def unknown_terms(budget: Mapping[str, float | None] | None, hardware: Hardware | None) -> BudgetUnknown | None:
    """Which terms of a budget are unknown, why, and the share of peak × time they hold together (1 − the known terms:
    the budget's sum is 1 whatever is unknown, so the unknown terms share the rest); None when every term is known.

    Without a peak the FLOP terms and `matmul_below_peak` are unknown, together the matmul time with known FLOPs;
    with a peak but no model FLOPs, `mfu` and `extra_executed` (their sum is the executed FLOPs less recompute at peak).
    """
    if not budget:
        return None
    unknown = [k for k in TERMS if budget.get(k) is None]
    if not unknown:
        return None
    known = sum(float(v) for k in TERMS if (v := budget.get(k)) is not None)
    if budget.get("matmul_below_peak") is None:
        if not hardware:
            why = "no peak: the hardware is unknown; give --hardware NAME or --peak-tflops N"
        else:
            why = (
                f"no peak: {hardware.name} has no dense {hardware.precision} peak in the table; "
                "give --precision or --peak-tflops N"
            )
        rest = "matmul time with known FLOPs"
    else:
        why = "model FLOPs unknown: no FLOP of the trace is known, or no model description"
        rest = "executed matmul FLOPs less recompute, at peak"
    return BudgetUnknown(terms=unknown, share=1.0 - known, why=why, holds=rest)


def inputs_from_row(step: Mapping[str, Any], time: Mapping[str, Any], peak_flops: float | None) -> BudgetInputs:
    """Budget inputs from a row of `Analysis.steps` and the matching row of `timeline.partition`.

    The window is the partition's (one device), so the time terms and the
    FLOP terms share one denominator.
    """
    return BudgetInputs(
        window_us=float(time["window"]),
        peak_flops=peak_flops,
        model_flops=None if step.get("model_flops") is None else float(step["model_flops"]),
        executed_flops=float(step.get("flops_executed") or 0.0),
        recompute_flops=float(step.get("flops_recompute") or 0.0),
        attention_full_flops=float(step.get("attention_full_flops") or 0.0),
        attention_effective_flops=float(step.get("attention_effective_flops") or 0.0),
        time_us={k: float(time.get(k) or 0.0) for k in TIME_KEYS},
    )


def step_inputs(step: Mapping[str, Any], peak_flops: float | None) -> BudgetInputs:
    """Budget inputs of one row of `Analysis.steps` that carries its `time_<class>` columns (`steptime.attach_time`)."""
    time = {"window": step["window"], **{k: step.get(f"time_{k}") or 0.0 for k in TIME_KEYS}}
    return inputs_from_row(step, time, peak_flops)


def steps_budget(
    rows: Iterable[Mapping[str, Any]] | pl.DataFrame, peak_flops: float | None
) -> dict[str, float | None] | None:
    """The loss budget of several steps added up: their inputs summed, then one budget (the totals', the advice's).
    Given the steps as a frame, the sums are column sums in step order (the same numbers, bit for bit)."""
    if isinstance(rows, pl.DataFrame):
        total = _frame_sum(rows, peak_flops)
    else:
        total = sum_inputs(step_inputs(r, peak_flops) for r in rows)
    return loss_budget(total) if total is not None else None


def _or_zero(steps: pl.DataFrame, name: str) -> pl.Expr:
    """`float(row.get(name) or 0.0)` as an expression: null, a missing column and -0.0 are 0.0."""
    if name not in steps.columns:
        return pl.lit(0.0, pl.Float64)
    x = pl.col(name).cast(pl.Float64)
    return pl.when(x.is_null() | (x == 0.0)).then(0.0).otherwise(x)


def _input_frame(steps: pl.DataFrame) -> pl.DataFrame:
    """Each step's budget inputs (`step_inputs`), as columns: window, model (null: unknown), executed, recompute,
    full, effective and one `t_<key>` per TIME_KEYS."""
    model = pl.col("model_flops").cast(pl.Float64) if "model_flops" in steps.columns else pl.lit(None, pl.Float64)
    return steps.select(
        window=pl.col("window").cast(pl.Float64),
        model=model,
        executed=_or_zero(steps, "flops_executed"),
        recompute=_or_zero(steps, "flops_recompute"),
        full=_or_zero(steps, "attention_full_flops"),
        effective=_or_zero(steps, "attention_effective_flops"),
        **{f"t_{k}": _or_zero(steps, f"time_{k}") for k in TIME_KEYS},
    )


def _frame_sum(steps: pl.DataFrame, peak_flops: float | None) -> BudgetInputs | None:
    """`sum_inputs` of the steps' inputs: each column added left to right (np.cumsum, not a pairwise sum)."""
    if steps.height == 0:
        return None
    f = _input_frame(steps)

    def total(c: str) -> float:
        return float(np.cumsum(f[c].to_numpy())[-1])

    if f["window"].null_count():
        raise TypeError("a step without a window has no loss budget")  # as float(None) in `inputs_from_row`
    return BudgetInputs(
        window_us=total("window"),
        peak_flops=peak_flops,
        model_flops=None if f["model"].null_count() else total("model"),
        executed_flops=total("executed"),
        recompute_flops=total("recompute"),
        attention_full_flops=total("full"),
        attention_effective_flops=total("effective"),
        time_us={k: total(f"t_{k}") for k in TIME_KEYS},
    )


def step_budgets(steps: pl.DataFrame, peak_flops: float | None) -> list[dict[str, float | None] | None]:
    """`loss_budget(step_inputs(row, peak))` of every row, computed on whole columns: the same numbers (numpy's
    element-wise IEEE arithmetic, as Python's floats: polars' fused arithmetic gave 0.0 - 0.0 - 0.0 as -0.0), and the
    same ConservationError for a known budget that misses 1 (the first such step's)."""
    if steps.height == 0:
        return []
    f = _input_frame(steps)
    c = {k: f[k].to_numpy() for k in f.columns if k not in ("window", "model")}
    t = f["window"].fill_null(0.0).to_numpy()
    model_known = f["model"].is_not_null().to_numpy()
    model = f["model"].fill_null(0.0).to_numpy()
    valid = f["window"].is_not_null().to_numpy() & ~(t <= 0)  # `not window or window <= 0`: no budget; NaN goes on
    with np.errstate(divide="ignore", invalid="ignore"):
        credit = c["full"] - c["effective"]
        terms: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}  # values, and where they are known (None: all)
        if peak_flops:
            at_peak = float(peak_flops) * t * 1e-6
            terms["mfu"] = (model / at_peak, model_known)
            terms["extra_executed"] = ((c["executed"] - c["recompute"] - model) / at_peak, model_known)
            terms["recompute"] = (c["recompute"] / at_peak, None)
            terms["attention_mask_credit"] = (-credit / at_peak, None)
            terms["matmul_below_peak"] = (c["t_matmul_known"] / t - (c["executed"] - credit) / at_peak, None)
        else:
            unknown = np.zeros(len(t), bool)
            terms |= {
                k: (np.zeros(len(t)), unknown)
                for k in ("mfu", "extra_executed", "recompute", "attention_mask_credit", "matmul_below_peak")
            }
        terms["matmul_flops_unknown"] = (c["t_matmul_unknown"] / t, None)
        terms["non_matmul"] = (c["t_other_compute"] / t, None)
        terms["memcpy_exposed"] = (c["t_memcpy"] / t, None)
        terms["communication_exposed"] = (c["t_communication_exposed"] / t, None)
        terms["idle"] = (c["t_idle"] / t, None)
        known = valid.copy()
        total = np.zeros(len(t))
        for k in TERMS:  # Python's sum: left to right
            v, m = terms[k]
            total = total + v
            if m is not None:
                known &= m
        bad = known & ~np.isnan(total) & (np.abs(total - 1.0) > SUM_TOLERANCE)
    if bad.any():
        i = int(np.argmax(bad))
        check_budget({k: float(terms[k][0][i]) for k in TERMS})  # the same error, with the same numbers
    cols = [pl.Series(k, v) if m is None else pl.Series(k, v).set(pl.Series(~m), None) for k, (v, m) in terms.items()]
    out = pl.DataFrame(cols).select(pl.when(pl.Series(valid)).then(pl.struct(TERMS)).alias("b"))
    return out["b"].to_list()
