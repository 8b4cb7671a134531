"""How steady the steps are: spread of the step windows, outlier steps, warm-up steps.

`step_stats(steps)` reads `Analysis.steps` (step, window, and, when present,
the partition columns time_<class> and the `last` flag) and returns a plain
dict:

    count, mean_us, median_us, std_us (sample, ddof=1; None for one step),
    cv (std / mean), mad_us (median absolute deviation, unscaled),
    outliers: one dict per outlier step, in step order
    warmup:   one dict per warm-up step, in step order

An outlier is a step whose window is far from the median:

    |window - median| > 3·MAD  (and > 5% of the median: near-identical steps have
                                a MAD near 0, and a small wobble is not an outlier)
 or |window - median| > 20% of the median.

For each outlier, `term` names the partition class (matmul, other_compute,
memcpy, communication_exposed, idle) whose time moved most against that
class's median over the steps: what was different in that step.

Warm-up steps are the leading steps (the first, and each next one while the
rule holds) whose window is more than 1.5× the median. They are flagged,
never excluded: every number above counts every step. Leave them out of an
analysis with --exclude-step.

Outliers need at least three steps (two sit symmetrically about their
median). Only steps with a positive window count (a step without device work and a
zero host span tells nothing about step time).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.sections import StepOutlier, StepStats, WarmupStep
from traceflops.core.vocab import OUTLIER_MAD_FLOOR as MAD_FLOOR
from traceflops.core.vocab import OUTLIER_MAD_K as MAD_K
from traceflops.core.vocab import OUTLIER_RELATIVE as RELATIVE
from traceflops.core.vocab import PARTITION

WARMUP_RATIO = 1.5
MIN_STEPS_FOR_OUTLIERS = 3  # two steps sit symmetrically about their median: neither is the odd one


def _order(steps: pl.DataFrame) -> pl.DataFrame:
    key = next((c for c in ("start", "ts", "step") if c in steps.columns), None)
    return steps.sort(key, nulls_last=True) if key else steps


def step_stats(steps: pl.DataFrame) -> StepStats:
    """Mean, median, spread, outlier steps (and what changed in them), warm-up steps."""
    use = _order(steps.filter(pl.col("window").is_not_null() & (pl.col("window") > 0)))
    n = use.height
    empty = StepStats(count=0, mean_us=None, median_us=None, std_us=None, cv=None, mad_us=None, outliers=[], warmup=[])
    if n == 0:
        return empty
    w = use["window"].cast(pl.Float64).to_numpy()
    median = float(np.median(w))
    mean = float(w.mean())
    std = float(w.std(ddof=1)) if n > 1 else None
    mad = float(np.median(np.abs(w - median)))
    terms = [c for c in PARTITION if f"time_{c}" in use.columns]
    term_median = {c: float(np.median(use[f"time_{c}"].cast(pl.Float64).fill_null(0.0).to_numpy())) for c in terms}

    warm = set()
    for i in range(n):
        if w[i] > WARMUP_RATIO * median:
            warm.add(i)
        else:
            break

    ids = use["step"].to_list()
    last = use["last"].to_list() if "last" in use.columns else [False] * n
    outliers = []
    for i in range(n if n >= MIN_STEPS_FOR_OUTLIERS else 0):
        dev = float(w[i] - median)
        rules = []
        if abs(dev) > MAD_K * mad and abs(dev) > MAD_FLOOR * median:
            rules.append("mad")
        if abs(dev) > RELATIVE * median:
            rules.append("relative")
        if not rules:
            continue
        row = use.row(i, named=True)
        deltas = {c: float(row[f"time_{c}"] or 0.0) - term_median[c] for c in terms}
        term = max(deltas, key=lambda c: abs(deltas[c])) if deltas else None
        outliers.append(
            StepOutlier(
                step=ids[i],
                window_us=float(w[i]),
                deviation_us=dev,
                deviation_frac=dev / median if median else None,
                rules=rules,
                term=term,
                term_delta_us=deltas.get(term) if term else None,
                term_us=float(row[f"time_{term}"] or 0.0) if term else None,
                term_median_us=term_median.get(term) if term else None,
                deltas_us=deltas,
                warmup=i in warm,
                last=bool(last[i]),
            )
        )
    warmup = [WarmupStep(step=ids[i], window_us=float(w[i]), ratio=float(w[i] / median)) for i in sorted(warm)]
    return StepStats(
        count=n,
        mean_us=mean,
        median_us=median,
        std_us=std,
        cv=std / mean if std is not None and mean else None,
        mad_us=mad,
        outliers=outliers,
        warmup=warmup,
    )
