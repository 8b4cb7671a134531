"""Conservation checks on a finished analysis: a broken invariant stops with InternalError (exit 4) instead of becoming
a number.

Every device activity is in exactly one time class, each (device, step) time
partition sums to its window (`stages.timeline.check_partition`), and every
fully known loss budget sums to 1 (`metrics.budget.check_budget`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceflops.core.errors import ConservationError, InternalError
from traceflops.core.vocab import BUSY_CLASSES
from traceflops.metrics import budget as bd
from traceflops.stages import timeline as tl

BUG = "this is a bug in traceflops: rerun with --debug and report it with the traceback"
CLASSES = BUSY_CLASSES  # matmul, other_compute, memcpy, memset, communication


def check_classes(kernels: pl.DataFrame, path: str | None = None) -> None:
    """Every device activity in exactly one time class (`cls` one of CLASSES, never null)."""
    if kernels.height == 0:
        return
    if "cls" not in kernels.columns:
        raise InternalError(path, "device activities were never classified", BUG)
    bad = kernels.filter(~pl.col("cls").is_in(list(CLASSES)).fill_null(False))
    if bad.height:
        seen = bad.select(pl.col("cls").cast(pl.Utf8).fill_null("null")).unique().to_series().to_list()[:5]
        raise InternalError(
            path, f"{bad.height} device activities have no valid time class (cls: {', '.join(seen)})", BUG
        )


def check_partition(part: pl.DataFrame | None, path: str | None = None) -> None:
    """stages.timeline.check_partition, as an InternalError."""
    if part is None or part.height == 0:
        return
    try:
        tl.check_partition(part)
    except ConservationError as e:
        raise InternalError(path, f"conservation check failed: {e}", BUG) from e


def check_budgets(budgets: list[dict[str, Any] | None], path: str | None = None) -> None:
    """metrics.budget.check_budget on every fully known budget, as an InternalError."""
    for b in budgets:
        if b is None:
            continue
        try:
            bd.check_budget(b)
        except ConservationError as e:
            raise InternalError(path, f"conservation check failed: {e}", BUG) from e


def check_analysis(a: Any) -> None:
    """The conservation checks on a finished `Analysis` (raise InternalError, exit 4)."""
    path = a.trace.meta.get("path")
    check_classes(a.kernels, path)
    check_partition(a.partition, path)
    budgets = list(a.steps["loss_budget"]) if "loss_budget" in a.steps.columns else []
    check_budgets(budgets + [a.totals.loss_budget], path)
