"""The pipeline, in order: clean → link → phases → count → steps → peak and model FLOPs → timeline → totals → views.

One `Analysis` out of one `Trace`, built once. The trace is cleaned first and
the conservation checks run last, both called here, explicitly; a check that
fires inside a stage (a time partition, a loss budget) stops the run the same
way: `InternalError`, exit 4, never a wrong number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import polars as pl

from traceflops.core import hardware as hw
from traceflops.core import sections
from traceflops.core.beside import beside
from traceflops.core.errors import ConservationError, FormatError, InternalError
from traceflops.core.memory import return_freed_memory
from traceflops.core.results import Analysis, ModelOptions
from traceflops.core.sections import PathSummary, StepCount, Totals
from traceflops.core.trace import Coded, Trace, coded_once
from traceflops.metrics import budget, steptime
from traceflops.metrics import model_section as msec
from traceflops.metrics import peak as mpeak
from traceflops.metrics import utilization as util
from traceflops.metrics.checks import BUG, check_analysis
from traceflops.metrics.stepstats import step_stats
from traceflops.stages import roofline
from traceflops.stages import timeline as tl
from traceflops.stages.clean import clean
from traceflops.stages.comm_exposure import with_comm_exposure
from traceflops.stages.count import (
    TOTAL_FLOPS_MAX,
    classify_kernels,
    count_ops,
    has_formula,
    total_flops,
)
from traceflops.stages.cpu_activities import cpu_activities, device_not_captured
from traceflops.stages.critical_path import critical_path, with_path_columns
from traceflops.stages.idle import idle_gaps, launch_stats
from traceflops.stages.link import link
from traceflops.stages.phases import tag_kernels, tag_ops
from traceflops.stages.replays import (
    attribute_replays,
    captured_launches,
    merge_captures,
    replays_graphs,
)
from traceflops.stages.steps import (
    assign,
    by_execution,
    device_windows,
    excluded_steps,
    host_steps,
    kernel_steps,
    leave_out_cut_steps,
    leave_out_unbounded_last,
    step_count,
    step_warnings,
    window_work,
)
from traceflops.stages.sweep import sweep
from traceflops.views import advice, counterfactual, gemm_shapes, rollup
from traceflops.views import collectives as coll_view
from traceflops.views import path_summary as path_view


def analyze_trace(
    trace: Trace, opt: ModelOptions, on_stage=None, captures: Sequence[Trace] = (), views: bool = True
) -> Analysis:
    """`on_stage(name)` is called as each group of stages starts (a progress display), if given. `captures` are traces
    that recorded the CUDA/HIP graphs this one replays (the trace's own captures are always read). Without `views`,
    the tables, steps and totals only, without what is built from them (rollups, collectives, the critical path's
    summary, counterfactuals, advice): what `annotate` writes back needs none of them (a fifth of the analysis)."""
    stage = on_stage or (lambda name: None)
    with coded_once():  # each name column's distinct values found once, however many stages read them
        stage("clean")
        trace = clean(trace)
        if opt.group_roles:  # what the user said each group is for: the collectives' view reads it with its groups
            trace = replace(trace, meta={**trace.meta, "group_roles": dict(opt.group_roles)})
        try:
            a = _analyze(trace, opt, stage, captures, views)
        except ConservationError as e:
            raise InternalError(trace.meta.get("path"), f"{e.what} conservation check failed: {e}", BUG) from e
    check_analysis(a)
    return a


def _analyze(trace: Trace, opt: ModelOptions, stage, captures: Sequence[Trace] = (), views: bool = True) -> Analysis:
    # link, phases, count
    stage("link, phases, FLOPs")
    # The launches' names coded once: graph launches, then sync calls (the critical path, the idle gaps, the advice)
    # are looked for in them.
    Coded.of(trace.launches["name"], keep=True)
    linked = link(trace)
    if replays_graphs(trace):
        captured = merge_captures([captured_launches(c) for c in (trace, *captures)])
        linked = attribute_replays(linked, captured, trace.warnings)
    ops = tag_ops(linked, has_formula(linked.ops["name"], linked.ops["matmul_hint"]), trace.steps)
    kernels = tag_kernels(linked, ops)
    device_trace = kernels.height > 0
    not_captured = (
        None if device_trace else device_not_captured(trace)
    )  # a device job's trace without its device activity
    ops = count_ops(ops, kernels, device_trace)
    total = total_flops(ops)
    if total > TOTAL_FLOPS_MAX:
        raise FormatError(
            trace.meta.get("path"),
            f"its shapes imply {total:.3g} FLOPs in all, more than a "
            f"profile of a real run holds ({TOTAL_FLOPS_MAX:.3g})",
            "check that the trace was not edited or corrupted",
        )
    return_freed_memory()  # what linking and tagging freed, before the timeline grows

    # steps
    stage("steps")
    host, step_source = host_steps(trace)
    asked = excluded_steps(host, opt)
    opt, warnings_cut = leave_out_cut_steps(trace, host, opt)
    ops = ops.with_columns(step=by_execution(ops, assign(ops, "ts", host), host))
    kernels = classify_kernels(kernels.with_columns(step=kernel_steps(kernels, ops, host)), ops)
    steps = device_windows(host, window_work(kernels, ops)).sort("ts")
    opt, warnings_last = leave_out_unbounded_last(steps, opt)
    warnings = (
        warnings_last
        + ([not_captured] if not_captured else [])
        + step_warnings(trace, steps, step_source, warnings_cut)
        + asked
    )

    # peak, model FLOPs, per-step utilization
    hardware, peak, precision = mpeak.choose_hardware(trace, ops, kernels, opt, warnings)
    steps = util.with_phase_flops(steps, ops, kernels)
    mode = opt.mode or ("training" if (ops["phase"] == "backward").any() else "inference")
    world = opt.world_size or trace.meta.get("world_size") or 1
    model, model_per_step, model_no_attn = msec.model_section(opt, ops, steps, mode, world, warnings)
    activities = kernels if device_trace or not_captured else cpu_activities(ops)  # host ops are no device's time
    # The activities cut into segments once: the partition, the collectives' exposure and the idle gaps all read
    # this sweep (three sweeps were a tenth of the analysis).
    swept = sweep(activities, steps)
    part = tl.partition(activities, steps, swept)
    if device_trace or not_captured:
        kernels = activities = with_comm_exposure(kernels, activities, steps, by_op=False, swept=swept)
    else:
        ops = with_comm_exposure(ops, activities, steps, by_op=True, swept=swept)
    devices = tl.program_devices(part, activities)  # a JAX process's chips together: MFU against all their peaks
    peak_all = peak * len(devices) if peak else peak

    # timeline: every stage that reads the partition and the windows, before the metrics read their frames
    stage("timeline, critical path, roofline")
    # The critical path worked out beside the idle gaps and the roofline: neither reads the other's result, and the
    # ops, kernels and steps it reads are final here.
    path_later = beside(critical_path, kernels, linked.launches, ops, steps) if device_trace else None
    gaps = idle_gaps(activities, trace.launches, ops, steps, swept) if device_trace else None
    del swept
    return_freed_memory()
    stats = launch_stats(kernels, steps) if device_trace else None
    known_hw = hw.lookup(hardware.name) if hardware and hardware.source != "--peak-tflops" else None
    roof = roofline.roofline(kernels, ops, known_hw, precision) if device_trace else None
    bound = None if roof is None else roofline.memory_bound_partition(kernels, roof, steps)
    part_on = tl.on_devices(part, devices)  # the metrics read the program's devices' rows only
    gaps_on = None if gaps is None else tl.on_devices(gaps, devices)
    bound_on = None if bound is None else tl.on_devices(bound, devices)
    path = None if path_later is None else path_later.result()

    # per-step metrics, then the totals
    only_device = util.device_only(ops, kernels)  # read thrice below: worked out once
    steps = util.step_metrics(steps, model_per_step, model_no_attn, peak_all, device_only=only_device)
    outside = util.outside_section(kernels, ops, activities)
    warnings += util.window_warnings(steps, kernels, outside, last_counted=not warnings_last)
    steps = with_path_columns(steps, path)
    steps = steptime.attach_launch_stats(steptime.attach_time(steps, part_on, peak_all, len(devices)), stats)
    base = util.totals_section(steps, ops, kernels, opt, peak_all, only_device)
    if bound_on is not None:
        base["overlay_us"] = {
            **base["overlay_us"],
            "memory_bound": steptime.memory_bound_us(bound_on, opt, len(devices)),
        }
    totals = Totals(
        **base,
        step_count=StepCount(**step_count(steps, opt)),
        expert_flops=util.expert_flops(ops, opt),
        idle_us_by_reason=steptime.idle_by_reason(gaps_on, opt, len(devices)),
        loss_budget_unknown=None,
    )
    if not_captured:
        steps, totals = steptime.without_device_time(steps, totals)
    if trace.meta.get("truncated"):
        steps, totals, cut = util.cut_without_flops(steps, totals)
        warnings += cut
    warnings += util.suspect(totals.mfu, totals.hfu, msec.frozen_parts(model))
    warnings += util.unknown_flops_warnings(ops, kernels, totals, only_device)
    warnings += util.hook_warnings(ops)
    warnings += util.unnamed_xla_warnings(ops)
    if hardware:
        hardware = sections.replace(hardware, precision=precision, devices=len(devices))
        totals = sections.replace(totals, mfu_by_precision=mpeak.other_peaks(hardware, totals, precision, opt))
    totals = sections.replace(totals, loss_budget_unknown=budget.unknown_terms(totals.loss_budget, hardware))
    if model is not None:
        model = msec.with_band(model, totals, hardware)
    steps = steps.filter(~pl.col("step").is_in(trace.meta.get("cut_steps") or []))

    tables = Analysis(
        trace=trace,
        ops=ops,
        kernels=kernels,
        steps=steps,
        hardware=hardware,
        model=model,
        totals=totals,
        outside_steps=outside,
        warnings=warnings,
        partition=part.clear() if not_captured else part,
        idle_gaps=gaps,
        launch_stats=stats,
        roofline=roof,
        step_stats=step_stats(steps),
        critical_path=path,
    )
    if not views:
        return tables

    # views
    stage("advice")
    a = replace(
        tables,
        top_kernels=roofline.top_recoverable(roof) if roof is not None else None,
        by_kernel=rollup.by_kernel(kernels) if device_trace else None,
        by_module=rollup.by_module(ops, kernels) if device_trace else None,
        by_gemm_shape=gemm_shapes.by_gemm_shape(ops, kernels, hardware) if device_trace else None,
    )
    coll = coll_view.collectives(a, with_issuer=True)
    a = replace(a, collectives=coll.drop("issuer", strict=False))
    if not_captured:  # no device time to follow or to advise on
        return replace(a, path_summary=PathSummary(available=False, why=path_view.NOT_CAPTURED))
    a = replace(
        a,
        path_summary=path_view.path_summary(a, exclude_steps=opt.exclude_steps),  # advice reads them
        communication=coll_view.communication(a, coll, opt.exclude_steps),
    )
    cf = counterfactual.of_analysis(a, exclude_steps=opt.exclude_steps)  # once, for the advice and what_if
    return replace(
        a,
        advice=advice.advise(a, exclude_steps=opt.exclude_steps, bounds=cf),  # each bounded as its term's
        what_if=[] if cf is None else cf.what_if(),
    )
