"""The JSON report contract: its rows (one shape for a single trace and a job alike), the two reports, and the schema.

The reports are typed values (`Report`, `JobReport`) of the sections
(`core.sections`) and rows below; their encoding is the JSON report, and
`schema/report.schema.json` is `schema()`, generated from these types (a test
fails when the committed file differs). A step row is built from a step
table's row: the Analysis's `steps`, or a rank summary's (which carries the
loss budget as `budget_<term>` columns, since a summary is stored as
parquet). Keys a source lacks are null, never absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from traceflops.core.sections import (
    AdviceItem,
    ByPhase,
    Clock,
    Hardware,
    JobAdviceItem,
    JobTotals,
    LossBudget,
    ModelSection,
    OutsideSteps,
    OverlayUs,
    PathSummary,
    PathUs,
    Section,
    StepStats,
    TimeUs,
    Totals,
    WhatIf,
)
from traceflops.core.vocab import OVERLAYS, PARTITION, PHASES

SCHEMA_ID: Final = "traceflops.report/1"
ByPhaseFlops = dict[str, int | None]  # by phase, and executed

BUDGET_PREFIX = "budget_"
PATH_PREFIX = "path_"


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def loss_budget(row: Mapping[str, Any], keys: list[str] | None = None) -> dict[str, float | None] | None:
    """The step's loss budget: a dict column (an Analysis) or `budget_<term>` columns (a rank summary)."""
    lb = row.get("loss_budget")
    if isinstance(lb, Mapping):
        return dict(lb)
    return _prefixed(row, BUDGET_PREFIX, keys)


def critical_path(row: Mapping[str, Any], keys: list[str] | None = None) -> dict[str, float | None] | None:
    """The step's critical path by kind (µs), from `path_<kind>` columns; None where the trace has none."""
    return _prefixed(row, PATH_PREFIX, keys)


def _prefixed(row: Mapping[str, Any], prefix: str, keys: list[str] | None = None) -> dict[str, Any] | None:
    """The row's `<prefix><name>` columns by name (`keys`: those columns, found once for a table's rows); None where
    there are none or all are null."""
    if keys is None:
        keys = [k for k in row if k.startswith(prefix)]
    got = {k[len(prefix) :]: row[k] for k in keys}
    return got if got and any(v is not None for v in got.values()) else None


def step_records(rows: Iterable[Mapping[str, Any]], rank: int | None) -> list[StepRecord]:
    """`step_record` of each row of one table (the same keys in every row): its prefixed columns found once."""
    out: list[StepRecord] = []
    keys = None
    for s in rows:
        if keys is None:
            keys = ([k for k in s if k.startswith(BUDGET_PREFIX)], [k for k in s if k.startswith(PATH_PREFIX)])
        out.append(step_record(s, rank, keys))
    return out


def whole(v: Any) -> int | float | None:
    """A number as the report writes it: an integer where it is whole (FLOPs), else the float."""
    if v is None:
        return None
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2**63 else f


def step_record(s: Mapping[str, Any], rank: int | None, keys: tuple[list[str], list[str]] | None = None) -> StepRecord:
    """One step of one rank, as the report contract states it (`keys`: the table's budget_ and path_ columns)."""
    flops = {p: _int(s.get(f"flops_{p}")) for p in PHASES}
    flops["executed"] = _int(s.get("flops_executed"))
    counts = {p: _int(s.get(f"count_{p}")) for p in PHASES}
    return StepRecord(
        rank=rank,
        step=s["step"],  # every step table has the column
        name=s.get("name"),
        start_us=s.get("start"),
        dur_us=s.get("window"),
        host_start_us=s.get("ts"),
        host_dur_us=s.get("dur"),
        window_source=s.get("window_source"),
        last=None if s.get("last") is None else bool(s.get("last")),
        flops=flops,
        matmul_count=counts if any(v is not None for v in counts.values()) else None,
        model_flops=whole(s.get("model_flops")),
        mfu=s.get("mfu"),
        mfu_no_attention=s.get("mfu_no_attention"),
        hfu=s.get("hfu"),
        time_us={c: s.get(f"time_{c}") for c in PARTITION},
        overlay_us={c: s.get(f"time_{c}") for c in OVERLAYS},
        loss_budget=loss_budget(s, keys and keys[0]),
        critical_path_us=critical_path(s, keys and keys[1]),
        launch=StepLaunch(
            kernels=s.get("launch_kernels"),
            median_kernel_us=s.get("launch_median_kernel_us"),
            median_launch_to_start_us=s.get("launch_median_delay_us"),
        ),
    )


