"""Wires the stages: parse → link → phases → counting → steps → metrics, into one `Analysis`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core import hardware as hw
from traceflops.metrics import budget as bd
from traceflops.metrics import utilization as metrics
from traceflops.flops import model as mf
from traceflops.views import advice, rollup
from traceflops.stages import roofline
from traceflops.metrics import stepstats
from traceflops.stages import timeline as tl
from traceflops.stages import clean as sanity
from traceflops.stages.count import count_ops, has_formula
from traceflops.stages.link import by_row, link, nearest
from traceflops.core.memory import return_freed_memory
from traceflops.core.trace import Trace
from traceflops.core.vocab import PHASES
from traceflops.parsers import load
from traceflops.stages.phases import tag_kernels, tag_ops
from traceflops.stages.steps import assign, device_windows, host_steps, incomplete_steps
from traceflops.core.vocab import OUTSIDE
from traceflops.core.vocab import GAP_REASONS, OVERLAYS, PARTITION

# TF32 GEMM kernels: cuBLAS/xmma name it, CUTLASS Ampere kernels say s1688 / tensorop_s (fp32 I/O on tensor cores).
_TF32_RE = re.compile(r"tf32|s1688|tensorop_s\d|xmma_gemm_f32f32_tf32", re.I)


@dataclass
class ModelOptions:
    """What the user told us about the model and the hardware (all optional)."""

    spec: mf.ModelSpec | None = None
    tokens_per_step: float | None = None  # global, per step
    world_size: int | None = None
    mode: str | None = None  # 'training' | 'inference' | None = detect
    hardware: str | None = None
    precision: str | None = None
    peak_tflops: float | None = None
    exclude_steps: tuple[int, ...] = ()


@dataclass
class Analysis:
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

    @property
    def meta(self) -> dict[str, Any]:
        return self.trace.meta

    @property
    def collectives(self) -> pl.DataFrame:
        """Communication kernels with their group, kind, payload and order within the group."""
        from traceflops.views.job import collectives

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


def analyze(path: str, options: ModelOptions | None = None, cache_dir=None, progress=None) -> Analysis:
    """`progress(done_bytes, total_bytes)` is called while a large file is read, if given."""
    return analyze_trace(load(path, cache_dir, progress), options or ModelOptions())


@sanity.checked  # cleans the trace tables first, checks conservation last (InternalError)
def analyze_trace(trace: Trace, opt: ModelOptions) -> Analysis:
    linked = link(trace)
    matmul_like = has_formula(linked.ops["name"], linked.ops["matmul_hint"])
    ops = tag_ops(linked, matmul_like, trace.steps)
    kernels = tag_kernels(linked, ops)
    device_trace = kernels.height > 0
    ops = count_ops(ops, kernels, device_trace)
    return_freed_memory()  # what linking and tagging freed, before the timeline grows

    host, step_source = host_steps(trace)
    opt, warnings_cut = leave_out_cut_steps(trace, host, opt)
    ops = ops.with_columns(step=assign(ops, "ts", host))
    kernels = kernels.with_columns(step=assign(kernels, "launch_ts", host))
    kernels = classify_kernels(kernels, ops)
    steps = device_windows(host, kernels).sort("ts")
    clamped = steps.filter((pl.col("window_source") == "device") & (pl.col("window") <= 0) & ~pl.col("last")).height
    if clamped:
        trace.warnings.add("steps whose first device activity precedes the previous step's (clock or ordering problem): window set to 0", clamped)
    warnings = list(trace.warnings.lines()) + warnings_cut
    if step_source != "ProfilerStep":
        warnings.append(f"no ProfilerStep markers: steps taken from {step_source}")

    hardware, peak, precision = choose_hardware(trace, ops, kernels, opt, warnings)
    per_step = metrics.phase_flops(ops)
    steps = steps.join(per_step, on="step", how="left").with_columns(
        [pl.col(c).fill_null(0) for c in per_step.columns if c != "step"]
    )
    mode = opt.mode or ("training" if (ops["phase"] == "backward").any() else "inference")
    world = opt.world_size or trace.meta.get("world_size") or 1
    model, model_flops_per_step, model_flops_no_attn = model_section(opt, ops, steps, mode, world, warnings)

    steps = step_metrics(steps, model_flops_per_step, model_flops_no_attn, peak)
    if steps.filter(pl.col("last")).height and kernels.height:
        warnings.append("the last step ends at its last device activity (no next step to bound it)")
    outside = outside_section(kernels, ops)
    if outside:
        warnings.append(
            f"{outside['kernels']} device activities ({outside['device_us']:.1f} us) were launched outside every step; reported under outside_steps"
        )
    activities = kernels if device_trace else cpu_activities(ops)
    part = tl.partition(activities, steps.select("step", "name", "ts", "dur", "start", "window"))
    gaps = tl.idle_gaps(activities, trace.launches, ops, steps) if device_trace else None
    return_freed_memory()
    stats = tl.launch_stats(kernels, steps) if device_trace else None
    steps = attach_time(steps, part, peak)
    if stats is not None:
        steps = steps.join(
            stats.select("step", pl.col("kernels").alias("launch_kernels"), pl.col("median_dur").alias("launch_median_kernel_us"),
                         pl.col("median_launch_delay").alias("launch_median_delay_us")),
            on="step", how="left",
        )
    roof = roofline.roofline(kernels, ops, hw.lookup(hardware["name"]) if hardware and hardware.get("source") != "--peak-tflops" else None, precision) if device_trace else None
    totals = totals_section(steps, ops, kernels, opt, peak)
    if roof is not None:
        totals["overlay_us"]["memory_bound"] = memory_bound_us(kernels, roof, steps, opt)
    totals["idle_us_by_reason"] = idle_by_reason(gaps, opt)
    warnings += metrics.suspect(totals.get("mfu"), totals.get("hfu"))
    warnings += unknown_flops_warnings(ops, totals)
    if hardware:
        hardware["precision"] = precision
        totals["mfu_by_precision"] = other_peaks(hardware, totals, precision, opt)
    if model is not None:
        model.update(band_of(totals.get("mfu"), mode, model))
    ranks = [rank_row(trace, totals)]
    top = roofline.top_recoverable(roof) if roof is not None else None
    kernel_rollup = rollup.by_kernel(kernels) if device_trace else None
    module_rollup = rollup.by_module(ops, kernels) if device_trace else None
    gemm_shapes = rollup.by_gemm_shape(ops, kernels, hardware) if device_trace else None
    steps = steps.filter(~pl.col("step").is_in(trace.meta.get("cut_steps") or []))
    a = Analysis(trace, ops, kernels, steps, hardware, model, totals, outside, warnings, ranks, part, gaps, stats, roof, top,
                 kernel_rollup, module_rollup, gemm_shapes)
    a.advice = advice.advise(a, exclude_steps=opt.exclude_steps)
    a.step_stats = stepstats.step_stats(steps)
    return a


def leave_out_cut_steps(trace: Trace, host: pl.DataFrame, opt: ModelOptions) -> tuple[ModelOptions, list[str]]:
    """In a cut file, steps whose numbers could differ from the whole file's are left out of the report."""
    if not trace.meta.get("truncated"):
        return opt, []
    device_trace = trace.kernels.height or trace.launches.height or trace.meta.get("device_properties")
    if not device_trace:
        return opt, ["the file was cut: steps of a CPU-only trace cannot be checked for completeness"]
    if not trace.kernels.height:
        # a device trace cut before any device activity was written: no step can be checked
        cut, unbounded = {int(st): 0 for st in host["step"].to_list()}, set()
    else:
        cut, unbounded = incomplete_steps(host, trace.launches, trace.kernels)
    notes = [f"step {st} is incomplete in the cut file ({n or 'all'} launches lost their device activity): left out"
             for st, n in sorted(cut.items())]
    notes += [f"step {st} may end differently in the whole file (the cut may have taken what bounds it): left out"
              for st in sorted(unbounded)]
    dropped = set(cut) | unbounded
    trace.meta["cut_steps"] = sorted(dropped)
    return replace(opt, exclude_steps=tuple(sorted(set(opt.exclude_steps) | dropped))), notes


