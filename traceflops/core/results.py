"""The result types every layer passes on: options in, an `Analysis` of one trace, a `RankSummary` per rank, a `Job` across ranks.

Plain values: built once, by keyword, and not changed afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceflops.core.trace import Trace


@dataclass(frozen=True)
class ModelOptions:
    """What the user told us about the model and the hardware (all optional); built by `run.options`."""

    spec: Any = None  # a flops.model.ModelSpec
    tokens_per_step: float | None = None  # global, per step
    world_size: int | None = None
    mode: str | None = None  # 'training' | 'inference' | None = detect
    hardware: str | None = None
    precision: str | None = None
    peak_tflops: float | None = None
    exclude_steps: tuple[int, ...] = ()
    graph_captures: tuple[str, ...] = ()  # traces that recorded the CUDA/HIP graphs the analysed trace replays
    keep_last_step: bool = False  # count the unbounded last step in the totals (left out by default)


@dataclass(frozen=True)
class Analysis:
    """One trace's analysis: built once by the pipeline (keywords only), read by views and renderers."""

    trace: Trace
    ops: pl.DataFrame
    kernels: pl.DataFrame
    steps: pl.DataFrame
    hardware: dict[str, Any] | None
    model: dict[str, Any] | None
    totals: dict[str, Any]
    outside_steps: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    partition: pl.DataFrame | None = None  # per (device, step): time classes and overlays, µs
    idle_gaps: pl.DataFrame | None = None
    launch_stats: pl.DataFrame | None = None
    roofline: pl.DataFrame | None = None  # per kernel: intensity, bound, recoverable time
    top_kernels: pl.DataFrame | None = None  # by name, ranked by recoverable time
    by_kernel: pl.DataFrame | None = None
    by_module: pl.DataFrame | None = None
    by_gemm_shape: pl.DataFrame | None = None  # per GEMM shape, with wave-quantization hints
    advice: list[dict[str, Any]] = field(default_factory=list)  # ranked by the share of step time it would recover
    step_stats: dict[str, Any] | None = None  # variance, outlier and warm-up steps
    critical_path: pl.DataFrame | None = None  # per step: the contiguous segments of what bounded it (stages.critical_path)
    path_summary: dict[str, Any] | None = None  # the critical path as reports show it (views.critical_path.path_summary)

    @property
    def meta(self) -> dict[str, Any]:
        return self.trace.meta

    @property
    def collectives(self) -> pl.DataFrame:
        """Communication kernels with their group, kind, payload and order within the group."""
        from traceflops.views.collectives import collectives

        return collectives(self)

    def to_html(self) -> str:
        from traceflops.api import to_html

        return to_html(self)

    def to_pandas(self) -> dict:
        from traceflops.api import to_pandas

        return to_pandas(self)

    def to_dict(self) -> dict[str, Any]:
        from traceflops.api import to_dict

        return to_dict(self)


@dataclass(frozen=True)
class RankSummary:
    """One rank's small tables for the job view: summarised anywhere, merged later with the same result."""

    rank: int | None
    world_size: int | None
    path: str
    hardware: dict[str, Any] | None
    model: dict[str, Any] | None
    steps: pl.DataFrame  # per step: window, FLOPs, partition, model FLOPs
    collectives: pl.DataFrame  # per collective kernel: pg, seq, kind, ts, end, bytes, group_size, step
    idle: pl.DataFrame  # per step and reason: idle µs
    totals: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    path_comm: pl.DataFrame | None = None  # the critical path's communication segments: step, start, end (µs, own clock)
    advice: list[dict[str, Any]] = field(default_factory=list)  # the rank's top advice headlines (kind, title, share)


@dataclass(frozen=True)
class Job:
    """Many ranks as one job: per-rank and per-step tables on aligned clocks, stragglers, pipeline bubbles."""

    ranks: pl.DataFrame  # per rank: wall, device MFU, HFU, partition totals
    steps: pl.DataFrame  # per step: slowest rank's window, job MFU/HFU
    collectives: pl.DataFrame
    stragglers: pl.DataFrame
    pipeline: pl.DataFrame | None
    clock: dict[str, Any]
    totals: dict[str, Any]
    warnings: list[str]
    summaries: list[RankSummary]
    advice: list[dict[str, Any]] = field(default_factory=list)  # the job's "what to try": waits on late ranks, ranks' own top items
    # Each warning once, as reports say it: (text, the ranks that gave it (none: the job's own), the most times one gave it).
    warning_groups: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)