def rank_record(rank: int | None, path: str | None, totals: Totals | Mapping[str, Any]) -> RankRecord:
    """One rank's whole-trace numbers, as the report contract states it (the single report's `ranks` too); `totals`:
    an analysis' or a stored summary's."""
    flops = totals.get("flops") or {}
    return RankRecord(
        rank=rank,
        path=path,
        wall_us=totals.get("wall_us"),
        device_mfu=totals.get("mfu"),
        hfu=totals.get("hfu"),
        flops={k: _int(v) for k, v in flops.items()} or None,
        time_us=totals.get("time_us"),
        overlay_us=totals.get("overlay_us"),
        loss_budget=totals.get("loss_budget"),
    )


_ALWAYS = {
    "pg_desc",
    "role",
    "group_size",
}  # null where the trace does not say; every other field is the table's column


def collective_record(row: Mapping[str, Any]) -> CollectiveRecord:
    """One matched collective of a job, as the report contract states it: its row, with its group's description,
    role (`dp`, `tp`, ... from a `mesh_<dim>` description; `world` for the default group) and ranks always present
    (null where the trace does not say)."""
    fields: dict[str, Any] = {
        k: row.get(k) for k in CollectiveRecord.__struct_fields__ if k != "group_ranks" and (k in row or k in _ALWAYS)
    }
    ranks = row.get("group_ranks")
    return CollectiveRecord(**fields, group_ranks=_ranks(ranks) if isinstance(ranks, str) else None)


def _ranks(text: str) -> list[int] | None:
    inner = text.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        return None
    try:
        return [int(x) for x in inner[1:-1].split(",") if x.strip()] or None
    except ValueError:
        return None


# --- the report's rows -----------------------------------------------------------------------------------------------

Int = int | None
Float = float | None


class InputRecord(Section, frozen=True, kw_only=True):
    """One input trace: its path (as given, printable), format, rank and device."""

    path: str | None
    format: str | None
    rank: Int
    world_size: Int | UnsetType = UNSET  # a single trace's (a job's ranks give theirs in `ranks`)
    device: str | None


class StepLaunch(Section, frozen=True, kw_only=True):
    """How the step's kernels were launched: count, median duration, median delay from launch to start."""

    kernels: Int
    median_kernel_us: Float
    median_launch_to_start_us: Float


class StepRecord(Section, frozen=True, kw_only=True):
    """One step of one rank: its window (device, else host), FLOPs, utilization, time classes and loss budget."""

    rank: Int
    step: int
    name: str | None
    start_us: Float
    dur_us: Float
    host_start_us: Float
    host_dur_us: Float
    window_source: Literal["host", "device"] | None
    last: bool | None
    flops: Annotated[ByPhaseFlops, Meta(extra_json_schema={"required": [*PHASES, "executed"]})]
    matmul_count: ByPhase | None
    model_flops: int | float | None
    mfu: Float
    mfu_no_attention: Float
    hfu: Float
    time_us: TimeUs | None
    overlay_us: OverlayUs | None
    loss_budget: LossBudget | None
    critical_path_us: PathUs | None
    launch: StepLaunch


class RankRecord(Section, frozen=True, kw_only=True):
    """One rank's whole-trace numbers (a single trace is one rank)."""

    rank: Int
    path: str | None
    wall_us: Float
    device_mfu: Float
    hfu: Float
    flops: dict[str, Int] | None
    time_us: TimeUs | None
    overlay_us: OverlayUs | None
    loss_budget: LossBudget | None


