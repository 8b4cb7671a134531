"""What the user told us about the model and the hardware: `ModelOptions`, apart from the other result types so
that checking a command's options loads no polars (annotate checks them before it starts its reader, which it
starts before polars loads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    group_roles: tuple[tuple[str, str], ...] = ()  # (a group's description or name, its role), given by hand
