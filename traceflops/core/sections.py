"""The report's sections as typed, immutable values: what the metrics build, the pipeline assembles and reports encode.

Each section is the JSON report's object of the same name, field for field
and in the same order: the report is these values encoded (`encode`), and
`schema/report.schema.json` is generated from them. A field that a source
may lack (a model section from the trace has no sequence length) defaults to
`UNSET` and is left out of the report, as the key was before; every other
field is always present, null where unknown.

Values are built once, by keyword, and never changed; `replace` makes a new
one. Sections also read as read-only mappings (`s["mfu"]`, `s.get("mfu")`,
`"band" in s`, `dict(s)`), the notebook's habit, where `UNSET` reads as absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from traceflops.core.vocab import OVERLAYS, PARTITION, PATH_KINDS, PHASES

Num = int | float


def _keyed(keys: tuple[str, ...]) -> Meta:
    """A dict keyed by a vocabulary (the schema requires its keys): time classes, overlays, budget terms, phases."""
    return Meta(extra_json_schema={"required": list(keys)})


TimeUs = Annotated[dict[str, float | None], _keyed(PARTITION)]  # the time partition by class, µs
OverlayUs = Annotated[dict[str, float | None], _keyed(OVERLAYS)]  # overlays of the partition, µs
LossBudget = Annotated[  # shares of peak × step time
    dict[str, float | None], _keyed(("mfu", "recompute", "matmul_below_peak", "non_matmul", "idle"))
]
PathUs = Annotated[dict[str, float | None], _keyed(PATH_KINDS)]  # the critical path by kind, µs
ByPhase = Annotated[dict[str, int | None], _keyed(PHASES)]  # counts or FLOPs by phase (a step's may be unknown)
PhaseCounts = Annotated[dict[str, int], _keyed(PHASES)]  # counts or FLOPs by phase, over the counted steps


class Section(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A report section: attributes typed, `UNSET` fields absent from the report and from the mapping view."""

    def get(self, key: str, default: Any = None) -> Any:
        v = getattr(self, key, UNSET) if key in self.__struct_fields__ else UNSET
        return default if v is UNSET else v

    def __getitem__(self, key: str) -> Any:
        v = getattr(self, key) if key in self.__struct_fields__ else UNSET
        if v is UNSET:
            raise KeyError(key)
        return v

    def __contains__(self, key: object) -> bool:
        return key in self.__struct_fields__ and getattr(self, key) is not UNSET

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def keys(self) -> list[str]:
        return [f for f in self.__struct_fields__ if getattr(self, f) is not UNSET]

    def values(self) -> list[Any]:
        return [getattr(self, f) for f in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(f, getattr(self, f)) for f in self.keys()]


def replace(section: Any, **changes: Any) -> Any:
    """A copy of `section` with `changes` (the value itself is never changed)."""
    return msgspec.structs.replace(section, **changes)


def _plain(obj: Any) -> Any:
    """numpy scalars and arrays as Python values (a polars sum may hand one over)."""
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(value: Any) -> Any:
    """Sections (and anything holding them) as plain dicts, lists and numbers: the JSON report's values."""
    return msgspec.to_builtins(value, enc_hook=_plain)