class CollectiveRecord(Section, frozen=True, kw_only=True):
    """A collective matched across ranks: its process group and order within it, arrival skew apart from transfer,
    bandwidth."""

    pg: Annotated[str, Meta(description="the process group's name (`?` where the trace does not say)")]
    seq: Annotated[
        int,
        Meta(
            description="order within the group (the recorded sequence number where every collective of the group "
            "has one)"
        ),
    ]
    kind: Annotated[
        str | None,
        Meta(
            description="the collective the caller asked for (a gloo reduce-scatter run as an all-reduce is "
            "reduce_scatter)"
        ),
    ]
    pg_desc: Annotated[str | None, Meta(description="the group's description: default_pg, mesh_dp, mesh_tp, ...")]
    role: Annotated[
        str | None,
        Meta(
            description="what the group is for: the mesh dimension of a mesh_<dim> group (dp, tp, pp, ep, cp, "
            "...), world for default_pg"
        ),
    ]
    step: Int
    bytes: Int
    group_size: Annotated[
        Int, Meta(description="ranks in the group (from the collective's args or pg_config), the bus factor's n")
    ]
    ranks: Annotated[int, Meta(description="ranks whose copy of it was matched")]
    arrival_skew_us: Float
    last_rank: Int
    transfer_us: Float
    bus_factor: Float
    algbw_gbps: Float
    busbw_gbps: Float
    busbw_of_nvlink: (
        Annotated[
            Float,
            Meta(
                description="bus bandwidth over the device's NVLink bandwidth per direction (where the device is known)"
            ),
        ]
        | UnsetType
    ) = UNSET
    group_ranks: Annotated[list[int] | None, Meta(description="the group's global ranks")]


class CommunicationRow(Section, frozen=True, kw_only=True):
    """Communication of one dimension (group role), phase and kind: calls, time, exposed and hidden, their shares."""

    rank: Int | UnsetType = UNSET  # a job's per-rank rows
    role: str
    phase: str
    kind: str
    calls: int
    time_us: float
    exposed_us: float
    overlapped_us: float
    window_us: float
    exposed_share: float
    overlapped_share: float
    ranks: int | UnsetType = UNSET  # a job's rows: how many ranks have the row
    max_exposed_share: float | UnsetType = UNSET
    max_rank: Int | UnsetType = UNSET


# A communication row's columns and their kinds, as every trace's table (views.collectives.by_dimension) and a rank
# summary hold it: the row's always-present fields.
COMMUNICATION_SCHEMA = {f.name: f.type.__name__ for f in msgspec.structs.fields(CommunicationRow) if f.required}

# The experts table's columns (views.experts), as the job report lists them.
EXPERT_COLUMNS = (
    "rank",
    "ep_group",
    "steps",
    "expert_flops_per_step",
    "a2a_bytes_per_step",
    "flops_vs_group_mean",
    "bytes_vs_group_mean",
)


class PipelineRow(Section, frozen=True, kw_only=True):
    """One pipeline stage (rank) and step. stage: the rank's place in its pipeline (0 first), from the chain of P2P
    send directions (a step's first transfer between neighbours goes downstream); stages and microbatches: p and m,
    given (--pipeline-stages, --microbatches) or inferred (p from the chain, m from the first stage's forward sends in
    the step), per stages_source (null: unknown). sends, recvs: this rank's P2P transfers; matched: those whose other
    end the peer recorded, paired by (sender, receiver, order); forward_p2p, backward_p2p: transfers carrying
    activations downstream or gradients upstream. p2p_us: time in P2P works; recv_blocked_us: time blocked on receives
    with no compute running (null where the trace records no direction). bubble: recv_blocked_us (else p2p_us, per
    bubble_source) over window; ideal_bubble: (p-1)/(m+p-1)."""

    rank: Int
    step: int
    stage: Int
    stages: Int
    microbatches: Int
    stages_source: Literal["given", "inferred", "given and inferred"] | None
    sends: int
    recvs: int
    matched: int
    forward_p2p: int
    backward_p2p: int
    p2p_us: Float
    recv_blocked_us: Float
    window: Float
    bubble: Float
    bubble_source: Literal["recv_blocked", "p2p_time"]
    ideal_bubble: Float


def _rows(required: tuple[str, ...], text: str | None = None) -> Meta:
    """A table's rows as the report lists them (their columns are the table's; these are always there)."""
    extra: dict[str, Any] = {"items": {"type": "object", "required": list(required)}}
    return Meta(extra_json_schema=extra, description=text) if text else Meta(extra_json_schema=extra)