def memory_bound_us(kernels: pl.DataFrame, roof: pl.DataFrame, steps: pl.DataFrame, opt: ModelOptions) -> float:
    """Device time during which a memory-bound kernel ran (union over streams, within the analysed steps)."""
    bound = kernels.filter(roofline.memory_bound_overlay(roof))
    if bound.height == 0:
        return 0.0
    mb = tl.partition(bound, steps.select("step", "name", "ts", "dur", "start", "window"))
    mb = mb.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    return float((mb["window"] - mb["idle"]).sum())


def unknown_flops_warnings(ops: pl.DataFrame, totals: dict[str, Any]) -> list[str]:
    n = totals["matmul_flops_unknown_count"]
    if not n:
        return []
    if ops.filter(pl.col("matmul") & pl.col("dims").is_null()).height:
        return [f"{n} matmul ops have no recorded shapes: their FLOPs are unknown (re-profile with record_shapes=True)"]
    return [f"{n} matmul ops have FLOPs that cannot be derived from their inputs"]


def idle_by_reason(gaps: pl.DataFrame | None, opt: ModelOptions) -> dict[str, float] | None:
    """Why the device sat idle: each gap is explained by the first rule that decides it."""
    if gaps is None:
        return None
    use = gaps.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    got = dict(use.group_by("reason").agg(pl.col("dur").sum()).iter_rows())
    return {r: float(got.get(r, 0.0)) for r in GAP_REASONS}