def json_default(obj: Any) -> Any:
    """orjson's `default`: a section met inside plain values is encoded as its report object."""
    if isinstance(obj, msgspec.Struct):
        return encode(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def decode(value: Any, kind: Any) -> Any:
    """A section read back from plain values (a stored report or summary); `msgspec.ValidationError` when it is not
    one."""
    return msgspec.convert(value, kind)


# --- hardware ------------------------------------------------------------------------------------------------------


class Hardware(Section, frozen=True, kw_only=True):
    """The device and the peak MFU and HFU are measured against."""

    name: str
    precision: str | None  # the precision whose dense peak is the denominator
    sparse: bool
    peak_flops: float | None  # per device, FLOP/s
    devices: int  # devices of one program (a JAX process's chips): MFU against all their peaks
    source: str  # where the peak came from: the table's source, or --peak-tflops


# --- model ---------------------------------------------------------------------------------------------------------


class ModelPart(Section, frozen=True, kw_only=True):
    """One part of the model (attention, MLP, embeddings, …): its model FLOPs beside what the trace ran."""

    part: str | None
    params: Num | None
    model_flops_per_step: Num | None
    trace_flops_per_step: Num | None
    gemms_per_step: Num | None


class ModelSection(Section, frozen=True, kw_only=True):
    """Model FLOPs per step (PaLM's 6N + 12·L·H·Q·T from a description, or the trace's own forward + backward matmul
    FLOPs), tokens per step and the MFU band."""

    source: str  # flags, a config file, or "trace"
    mode: str  # training | inference
    seq_len: int | UnsetType = UNSET
    seq_len_source: str | UnsetType = UNSET
    flops_per_token: Num | UnsetType = UNSET
    flops_per_token_no_attention: Num | UnsetType = UNSET
    flops_per_token_causal: Num | UnsetType = UNSET
    tokens_per_step: Num | None | UnsetType = UNSET
    tokens_source: str | None | UnsetType = UNSET
    flops_per_step: Num | None
    flops_per_step_no_attention: Num | None
    flops_per_step_causal: Num | None | UnsetType = UNSET
    flops_per_step_device: Num | None | UnsetType = UNSET
    params_matmul: Num | None | UnsetType = UNSET
    counted: dict[str, Num] | UnsetType = UNSET  # matmul parameters by part
    labels: dict[str, str] | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    by_part: list[ModelPart] | None | UnsetType = UNSET
    note: str | UnsetType = UNSET
    band: str | None  # the MFU band (training, against a known device's peak only: none against --peak-tflops)
    band_caveat: str
    # Why the model's FLOPs exceed those executed (MFU above HFU, a negative extra_executed), in a few words
    # (metrics.model_section.above_executed); absent when they do not.
    above_executed: str | UnsetType = UNSET


# --- totals --------------------------------------------------------------------------------------------------------


class StepCount(Section, frozen=True, kw_only=True):
    """Steps in the trace, left out (asked, cut, the unbounded last) and counted in the totals."""

    in_trace: int
    excluded: list[int]
    counted: int


class UnknownKernel(Section, frozen=True, kw_only=True):
    """A matmul-class kernel whose FLOPs are unknown, with why and what it cost."""

    name: str
    family: str | None  # the kernel library's family (flops.kernels), where its name tells
    count: int
    time_us: float
    why: Annotated[
        str,
        Meta(description="a graph replay without its capture, an op without a FLOP formula, or the op's own reason"),
    ]


class BudgetUnknown(Section, frozen=True, kw_only=True):
    """The loss-budget terms a trace cannot know, the share of peak × time they hold together, and why."""

    terms: list[str]
    share: float
    why: str
    holds: str  # what that share is made of


class Totals(Section, frozen=True, kw_only=True):
    """One trace's whole-run numbers over its counted steps: wall, time classes, FLOPs by phase, MFU and HFU, the loss
    budget, and what is unknown."""

    wall_us: float
    time_us: TimeUs | None  # the time partition by class (vocab.PARTITION)
    overlay_us: OverlayUs | None  # overlays of the partition (vocab.OVERLAYS)
    loss_budget: LossBudget | None  # shares of peak × step time; sums to exactly 1
    matmul_count: PhaseCounts
    flops: ByPhase  # by phase, and executed
    flops_known: Annotated[
        bool,
        Meta(
            description="false: no FLOP of the trace is known (no shapes, or device activity "
            "only); FLOPs and HFU are then unknown, never 0"
        ),
    ]
    flops_coverage: Annotated[
        float | None,
        Meta(
            description="share of all matmul-class kernel time (a matmul op's "
            "kernels, and kernels a GEMM, convolution or attention library "
            "names wherever they ran) whose FLOPs are known; null without "
            "matmul time"
        ),
    ]
    flops_lower_bound: Annotated[
        bool,
        Meta(
            description="flops_coverage below 0.95: HFU, and an MFU whose model FLOPs are "
            "the trace's own, are lower bounds"
        ),
    ]
    unknown_matmul_kernels: Annotated[
        list[UnknownKernel],
        Meta(
            description="the matmul-class kernels with unknown FLOPs "
            "taking the most time in the analysed steps (at "
            "most 5), largest first"
        ),
    ]
    matmul_flops_unknown_count: int
    mfu: float | None
    mfu_no_attention: float | None
    hfu: float | None
    step_count: StepCount
    expert_flops: dict[str, int] | None  # by phase and executed, where experts run
    idle_us_by_reason: dict[str, float] | None
    mfu_by_precision: dict[str, float] | None | UnsetType = UNSET  # the MFU against the device's other peaks
    loss_budget_unknown: BudgetUnknown | None


# --- outside the steps, step statistics ----------------------------------------------------------------------------


class OutsideSteps(Section, frozen=True, kw_only=True):
    """Device work outside every step window (before the first, between, after the last)."""

    device_us: float
    kernels: int
    flops: dict[str, int]


class StepOutlier(Section, frozen=True, kw_only=True):
    """A step far from the median window, with the time class that moved most."""

    step: int
    window_us: float
    deviation_us: float
    deviation_frac: float | None
    rules: list[str]
    term: str | None
    term_delta_us: float | None
    term_us: float | None
    term_median_us: float | None
    deltas_us: dict[str, float]
    warmup: bool
    last: bool


class WarmupStep(Section, frozen=True, kw_only=True):
    """A first step much slower than the median (compilation, allocator warm-up)."""

    step: int
    window_us: float
    ratio: float


class StepStats(Section, frozen=True, kw_only=True):
    """How steady the steps are: mean, median, spread, outliers and warm-up steps."""

    count: int
    mean_us: float | None
    median_us: float | None
    std_us: float | None
    cv: float | None
    mad_us: float | None
    outliers: list[StepOutlier]
    warmup: list[WarmupStep]


# --- the critical path ---------------------------------------------------------------------------------------------


class PathStretch(Section, frozen=True, kw_only=True):
    """A stretch of the critical path by kind and name, with its length and how many segments it joins."""

    kind: Literal["host", "launch", "device_matmul", "device_other", "memcpy", "communication", "sync", "idle"]
    name: str
    us: float
    segments: int


class PathStep(Section, frozen=True, kw_only=True):
    """One step's critical path: its length and time by kind, and its longest stretches."""

    step: int
    length_us: float
    us: PathUs
    top: list[PathStretch]


class PathSummary(Section, frozen=True, kw_only=True):
    """The critical path as reports show it; `available` False with `why` when the trace cannot give one."""

    available: bool
    us: PathUs | UnsetType = UNSET
    share: dict[str, float | None] | UnsetType = UNSET
    top: list[PathStretch] | UnsetType = UNSET
    steps: list[PathStep] | UnsetType = UNSET
    meaning: dict[str, str] | UnsetType = UNSET
    why: str | UnsetType = UNSET
    note: str | UnsetType = UNSET


# --- advice --------------------------------------------------------------------------------------------------------


class AdviceItem(Section, frozen=True, kw_only=True):
    """One entry of "what to try": its headline share, the time it would recover, evidence, remedies, what to record."""

    kind: str
    title: str
    recoverable: float
    share: float
    unit: str
    term: str
    recoverable_us: float
    mfu_after: float | None  # the MFU if it were recovered, model FLOPs unchanged: a bound (views.counterfactual)
    step_time_after_us: float | None  # the mean counted step if it were recovered (null: it cannot be bounded)
    bound: str | None  # why it cannot buy more
    evidence: list[str]
    remedies: list[str]
    data: dict[str, Any]
    findings: list[AdviceItem] | UnsetType = UNSET  # the rules' items this entry's term explains
    cause_known: bool | UnsetType = UNSET
    record: list[str] | UnsetType = UNSET


# --- a job across ranks --------------------------------------------------------------------------------------------


class JobTotals(Section, frozen=True, kw_only=True):
    """A job's whole-run numbers over its counted steps: the slowest rank's windows, MFU and HFU over every device."""

    wall_us: float
    world_size: int
    mfu: float | None
    hfu: float | None
    collectives_matched: int
    arrival_skew_us: float  # summed over matched collectives: the last rank's arrival after the first
    transfer_us: float
    model_source: str | None


class Clock(Section, frozen=True, kw_only=True):
    # The docstring is this section's description in schema/report.schema.json: one line, or the schema changes.
    """How ranks' clocks were aligned: each rank's offset from the reference rank, and what matching left unexplained."""  # noqa: E501

    reference_rank: int | None
    offsets_us: dict[str, float]
    residual_skew_us: float | None


class RankAdvice(Section, frozen=True, kw_only=True):
    """One of a rank's top "what to try" headlines, as its summary keeps it for the job (shares of its own step
    time)."""

    kind: str | None
    title: str
    share: float | None
    recoverable: float | None
    term: str | None


class JobAdviceItem(Section, frozen=True, kw_only=True):
    # The docstring is this section's description in schema/report.schema.json: one line.
    """One entry of a job's "what to try": a finding across ranks (scope "job"), or one rank's own top item (scope "rank")."""  # noqa: E501

    scope: Literal["job", "rank"]
    rank: int | None  # scope "rank": the rank whose own item it is (where the item is largest); "job": null
    kind: str | None
    term: str | None
    title: str
    share: float | None
    recoverable: float | None
    unit: str
    evidence: list[str]
    remedies: list[str]
    data: dict[str, Any]
    # The late ranks' counterfactual (kind "late_rank"): the job's mean step time now and if every rank arrived at its
    # collectives at the median rank's pace, the job MFU then, and why these are bounds.
    step_time_us: float | None | UnsetType = UNSET
    step_time_after_us: float | None | UnsetType = UNSET
    mfu_after: float | None | UnsetType = UNSET
    bound: str | UnsetType = UNSET


# --- counterfactuals -----------------------------------------------------------------------------------------------


class WhatIf(Section, frozen=True, kw_only=True):
    """What removing one loss-budget term would buy: the mean counted step now and after, and the MFU now and after
    (model FLOPs unchanged), as bounds, with why they cannot be more."""

    term: str
    title: str  # the "if …" clause
    step_time_us: float
    step_time_after_us: float | None  # null: the loss cannot be bounded
    mfu: float | None
    mfu_after: float | None
    bound: str
