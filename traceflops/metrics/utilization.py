"""MFU, HFU, per-phase FLOP sums and the totals section: pure functions of the tagged, counted step frames."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import polars as pl

from traceflops.core import fmt, sections
from traceflops.core.results import ModelOptions
from traceflops.core.sections import OutsideSteps, Totals, UnknownKernel
from traceflops.core.trace import name_matches
from traceflops.core.vocab import OUTSIDE, OVERLAYS, PARTITION, PHASES
from traceflops.flops.aten import OP_FLOPS_MAX, OUT_OF_RANGE
from traceflops.flops.kernels import family_of
from traceflops.metrics import budget as bd
from traceflops.stages.link import by_row, nearest
from traceflops.stages.replays import GRAPH_LAUNCH_RE

HFU_SUSPECT = 0.85
COVERAGE_COMPLETE = 0.95  # below this share of matmul time with known FLOPs, FLOP totals are lower bounds
UNKNOWN_SHOWN = 5  # the largest unknown matmul kernels named in the report


def phase_flops(ops: pl.DataFrame) -> pl.DataFrame:
    """Per step: FLOPs and matmul counts by phase.

    The in-kernel score recompute of an attention backward is moved from the
    op's phase to 'recompute' (it is in HFU, not in MFU).
    """
    work = ops.filter(pl.col("matmul") & pl.col("ran"))
    rec = pl.col("recompute_flops").fill_null(0)
    own = pl.col("flops") - rec
    rows = []
    for p in PHASES:
        in_p = pl.col("phase") == p
        f = pl.when(in_p).then(pl.col("flops") if p == "recompute" else own).otherwise(0)
        if p == "recompute":
            f = f + pl.when(pl.col("phase") != "recompute").then(rec).otherwise(0)
        rows.append(f.sum().alias(f"flops_{p}"))
        rows.append(in_p.sum().cast(pl.Int64).alias(f"count_{p}"))
    return work.group_by("step").agg(
        *rows,
        flops_unknown_count=pl.col("flops").is_null().sum().cast(pl.Int64),
        effective_flops=pl.col("effective_flops").sum(),
        attention_full_flops=pl.when(pl.col("mask").is_not_null()).then(pl.col("flops")).otherwise(0).sum(),
        attention_effective_flops=pl.when(pl.col("mask").is_not_null())
        .then(pl.col("effective_flops"))
        .otherwise(0)
        .sum(),
        attention_model_flops=pl.when(pl.col("mask").is_not_null() & pl.col("phase").is_in(["forward", "backward"]))
        .then(own)
        .otherwise(0)
        .sum(),
    )


def utilization(flops: float | None, seconds: float | None, peak: float | None, devices: int = 1) -> float | None:
    if flops is None or not seconds or not peak or devices <= 0:
        return None
    return float(flops) / (seconds * peak * devices)


def suspect(mfu: float | None, hfu: float | None, frozen: list[str] | None = None) -> list[str]:
    """What the utilization itself says is off: an HFU no real run reaches, an MFU above the HFU (expected, and said
    so, where the model's `frozen` parts ran no weight gradients)."""
    out = []
    if frozen and mfu is not None and hfu is not None and mfu > hfu * (1 + 1e-9):
        return [
            f"MFU {mfu:.1%} exceeds HFU {hfu:.1%}, as expected with frozen weights ({', '.join(frozen)}: no weight "
            "gradients ran for them, while 6N counts them); not a counting error"
        ]
    if hfu is not None and hfu > HFU_SUSPECT:
        out.append(
            f"HFU {hfu:.1%} is above {HFU_SUSPECT:.0%}: likely a counting error (wrong peak, precision or FLOPs), not "
            "a fast run"
        )
    if mfu is not None and hfu is not None and mfu > hfu * (1 + 1e-9):
        out.append(
            f"MFU {mfu:.1%} exceeds HFU {hfu:.1%}: the model FLOPs exceed what was executed; check the model "
            "description or tokens per step"
        )
    return out


def coverage(times: np.ndarray, known: np.ndarray) -> float | None:
    total = float(times.sum())
    return None if total <= 0 else float(times[known].sum()) / total


def with_phase_flops(steps: pl.DataFrame, ops: pl.DataFrame, kernels: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each step with its FLOPs and matmul counts by phase (0 where a step ran none).

    `flops_unknown_count` also counts the matmul kernels no op gave FLOPs (told by name: a graph replay, a framework
    op without a formula): a step whose only matmuls are those has unknown, not zero, FLOPs.
    """
    per_step = phase_flops(ops)
    out = steps.join(per_step, on="step", how="left").with_columns(
        [pl.col(c).fill_null(0) for c in per_step.columns if c != "step"]
    )
    unknown = unknown_kernels_per_step(kernels)
    if unknown is None:
        return out
    return (
        out.join(unknown, on="step", how="left")
        .with_columns(flops_unknown_count=pl.col("flops_unknown_count") + pl.col("_unknown_kernels").fill_null(0))
        .drop("_unknown_kernels")
    )


def unknown_kernels_per_step(kernels: pl.DataFrame | None) -> pl.DataFrame | None:
    """Per step, the matmul kernels whose FLOPs no op gave (`matmul_row` null)."""
    if kernels is None or kernels.height == 0 or "cls" not in kernels.columns:
        return None
    return (
        kernels.filter((pl.col("cls") == "matmul") & pl.col("matmul_row").is_null())
        .group_by("step")
        .agg(_unknown_kernels=pl.len().cast(pl.Int64))
    )


def device_only(ops: pl.DataFrame, kernels: pl.DataFrame) -> bool:
    """Device activity that no host op can be tied to: no host op at all, or none of the runtime launches that tie
    kernels to them (no cpu_op events, or the runtime's launch events missing). No shapes reach a kernel, so no
    FLOP can be known: MFU and HFU are unknown, never 0."""
    if kernels.height == 0:
        return False
    if ops.height == 0:
        return True
    if "op_row" not in kernels.columns or not {"row", "cat"} <= set(ops.columns):
        return False
    rows = kernels["op_row"].drop_nulls().unique()  # an annotation (ProfilerStep#N) records no shapes: no op to tie to
    tied = (pl.col("row").is_in(rows.implode()) & (pl.col("cat") != "user_annotation")).fill_null(False).any()
    return not ops.select(tied).item()  # a count of the rows, not a copy of the ops that match


def flops_unknown(device_only, executed, unknown_count):
    """No FLOP known: device activity only, or none counted while some matmul's FLOPs are unknown. HFU is then
    null and a diff says unknown, never 0. Takes plain values (the totals) or polars expressions (each step)."""
    return device_only | ((executed == 0) & (unknown_count > 0))


def step_metrics(
    steps: pl.DataFrame, model_flops, model_no_attn, peak: float | None, device_only: bool = False
) -> pl.DataFrame:
    """Per step: executed and model FLOPs, MFU, HFU, `flops_known`. A step whose matmul FLOPs are all unknown has HFU
    null, never 0."""
    executed = cast(pl.Expr, sum(pl.col(f"flops_{p}") for p in PHASES))  # an Expr: PHASES is not empty
    secs = pl.col("window") * 1e-6
    peak_e = pl.lit(peak, pl.Float64)
    unknown = flops_unknown(pl.lit(device_only), executed, pl.col("flops_unknown_count").fill_null(0))
    cols = [
        executed.alias("flops_executed"),
        model_flops.alias("model_flops"),
        (model_flops / (secs * peak_e)).alias("mfu"),
        pl.when(unknown).then(None).otherwise(executed / (secs * peak_e)).alias("hfu"),
        (~unknown).alias("flops_known"),  # the one decision: renderers show unknown, never 0
    ]
    if model_no_attn is not None:
        cols.append((model_no_attn / (secs * peak_e)).alias("mfu_no_attention"))
    else:
        cols.append(pl.lit(None, pl.Float64).alias("mfu_no_attention"))
    return steps.with_columns(cols)


def outside_section(
    kernels: pl.DataFrame, ops: pl.DataFrame, activities: pl.DataFrame | None = None
) -> OutsideSteps | None:
    """Work outside every step: device activities launched there, or (no device activity) the host ops and XLA ops that
    ran there."""
    work = kernels if kernels.height or activities is None else activities
    out = work.filter(pl.col("step") == OUTSIDE)
    if out.height == 0:
        return None
    return OutsideSteps(
        device_us=float(out["dur"].sum()),
        kernels=out.height,
        flops={p: int(out.filter(pl.col("phase") == p)["flops"].sum() or 0) for p in PHASES},
    )


def in_steps_unknown(ops: pl.DataFrame, opt: ModelOptions) -> int:
    sel = ops.filter(
        pl.col("matmul") & pl.col("ran") & (pl.col("step") >= 0) & ~pl.col("step").is_in(list(opt.exclude_steps))
    )
    return sel["flops"].null_count()


def totals_section(steps, ops, kernels, opt: ModelOptions, peak, only_device: bool | None = None) -> dict[str, Any]:
    """The totals' numbers over the counted steps (the pipeline adds the step count, experts, idle reasons and
    the budget's unknown terms when it builds `Totals`). `only_device`: `device_only(ops, kernels)`, if known."""
    use = steps.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    flops = {p: int(use[f"flops_{p}"].sum()) for p in PHASES}
    flops["executed"] = sum(flops.values())
    counts = {p: int(use[f"count_{p}"].sum()) for p in PHASES}
    wall = float(use["window"].sum())
    model_total = use["model_flops"].sum() if use["model_flops"].null_count() < use.height else None
    no_attn = use["mfu_no_attention"]
    secs = wall * 1e-6
    # Matmul ops, and matmul kernels no op counted, whose FLOPs are unknown (any of either: nothing known is not 0).
    unknown = int(in_steps_unknown(ops, opt)) or int(use["flops_unknown_count"].sum() or 0)
    only_device = device_only(ops, kernels) if only_device is None else only_device
    nothing_known = bool(flops_unknown(only_device, flops["executed"], unknown))
    mfu = None if nothing_known and not opt.spec else utilization(model_total, secs, peak)
    hfu = None if nothing_known else utilization(flops["executed"], secs, peak)
    mfu_na = None
    if mfu is not None and no_attn.null_count() < use.height:
        mfu_na = float((no_attn * use["window"]).sum() / wall) if wall else None
    # Coverage: share of matmul time whose FLOPs are known.
    # Only the columns read below are filtered, never a copy of every column of the ops (or kernels).
    in_steps = ops.select("dur", "flops").filter(
        ops["matmul"] & ops["ran"] & ~ops["step"].is_in(list(opt.exclude_steps)) & (ops["step"] >= 0)
    )
    if kernels.height:
        mk = kernels.select("dur", "flops").filter(
            (kernels["cls"] == "matmul") & (kernels["step"] >= 0) & ~kernels["step"].is_in(list(opt.exclude_steps))
        )
        cov = coverage(mk["dur"].to_numpy(), mk["flops"].is_not_null().to_numpy())
    else:
        cov = coverage(in_steps["dur"].to_numpy(), in_steps["flops"].is_not_null().to_numpy())
    time_us = {c: float(use[f"time_{c}"].sum()) for c in PARTITION}
    overlay_us = {c: float(use[f"time_{c}"].sum()) for c in OVERLAYS}
    partial = cov is not None and cov < COVERAGE_COMPLETE
    return {
        "wall_us": wall,
        "time_us": time_us,
        "overlay_us": overlay_us,
        "loss_budget": bd.steps_budget(use, peak),
        "matmul_count": counts,
        "flops": flops,
        "flops_known": not nothing_known,  # the one decision renderers and diffs read: unknown is never shown as 0
        "flops_coverage": cov,
        # Below COVERAGE_COMPLETE the executed FLOPs miss a share of the matmul work: HFU, and an MFU whose model FLOPs
        # are
        # the trace's own, are lower bounds (a model description's FLOPs do not depend on what was recognised).
        "flops_lower_bound": bool(partial),
        "unknown_matmul_kernels": unknown_matmul_kernels(kernels, ops, opt) if kernels.height else [],
        "matmul_flops_unknown_count": int(in_steps["flops"].null_count()),
        "mfu": mfu,
        "mfu_no_attention": mfu_na,
        "hfu": hfu,
    }


def unknown_flops_warnings(
    ops: pl.DataFrame, kernels: pl.DataFrame, totals: Totals, only_device: bool | None = None
) -> list[str]:
    """Why FLOPs are unknown: no host ops at all, no recorded shapes, or shapes no formula takes. `only_device`:
    `device_only(ops, kernels)`, if known."""
    if ops.height == 0 and kernels.height:
        return [
            "the trace holds device activity only (no host ops): phases and FLOPs are unknown and GEMM kernels are "
            "told by "
            "name; profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and record_shapes=True"
        ]
    if device_only(ops, kernels) if only_device is None else only_device:
        return [
            (
                "no device activity can be tied to a host op (the trace has no CPU ops or no runtime launch events): "
                "phases "
                "and FLOPs are unknown, MFU and HFU too, and GEMM kernels are told by name; profile with activities="
                "[ProfilerActivity.CPU, ProfilerActivity.CUDA] and record_shapes=True, and keep the cuda_runtime events"
            )
        ]
    out = []
    if totals.flops_lower_bound:
        top = totals.unknown_matmul_kernels
        largest = "; ".join(f"{k.time_us / 1e3:.2f} ms in {k.count} x {k.name[:80]} ({k.why})" for k in top[:2])
        out.append(
            f"FLOPs known for only {totals.flops_coverage:.1%} of matmul time: {fmt.bound_words(totals)}; "
            f"largest unknown: {largest}"
        )
    n = totals.matmul_flops_unknown_count
    if not n:
        return out
    wild = ops.select((pl.col("matmul") & pl.col("flops_reason").str.starts_with(OUT_OF_RANGE)).sum()).item() or 0
    if wild:
        return out + [
            (
                f"{n} matmul ops have unknown FLOPs, {wild} of them because their shapes imply more than "
                f"{OP_FLOPS_MAX:.2g} "
                "FLOPs in one op (corrupt or edited shapes): left uncounted"
            )
        ]
    if ops.select((pl.col("matmul") & pl.col("dims").is_null()).any()).item():
        return out + [
            f"{n} matmul ops have no recorded shapes: their FLOPs are unknown (re-profile with record_shapes=True)"
        ]
    return out + [f"{n} matmul ops have FLOPs that cannot be derived from their inputs"]


def window_warnings(
    steps: pl.DataFrame, kernels: pl.DataFrame, outside: OutsideSteps | None, last_counted: bool = True
) -> list[str]:
    """What the report's windows leave open: a counted last step with nothing to bound it, work launched outside every
    step."""
    out = []
    if last_counted and steps.filter(pl.col("last")).height and kernels.height:
        out.append("the last step ends at its last device activity (no next step to bound it)")
    if outside and kernels.height:
        out.append(
            f"{outside.kernels} device activities ({outside.device_us:.1f} us) were launched outside every step; "
            "reported under outside_steps"
        )
    elif outside:
        out.append(
            f"{outside.kernels} ops ({outside.device_us:.1f} us of work) ran outside every step (an XLA program that "
            "runs after its step's host span, without block_until_ready, or host work between steps); reported under "
            "outside_steps"
        )
    return out


def hook_warnings(ops: pl.DataFrame) -> list[str]:
    """Matmuls that gradient hooks ran (a DDP communication hook such as PowerSGD): seen, counted in HFU, not in model
    FLOPs."""
    hooked = ops.filter(pl.col("in_hook") & pl.col("matmul") & pl.col("ran") & (pl.col("step") >= 0))
    if hooked.height == 0:
        return []
    return [
        f"{hooked.height} matmul ops ran inside gradient hooks (torch::autograd::AccumulateGrad, e.g. a DDP "
        f"communication hook): {float(hooked['flops'].fill_null(0).sum()):.4g} FLOPs in phase 'other', counted in HFU, "
        "not in model FLOPs"
    ]


def unnamed_xla_warnings(ops: pl.DataFrame) -> list[str]:
    """XLA matmul ops that carry no name stack: their phase came from when they ran, or is unknown ('other')."""
    sel = ops.filter(
        (pl.col("cat") == "xla_op")
        & pl.col("scope").is_null()
        & pl.col("matmul")
        & pl.col("ran")
        & (pl.col("step") >= 0)
    )
    if sel.height == 0:
        return []
    bwd = sel.filter(pl.col("phase") == "backward").height
    return [
        f"{sel.height} XLA matmul ops carry no op_name (XLA dropped the metadata, e.g. weight gradients in a jit of "
        f"their own): {bwd} ran after their step's backward began and are taken as backward, {sel.height - bwd} "
        "have an unknown phase (counted as other, in HFU only)"
    ]


def unknown_matmul_kernels(kernels: pl.DataFrame, ops: pl.DataFrame, opt: ModelOptions) -> list[UnknownKernel]:
    """The matmul-class kernels with unknown FLOPs that take the most time in the analysed steps, each with why.

    Why: replayed from a CUDA/HIP graph with no op recorded for it, launched by an op without a FLOP formula (named),
    launched by a matmul op whose shapes gave no count (its reason), or no host op at all.
    """
    sel = kernels.filter(
        (pl.col("cls") == "matmul")
        & pl.col("flops").is_null()
        & (pl.col("step") >= 0)
        & ~pl.col("step").is_in(list(opt.exclude_steps))
    )
    if sel.height == 0:
        return []
    op_name = (
        by_row(ops, sel["op_row"], "name").to_series() if ops.height else pl.Series([None] * sel.height, dtype=pl.Utf8)
    )
    reason = by_row(ops, sel["matmul_row"], "flops_reason").to_series() if ops.height else op_name
    graph = (
        sel["launch_name"].fill_null("").str.contains(GRAPH_LAUNCH_RE)
        if "launch_name" in sel.columns
        else pl.Series([False] * sel.height)
    )
    if "from_capture" in sel.columns:
        graph = graph & ~sel["from_capture"]  # a replayed kernel tied to its captured op is told by that op
    why = (
        pl.when(pl.col("_reason").is_not_null())
        .then(pl.format("{}: {}", pl.col("_op"), pl.col("_reason")))
        .when(pl.col("_graph"))
        .then(pl.lit("replayed from a CUDA/HIP graph: no op recorded it (give the graph's capture trace)"))
        .when(pl.col("_op").is_not_null())
        .then(pl.format("launched by {}, which has no FLOP formula", pl.col("_op")))
        .otherwise(pl.lit("no host op launched it"))
    )
    rows = (
        sel.select("name", "dur", _op=op_name, _reason=reason, _graph=graph)
        .with_columns(why=why)
        .group_by("name", "why")
        .agg(count=pl.len(), time_us=pl.col("dur").sum())
        .sort(["time_us", "name"], descending=[True, False])
        .head(UNKNOWN_SHOWN)
    )
    out = []
    for r in rows.iter_rows(named=True):
        fam = family_of(r["name"])
        out.append(
            UnknownKernel(
                name=r["name"],
                family=fam.name if fam else None,
                count=int(r["count"]),
                time_us=float(r["time_us"]),
                why=r["why"],
            )
        )
    return out


def cut_without_flops(steps: pl.DataFrame, totals: Totals) -> tuple[pl.DataFrame, Totals, list[str]]:
    """A cut file whose analysed steps hold no matmul FLOP: its matmuls may be what the cut lost, so MFU and HFU are
    unknown, never a zero read as a result."""
    if totals.flops["executed"] or totals.mfu is None and totals.hfu is None:
        return steps, totals, []
    cols = [c for c in ("mfu", "mfu_no_attention", "hfu") if c in steps.columns]
    steps = steps.with_columns([pl.lit(None, pl.Float64).alias(c) for c in cols])
    totals = sections.replace(totals, mfu=None, mfu_no_attention=None, hfu=None, flops_known=False)
    return (
        steps,
        totals,
        [
            (
                "the file is cut and its steps hold no matmul FLOP: MFU and HFU are unknown (the matmuls may "
                "be after the cut); analyse the whole file"
            )
        ],
    )


# Experts run as grouped GEMMs (torch._grouped_mm and its scaled forms: torchtitan, Megatron's grouped GEMM path) or
# inside a fused MoE op (vLLM's, SGLang's): their FLOPs are the experts', whatever the loop inside them runs.
EXPERT_OP_RE = r"(?i)^aten::_(scaled_)?grouped_mm(_v2)?$|moe"


def expert_flops(ops: pl.DataFrame, opt: ModelOptions) -> dict[str, int] | None:
    """The counted steps' matmul FLOPs run by experts (ops of EXPERT_OP_RE or inside one), per phase and executed;
    None when the trace runs none."""
    if ops.height == 0:
        return None
    is_expert = name_matches(ops["name"], EXPERT_OP_RE).to_numpy()  # the regex once per distinct name
    if not is_expert.any():
        return None
    inside = nearest(ops["parent"].to_numpy(), is_expert) >= 0
    use = ops.select("phase", "flops").filter(
        pl.Series(inside)
        & ops["matmul"]
        & ops["ran"]
        & (ops["step"] >= 0)
        & ~ops["step"].is_in(list(opt.exclude_steps))
    )
    per = dict(use.group_by("phase").agg(pl.col("flops").sum()).iter_rows())
    out = {p: int(per.get(p) or 0) for p in PHASES}
    out["executed"] = sum(out.values())
    return out