def cpu_activities(ops: pl.DataFrame) -> pl.DataFrame:
    """On a CPU trace the ops are the compute: leaf matmuls, and every other top-level op."""
    parent = ops["parent"].to_numpy()
    is_op = (ops["cat"] == "cpu_op").to_numpy()
    top = is_op & ((parent < 0) | ~is_op[np.maximum(parent, 0)])
    mm = ops["matmul"].to_numpy() & ops["ran"].to_numpy()
    acts = ops.filter(pl.Series(mm | top)).with_columns(
        cls=pl.when(pl.col("matmul") & pl.col("ran")).then(pl.lit("matmul")).otherwise(pl.lit("other_compute")),
        device=pl.lit(None, pl.Int64),
        stream=pl.col("tid"),
        flops=pl.when(pl.col("matmul") & pl.col("ran")).then(pl.col("flops").cast(pl.Float64)),
    )
    return acts.select("name", "device", "stream", "ts", "dur", "cls", "phase", "step", "flops")


def primary_device(part: pl.DataFrame) -> pl.DataFrame:
    """One partition row per step: the device with the most busy time (a rank drives one device)."""
    busy = pl.col("window") - pl.col("idle")
    dev = part.group_by("device").agg(busy.sum().alias("_busy")).sort("_busy", descending=True, nulls_last=True)
    if dev.height == 0:
        return part
    first = dev["device"][0]
    return part.filter(pl.col("device").is_null() if first is None else pl.col("device") == first)


def attach_time(steps: pl.DataFrame, part: pl.DataFrame, peak: float | None) -> pl.DataFrame:
    """Each step's time partition, overlays and loss budget (of its primary device)."""
    rows = primary_device(part).select(pl.exclude("start", "window", "device")).rename(
        {c: f"time_{c}" for c in (*PARTITION, *OVERLAYS)}
    )
    steps = steps.join(rows, on="step", how="left")
    budgets = []
    for r in steps.iter_rows(named=True):
        time = {"window": r["window"], **{c: r.get(f"time_{c}") or 0.0 for c in (*PARTITION, *OVERLAYS)}}
        budgets.append(bd.loss_budget(bd.inputs_from_row(r, time, peak)))
    return steps.with_columns(loss_budget=pl.Series(budgets, dtype=pl.Object))


def other_peaks(hardware: dict, totals: dict, precision: str, opt: ModelOptions) -> dict[str, float] | None:
    """An FP8 run is shown against the bf16 peak too: the same clock, a different ceiling."""
    if precision != "fp8" or opt.peak_tflops or totals.get("mfu") is None:
        return None
    h = hw.lookup(hardware["name"])
    out = {}
    for p in ("fp8", "bf16"):
        peak = h.peak(p) if h else None
        if peak:
            out[p] = totals["mfu"] * hardware["peak_flops"] / peak
    return out


