"""Finished reports, kept per trace and per set of options.

What the JSON and terminal reports read: running the same command again on the same trace renders from here (no parse,
no analysis). Other options still reuse the parsed tables (`trace_cache`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl
from msgspec import ValidationError

from traceflops.core.results import Analysis
from traceflops.core.sections import (
    AdviceItem,
    Hardware,
    ModelSection,
    OutsideSteps,
    PathSummary,
    StepStats,
    Totals,
    WhatIf,
    decode,
    encode,
)
from traceflops.core.trace import Trace, Warnings, empty
from traceflops.storage.bundle import write_bundle
from traceflops.storage.trace_cache import (
    TABLES,
    is_transient,
    key,
    read_entry,
    tidy,
    writable_entry,
)

REPORT_TABLES = ("steps", "top_kernels", "by_module", "by_gemm_shape", "communication")
REPORT_SHAPE = 6  # raised when a kept field gains a key or column (steps' flops_known): an older report is never served
# The Analysis' fields kept, each with the type it is read back as.
REPORT_FIELDS = {
    "hardware": Hardware | None,
    "model": ModelSection | None,
    "totals": Totals,
    "outside_steps": OutsideSteps | None,
    "warnings": list[str],
    "advice": list[AdviceItem],
    "what_if": list[WhatIf],
    "step_stats": StepStats | None,
    "path_summary": PathSummary | None,
}


def report_key(path: str, options) -> str | None:
    """The trace's content key (`trace_cache.key`) with the options: None, and no report kept, when the trace cannot be
    read."""
    k = key(path)
    # The fields kept are part of the key: a report of another shape is never served.
    return (
        None
        if k is None
        else hashlib.sha256(
            f"{k}|{options!r}|{REPORT_SHAPE}|{tuple(REPORT_FIELDS)}|{REPORT_TABLES}".encode()
        ).hexdigest()[:32]
    )


def store_report(path: str, options, a, cache_dir: Path) -> None:
    steps = a.steps
    budgets = list(steps["loss_budget"]) if "loss_budget" in steps.columns else None
    tables = {"steps": steps.drop("loss_budget", strict=False)}
    tables |= {t: getattr(a, t) for t in REPORT_TABLES[1:] if getattr(a, t) is not None}
    meta = {f: encode(getattr(a, f)) for f in REPORT_FIELDS}
    meta["warnings"] = [w for w in a.warnings if not is_transient(w)]  # this run's cache trouble, not the trace's
    meta |= {
        "_meta": {
            k: v for k, v in a.meta.items() if k in ("format", "rank", "world_size", "schema_version", "truncated")
        },
        "_loss_budgets": budgets,
    }
    k = report_key(path, options)
    if k is not None:
        entry = writable_entry(cache_dir / f"{k}.tfreport")
        write_bundle(entry, tables, meta)
        tidy(cache_dir, keep=entry)


def load_report(path: str, options, cache_dir: Path):
    """An `Analysis` holding what the reports read (no event tables), or None."""
    k = report_key(path, options)
    got = None if k is None else read_entry(cache_dir / f"{k}.tfreport")
    if got is None:
        return None
    tables, meta = got
    if "steps" not in tables or any(f not in meta for f in REPORT_FIELDS):
        return None
    steps = tables["steps"]
    if meta.get("_loss_budgets") is not None:
        steps = steps.with_columns(loss_budget=pl.Series(meta["_loss_budgets"], dtype=pl.Object))
    trace_meta = dict(meta.get("_meta") or {}, path=str(path))
    no_ops, no_kernels, no_launches, no_markers, no_steps = (empty({}) for _ in TABLES)
    trace = Trace(no_ops, no_kernels, no_launches, no_markers, no_steps, meta=trace_meta, warnings=Warnings())
    try:
        fields = {f: decode(meta[f], kind) for f, kind in REPORT_FIELDS.items()}
    except ValidationError:  # kept by a build whose sections had another shape: analysed again
        return None
    if isinstance(fields["warnings"], list):  # kept by a build that stored this run's cache trouble too
        fields["warnings"] = [w for w in fields["warnings"] if not (isinstance(w, str) and is_transient(w))]
    return Analysis(
        trace=trace,
        ops=empty({}),
        kernels=empty({}),
        steps=steps,
        top_kernels=tables.get("top_kernels"),
        by_module=tables.get("by_module"),
        by_gemm_shape=tables.get("by_gemm_shape"),
        communication=tables.get("communication"),
        **fields,
    )
