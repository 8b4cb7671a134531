"""The result types every layer passes on: options in, an `Analysis` of one trace, a `RankSummary` per rank, a `Job`
across ranks.

Plain values: built once, by keyword, and not changed afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceflops.core import fmt
from traceflops.core.hooks import notebook
from traceflops.core.model_options import ModelOptions as ModelOptions  # its home has no polars: see there
from traceflops.core.sections import (
    AdviceItem,
    Clock,
    Hardware,
    JobAdviceItem,
    JobTotals,
    ModelSection,
    OutsideSteps,
    PathSummary,
    RankAdvice,
    StepStats,
    Totals,
    WhatIf,
)
from traceflops.core.trace import Trace


@dataclass(frozen=True)
class Analysis:
    """One trace's analysis: built once by the pipeline (keywords only), read by views and renderers."""

    trace: Trace
    ops: pl.DataFrame
    kernels: pl.DataFrame
    steps: pl.DataFrame
    hardware: Hardware | None
    model: ModelSection | None
    totals: Totals
    outside_steps: OutsideSteps | None
    warnings: list[str] = field(default_factory=list)
    partition: pl.DataFrame | None = None  # per (device, step): time classes and overlays, µs
    idle_gaps: pl.DataFrame | None = None
    launch_stats: pl.DataFrame | None = None
    roofline: pl.DataFrame | None = None  # per kernel: intensity, bound, recoverable time
    top_kernels: pl.DataFrame | None = None  # by name, ranked by recoverable time
    by_kernel: pl.DataFrame | None = None
    by_module: pl.DataFrame | None = None
    by_gemm_shape: pl.DataFrame | None = None  # per GEMM shape, with wave-quantization hints
    advice: list[AdviceItem] = field(default_factory=list)  # ranked by the share of step time it would recover
    what_if: list[WhatIf] = field(default_factory=list)  # each loss removed: step time and MFU after, as bounds
    step_stats: StepStats | None = None  # variance, outlier and warm-up steps
    critical_path: pl.DataFrame | None = (
        None  # per step: the contiguous segments of what bounded it (stages.critical_path)
    )
    path_summary: PathSummary | None = None  # the critical path as reports show it (views.path_summary.path_summary)
    communication: pl.DataFrame | None = (
        None  # per dimension (group role), phase and kind: exposed and hidden time (views.collectives)
    )
    collectives: pl.DataFrame | None = (
        None  # communication kernels with their group, kind, payload and order in the group
    )

    @property
    def meta(self) -> dict[str, Any]:
        return self.trace.meta

    def __repr__(self) -> str:
        """One line: the file, steps, MFU and HFU, the largest loss-budget terms (the whole analysis is `to_dict()`)."""
        sc = self.totals.step_count
        steps = f"{sc.counted} of {sc.in_trace} steps counted"
        return (
            f"<traceflops.Analysis {fmt.printable(self.meta.get('path'))}: {self.meta.get('format') or 'trace'}, "
            f"{steps}, {utilization_words(self.totals)}; {_budget_words(self.totals.loss_budget)}; "
            f"{len(self.warnings)} warnings>"
        )

    def _repr_html_(self) -> str:
        """A notebook's view: the headline, the loss budget and the top of "what to try" (the full report:
        `to_html()`)."""
        return notebook("html_card")(self)

    def to_html(self) -> str:
        """The self-contained HTML report (`traceflops.to_html`)."""
        return notebook("to_html")(self)

    def to_pandas(self) -> dict:
        """Every table as a pandas frame, by name: a `traceflops.api.Frames` (a dict; `.kernels` as `["kernels"]`)."""
        return notebook("to_pandas")(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as a dict (`traceflops.to_dict`)."""
        return notebook("to_dict")(self)


@dataclass(frozen=True)
class RankSummary:
    """One rank's small tables for the job view: summarised anywhere, merged later with the same result."""

    rank: int | None
    world_size: int | None
    path: str | None
    hardware: Hardware | None  # a stored summary's: decoded into the section (storage.summary checks it)
    model: ModelSection | None
    steps: pl.DataFrame  # per step: window, FLOPs, partition, model FLOPs
    collectives: pl.DataFrame  # per collective kernel: pg, seq, kind, ts, end, bytes, group_size, step
    idle: pl.DataFrame  # per step and reason: idle µs
    totals: Totals
    warnings: list[str] = field(default_factory=list)
    path_comm: pl.DataFrame | None = (
        None  # the critical path's communication segments: step, start, end (µs, own clock)
    )
    advice: list[RankAdvice] = field(default_factory=list)  # the rank's top advice headlines (shares of its step time)
    communication: pl.DataFrame | None = (
        None  # per dimension, phase and kind over the counted steps (views.collectives)
    )


@dataclass(frozen=True)
class Job:
    """Many ranks as one job: per-rank and per-step tables on aligned clocks, stragglers, pipeline bubbles."""

    ranks: pl.DataFrame  # per rank: wall, device MFU, HFU, partition totals
    steps: pl.DataFrame  # per step: slowest rank's window, job MFU/HFU
    collectives: pl.DataFrame
    stragglers: pl.DataFrame
    pipeline: pl.DataFrame | None
    clock: Clock
    totals: JobTotals
    warnings: list[str]
    summaries: list[RankSummary]
    # the job's "what to try": its own findings (scope "job"), then the worst ranks' own top items (scope "rank")
    advice: list[JobAdviceItem] = field(default_factory=list)
    communication: pl.DataFrame | None = (
        None  # per dimension, phase and kind over all ranks (views.collectives.across_ranks)
    )
    communication_by_rank: pl.DataFrame | None = None  # the same per rank
    experts: pl.DataFrame | None = (
        None  # per rank: expert FLOPs and EP all-to-all bytes against its EP group (views.experts)
    )
    # Each warning once, as reports say it: (text, the ranks that gave it (none: the job's own), the most times one gave
    # it).
    warning_groups: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line: ranks, steps, job MFU and HFU, the ranks' largest loss-budget terms (mean over ranks)."""
        return (
            f"<traceflops.Job {len(self.summaries)} ranks, {self.steps.height} steps, "
            f"{utilization_words(self.totals)}; "
            f"{_budget_words(self.mean_budget())} (mean over ranks); {len(self.warnings)} warnings>"
        )

    def _repr_html_(self) -> str:
        """A notebook's view: the headline, the ranks' mean loss budget and the top of the job's "what to try"."""
        return notebook("html_card")(self)

    def mean_budget(self) -> dict[str, float | None] | None:
        """Each loss-budget term's mean over the ranks that know it (None without any rank's budget)."""
        budgets = [b for s in self.summaries if (b := s.totals.loss_budget)]
        if not budgets:
            return None
        out = {}
        for k in dict.fromkeys(k for b in budgets for k in b):
            known = [v for b in budgets if (v := b.get(k)) is not None]
            out[k] = sum(known) / len(known) if known else None
        return out


def utilization_words(totals: Totals | JobTotals) -> str:
    return f"MFU {fmt.pct(totals.mfu)}, HFU {fmt.pct(totals.hfu)}"


def top_terms(budget: dict[str, Any] | None, n: int = 3) -> list[tuple[str, float]]:
    """The largest loss terms (every term but `mfu`, the part that is not lost), largest first."""
    terms = [(k, v) for k, v in (budget or {}).items() if k != "mfu" and v is not None]
    return sorted(terms, key=lambda kv: -kv[1])[:n]


def _budget_words(budget: dict[str, Any] | None) -> str:
    top = top_terms(budget)
    return "loss budget unknown" if not top else "lost to " + ", ".join(f"{k} {fmt.pct(v)}" for k, v in top)