def band_of(mfu: float | None, mode: str, model: dict) -> dict[str, Any]:
    if mfu is None or mode != "training":
        return {"band": None, "band_caveat": mf.BAND_CAVEAT}
    return {"band": mf.verdict_band(mfu), "band_caveat": mf.BAND_CAVEAT}


def rank_row(trace: Trace, totals: dict) -> dict[str, Any]:
    return {
        "rank": trace.meta.get("rank"),
        "wall_us": totals["wall_us"],
        "device_mfu": totals.get("mfu"),
        "hfu": totals.get("hfu"),
    }


def classify_kernels(kernels: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Matmul-class kernels: compute kernels launched under an executed leaf matmul op.

    The op's FLOPs are shared among its compute kernels in proportion to duration.
    """
    if kernels.height == 0:
        return kernels.with_columns(
            cls=pl.lit(None, pl.Utf8), matmul_row=pl.lit(None, pl.Int64), flops=pl.lit(None, pl.Float64)
        )
    parent = ops["parent"].to_numpy()
    leaf = ops["matmul"].to_numpy()
    near = nearest(parent, leaf)
    op_row = kernels["op_row"].fill_null(-1).to_numpy()
    mm_row = np.where(op_row >= 0, near[np.maximum(op_row, 0)], -1)
    kernels = kernels.with_columns(matmul_row=pl.Series(mm_row, dtype=pl.Int64)).with_columns(
        matmul_row=pl.when(pl.col("matmul_row") >= 0).then(pl.col("matmul_row"))
    )
    is_mm = (pl.col("kind") == "compute") & pl.col("matmul_row").is_not_null()
    kernels = kernels.with_columns(
        cls=pl.when(is_mm).then(pl.lit("matmul")).when(pl.col("kind") == "compute").then(pl.lit("other_compute")).otherwise(pl.col("kind"))
    )
    # Only the op's matmul kernels share its FLOPs (a memset it launched does none).
    mm_dur = pl.when(pl.col("cls") == "matmul").then(pl.col("dur")).otherwise(0.0)
    share = pl.col("dur") / mm_dur.sum().over("matmul_row")
    op_flops = by_row(ops, kernels["matmul_row"], "flops").to_series()
    return kernels.with_columns(
        flops=pl.when(pl.col("cls") == "matmul").then(op_flops * share.fill_nan(1.0))
    )


def tf32_share(kernels: pl.DataFrame) -> float:
    """Share of matmul kernel time spent in TF32 kernels (fp32 tensors on tensor cores)."""
    mm = kernels.filter(pl.col("cls") == "matmul")
    total = mm["dur"].sum()
    return float(mm.filter(pl.col("name").str.contains(_TF32_RE.pattern))["dur"].sum() / total) if total else 0.0


def choose_hardware(trace: Trace, ops: pl.DataFrame, kernels: pl.DataFrame, opt: ModelOptions, warnings: list[str]):
    precision = opt.precision
    dtype = metrics.dominant_dtype(ops)
    guessed = precision is None and dtype is None
    if precision is None:
        precision = dtype or "bf16"
        if precision == "fp32" and tf32_share(kernels) > 0.5:
            precision = "tf32"
    if opt.peak_tflops:
        h = hw.custom(opt.peak_tflops, precision)
        return _hw_dict(h, precision, "--peak-tflops"), opt.peak_tflops * 1e12, precision
    h, why = None, ""
    if opt.hardware:
        h = hw.lookup(opt.hardware)
        if h is None:
            warnings.append(f"unknown hardware '{opt.hardware}': give --peak-tflops (known: {', '.join(sorted(hw.HARDWARE))})")
    else:
        props = trace.meta.get("device_properties") or []
        dev_ids = kernels["device"].drop_nulls().unique().to_list() if kernels.height else []
        chosen = next((p for p in props if p.get("id") in dev_ids), props[0] if props else None)
        if chosen:
            h, why = hw.detect(chosen)
        elif trace.meta.get("xla_device"):
            h, why = hw.detect_xla(trace.meta["xla_device"])
        if h is None:
            what = why or ("no device in the trace (a CPU trace)" if not kernels.height else "no deviceProperties in the trace")
            warnings.append(f"hardware unknown: {what}; give --hardware NAME or --peak-tflops N to get MFU and HFU")
    if h is None:
        return None, None, precision
    if guessed:
        precision = next((p for p in ("bf16", "fp16", "fp32") if h.peak(p)), precision)
        warnings.append(f"matmul dtypes unknown (no Input type in the trace): assumed the {precision} peak; give --precision")
    peak = h.peak(precision)
    if peak is None:
        warnings.append(f"{h.name} has no dense {precision} peak in the table; give --precision or --peak-tflops")
    return _hw_dict(h, precision, h.source), peak, precision


def _hw_dict(h, precision: str, source: str) -> dict[str, Any]:
    return {
        "name": h.name,
        "precision": precision,
        "sparse": False,
        "peak_flops": h.peak(precision),
        "devices": 1,
        "source": source,
    }


def infer_tokens(ops: pl.DataFrame) -> int | None:
    """Tokens per step from the input embedding's index shape (the largest-table lookup)."""
    emb = ops.filter((pl.col("name") == "aten::embedding") & pl.col("dims").is_not_null() & (pl.col("phase") == "forward"))
    best: tuple[int, int] | None = None
    per_step: dict[int, int] = {}
    for dims, step in emb.select("dims", "step").iter_rows():
        d = orjson.loads(dims)
        if len(d) >= 2 and isinstance(d[0], list) and len(d[0]) == 2 and isinstance(d[1], list) and d[1]:
            vocab, tokens = d[0][0], int(np.prod(d[1]))
            if best is None or vocab > best[0]:
                best, per_step = (vocab, tokens), {step: tokens}
            elif vocab == best[0]:
                per_step[step] = per_step.get(step, 0) + tokens
    if not per_step:
        return None
    return max(per_step.values())


def model_section(opt: ModelOptions, ops, steps, mode, world, warnings):
    """Model FLOPs per step for this trace's device (its share of a job's global tokens)."""
    if opt.spec is not None:
        tokens = opt.tokens_per_step
        tokens_source = "flag"
        if tokens is None:
            inferred = infer_tokens(ops)
            if inferred is not None:
                tokens = inferred * world  # the trace shows one rank's batch
                tokens_source = "inferred from the input embedding's shape"
        if tokens is None:
            warnings.append("tokens per step unknown: give --tokens-per-step (global) to get MFU")
        m = mf.model_flops(opt.spec, mode, tokens)
        share = None if m.per_step is None else m.per_step / world
        share_na = None if m.per_step_no_attention is None else m.per_step_no_attention / world
        model = {
            "source": opt.spec.source,
            "mode": mode,
            "flops_per_token": m.per_token,
            "flops_per_token_no_attention": m.per_token_no_attention,
            "flops_per_token_causal": m.per_token_causal,
            "tokens_per_step": tokens,
            "tokens_source": tokens_source,
            "flops_per_step": m.per_step,
            "flops_per_step_no_attention": m.per_step_no_attention,
            "flops_per_step_causal": m.per_step_causal,
            "flops_per_step_device": share,
            "params_matmul": opt.spec.params_matmul,
            "counted": dict(opt.spec.breakdown),
            "labels": dict(m.labels),
        }
        return model, pl.lit(share, pl.Float64), pl.lit(share_na, pl.Float64)
    # Trace-derived: forward + backward matmul FLOPs of model ops.
    known = pl.col("flops_forward") + pl.col("flops_backward")
    per = pl.when((known == 0) & (pl.col("flops_unknown_count") > 0)).then(None).otherwise(known)
    no_attn = per - pl.col("attention_model_flops")
    model = {
        "source": "trace",
        "mode": mode,
        "flops_per_step": None,
        "flops_per_step_no_attention": None,
        "note": "model FLOPs derived from the trace: forward + backward matmul FLOPs (no recompute, no optimizer); see flops_coverage",
    }
    return model, per.cast(pl.Float64), no_attn.cast(pl.Float64)


def step_metrics(steps: pl.DataFrame, model_flops, model_no_attn, peak: float | None) -> pl.DataFrame:
    executed = sum(pl.col(f"flops_{p}") for p in PHASES)
    secs = pl.col("window") * 1e-6
    peak_e = pl.lit(peak, pl.Float64)
    cols = [
        executed.alias("flops_executed"),
        model_flops.alias("model_flops"),
        (model_flops / (secs * peak_e)).alias("mfu"),
        (executed / (secs * peak_e)).alias("hfu"),
    ]
    if model_no_attn is not None:
        cols.append((model_no_attn / (secs * peak_e)).alias("mfu_no_attention"))
    else:
        cols.append(pl.lit(None, pl.Float64).alias("mfu_no_attention"))
    return steps.with_columns(cols)


def outside_section(kernels: pl.DataFrame, ops: pl.DataFrame) -> dict[str, Any] | None:
    out = kernels.filter(pl.col("step") == OUTSIDE)
    if out.height == 0:
        return None
    return {
        "device_us": float(out["dur"].sum()),
        "kernels": out.height,
        "flops": {p: int(out.filter(pl.col("phase") == p)["flops"].sum() or 0) for p in PHASES},
    }


def in_steps_unknown(ops: pl.DataFrame, opt: ModelOptions) -> int:
    sel = ops.filter(pl.col("matmul") & pl.col("ran") & (pl.col("step") >= 0) & ~pl.col("step").is_in(list(opt.exclude_steps)))
    return sel["flops"].null_count()


def totals_section(steps, ops, kernels, opt: ModelOptions, peak) -> dict[str, Any]:
    use = steps.filter(~pl.col("step").is_in(list(opt.exclude_steps)))
    flops = {p: int(use[f"flops_{p}"].sum()) for p in PHASES}
    flops["executed"] = sum(flops.values())
    counts = {p: int(use[f"count_{p}"].sum()) for p in PHASES}
    wall = float(use["window"].sum())
    model_total = use["model_flops"].sum() if use["model_flops"].null_count() < use.height else None
    no_attn = use["mfu_no_attention"]
    secs = wall * 1e-6
    nothing_known = flops["executed"] == 0 and int(in_steps_unknown(ops, opt)) > 0
    mfu = None if nothing_known and not opt.spec else metrics.utilization(model_total, secs, peak)
    hfu = None if nothing_known else metrics.utilization(flops["executed"], secs, peak)
    mfu_na = None
    if no_attn.null_count() < use.height:
        mfu_na = float((no_attn * use["window"]).sum() / wall) if wall else None
    # Coverage: share of matmul time whose FLOPs are known.
    in_steps = ops.filter(pl.col("matmul") & pl.col("ran") & ~pl.col("step").is_in(list(opt.exclude_steps)) & (pl.col("step") >= 0))
    if kernels.height:
        mk = kernels.filter((pl.col("cls") == "matmul") & (pl.col("step") >= 0) & ~pl.col("step").is_in(list(opt.exclude_steps)))
        cov = metrics.coverage(mk["dur"].to_numpy(), mk["flops"].is_not_null().to_numpy())
    else:
        cov = metrics.coverage(in_steps["dur"].to_numpy(), in_steps["flops"].is_not_null().to_numpy())
    time_us = {c: float(use[f"time_{c}"].sum()) for c in PARTITION}
    overlay_us = {c: float(use[f"time_{c}"].sum()) for c in OVERLAYS}
    inputs = [
        bd.inputs_from_row(r, {"window": r["window"], **{c: r[f"time_{c}"] or 0.0 for c in (*PARTITION, *OVERLAYS)}}, peak)
        for r in use.iter_rows(named=True)
    ]
    total_inputs = bd.sum_inputs(inputs)
    return {
        "wall_us": wall,
        "time_us": time_us,
        "overlay_us": overlay_us,
        "loss_budget": bd.loss_budget(total_inputs) if total_inputs else None,
        "matmul_count": counts,
        "flops": flops,
        "flops_coverage": cov,
        "matmul_flops_unknown_count": int(in_steps["flops"].null_count()),
        "mfu": mfu,
        "mfu_no_attention": mfu_na,
        "hfu": hfu,
    }