COMMUNICATION_TEXT = (
    "Communication by dimension, phase and kind over the counted steps (null: none). A dimension is the role of the "
    "collective's process group: dp, tp, pp, ep, cp (from a DeviceMesh dimension mesh_<name>, a torchtitan or Megatron "
    "group description, or --group-role), world (the default group), else the group's description, else ? (no group "
    "recorded). exposed_us and overlapped_us are each collective's share of the steps' communication_exposed and "
    "communication_overlapped (time cut evenly among collectives in flight together), so the rows of one trace add up "
    "to those totals; on a CPU trace a thread's wait on a collective goes to the collective it issued last (kind wait "
    "and role ? when none). Shares are of the summed step windows. A job's rows also give ranks (how many ranks have "
    "the row) and the exposed share's largest rank; its per_rank rows add rank."
)
EXPERTS_TEXT = (
    "A job's expert parallelism (null: no rank runs experts or EP all-to-alls): per rank its EP group (its ranks, as "
    "text), the expert FLOPs (matmuls of grouped-GEMM and fused-MoE ops) and EP all-to-all bytes per counted step, "
    "each over its EP group's mean (1 = even). A single trace gives its expert FLOPs in totals.expert_flops (per "
    "phase; null without expert ops)."
)
JobStepRows = Annotated[list[dict[str, Any]], _rows(("step", "dur_us", "slowest_rank", "mfu", "hfu"))]
ExpertRows = Annotated[
    list[dict[str, Any]],
    _rows(EXPERT_COLUMNS, EXPERTS_TEXT),
]
CommunicationRows = Annotated[list[CommunicationRow] | None, Meta(description=COMMUNICATION_TEXT)]
PATH_RULE = {
    "if": {"properties": {"available": {"const": True}}},
    "then": {"required": ["us", "share", "top", "steps"]},
    "else": {"required": ["why"]},
}


# --- the two reports -------------------------------------------------------------------------------------------------


class Report(msgspec.Struct, kw_only=True):
    """One trace's JSON report."""

    schema: Literal["traceflops.report/1"]
    inputs: list[InputRecord]
    hardware: Hardware | None
    model: ModelSection | None
    steps: list[StepRecord]
    ranks: list[RankRecord]
    outside_steps: OutsideSteps | None
    top_kernels: list[dict[str, Any]] | None  # the roofline's kernels by recoverable time (at most 20)
    modules: list[dict[str, Any]] | None  # time and FLOPs by module (at most 50)
    idle_gaps_by_reason: dict[str, float] | None
    advice: list[AdviceItem]
    what_if: list[WhatIf]  # each loss removed: the mean step time and MFU after, as bounds (views.counterfactual)
    step_stats: StepStats | None
    critical_path: Annotated[PathSummary, Meta(extra_json_schema=PATH_RULE)] | None
    gemm_shapes: list[dict[str, Any]] | None  # GEMM shapes with wave quantization (at most 30)
    communication: CommunicationRows
    totals: Totals
    warnings: list[str]


class JobReport(msgspec.Struct, kw_only=True):
    """A job's JSON report: its steps and ranks rows have the single trace's shape; it adds job_steps, collectives,
    stragglers, pipeline, the ranks' communication and experts, and the clocks' alignment."""

    schema: Literal["traceflops.report/1"]
    inputs: list[InputRecord]
    hardware: Hardware | None
    model: ModelSection | None
    steps: list[StepRecord]
    job_steps: JobStepRows
    ranks: list[RankRecord]
    collectives: list[CollectiveRecord]
    stragglers: list[dict[str, Any]]  # per step, the rank that arrived last and why
    advice: Annotated[
        list[JobAdviceItem],
        Meta(
            description="two sections, each biggest first and none below 5%: the job's own findings (scope job, "
            "shares of the step time summed over ranks), then the worst ranks' own top items (scope rank, shares of "
            "that rank's step time)"
        ),
    ]
    pipeline: list[PipelineRow]
    communication: CommunicationRows
    communication_by_rank: list[CommunicationRow] | None
    experts: ExpertRows | None
    clock: Clock | None
    outside_steps: None
    totals: JobTotals
    warnings: list[str]


def schema() -> dict[str, Any]:
    """`schema/report.schema.json`, generated from the types above: a job's report (it has `job_steps`) or a single
    trace's, chosen by `if`, so a broken report's errors name the key at fault."""
    (single, job), defs = msgspec.json.schema_components([Report, JobReport], ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "traceflops JSON report (one trace or a job of many ranks)",
        "description": "Generated from traceflops.core.contract (python -m traceflops.core.contract); do not edit. "
        "Keys are stable: new ones may be added, none renamed without a new `schema`.",
        "if": {"required": ["job_steps"]},
        "then": job,
        "else": single,
        "$defs": defs,
    }


if __name__ == "__main__":
    import json
    import sys

    sys.stdout.write(json.dumps(schema(), indent=2, sort_keys=True) + "\n")
