"""Advice a user can act on, from what the trace shows, ranked by the share of peak × step time it would give back.

`advise(a)` reads an `Analysis` and returns a list of items, largest first:

    {"kind", "title", "recoverable", "share", "unit", "term", "recoverable_us", "mfu_after",
     "evidence": [str, ...], "remedies": [str, ...], "data": {...}}

and, on a loss-budget entry, also "findings" (the rules' items folded into it),
"cause_known" and "record" (what to record next time when the trace cannot
tell the cause; those lines are also the first remedies).

The headline `recoverable` (= `share`) is a fraction of peak × step time (the
summed windows of the steps counted, on the devices the trace drives), the
unit of the loss budget (`unit` says it in words). Every time term of the
budget is its time over the window, so for the rules below the same number is
the share of step time the item's waste costs; `mfu_after` is the MFU if that
share went away with the FLOPs unchanged (mfu / (1 - recoverable)), so
ranking by `recoverable` is ranking by MFU recovered. Items can overlap (an
unfused attention's softmax is memory-bound too): their recoverable values
are not additive.

Loss-budget entries: every budget term (non_matmul, idle, matmul_below_peak,
communication_exposed, recompute, memcpy_exposed, matmul_flops_unknown,
extra_executed) of at least BUDGET_MIN_SHARE (5%) is an entry whose headline
is the term's value, exactly (the budget is added up here as the totals add
theirs), with the rules' items that explain part of it folded in (`TERM_OF`):
non_matmul names the kernels (on a CPU trace the aten ops) that take it, the
fusion candidates (runs of short kernels back to back), the memory-bound and
unfused-attention items; idle splits by gap reason with the host-bound, sync
and data-loader items; matmul_below_peak names GEMM shapes (convolutions as
implicit GEMMs), dtypes, wave quantization and small tiles, with the fp32 item
and, for an fp32 / TF32 run, its MFU against the tensor-core peak; where
convolutions are at least CONV_DOMINATES (half) of the matmul time, its
remedies and the fusion remedies speak of convolutions (autocast,
channels_last, cudnn.benchmark, channel counts, BatchNorm/ReLU fusion); communication and recompute
are their rules' items headed by the budget's number. Rules' items of smaller
terms stand alone from MIN_SHARE. Remedies and what to record are worded for
PyTorch (Kineto) or JAX (XLA profiles).

Rules, each raising an item only when its evidence is in the trace and worth
at least MIN_SHARE (1%) of the step time:

  host_bound      idle gaps the host caused (reason host_bound: the next kernel
                  was launched after the gap began) plus bubbles between queued
                  kernels (launch_gap); recoverable = their time.
  memory_bound    kernels under the roofline ridge (roofline bound 'memory'):
                  their time above the HBM floor (bytes / bandwidth), capped at
                  the time they occupy the device.
  attention       attention computed as matmul → softmax → matmul (shapes
                  checked: the first matmul's output is the softmax's input,
                  which the second matmul takes), by hand or by SDPA's math
                  fallback; recoverable = the kernels of that chain that are
                  not matmuls (scale, mask, softmax, dropout, softmax
                  backward): what a fused kernel folds in. A lower bound.
  fp32_matmul     matmul-class ops with fp32 inputs on fp32 (non-TF32) kernels,
                  on a device with a faster TF32 (else the faster of bf16 and
                  fp16: fp16 on Volta / Turing) tensor peak, when
                  the analysis precision is not TF32 already; recoverable =
                  their time × (1 - fp32 peak / TF32 peak): the same fraction
                  of a faster peak. Mixed precision (autocast) is its first
                  remedy, TF32 the second.
  communication   the partition's communication_exposed.
  recompute       headed by the budget's recompute term (the recomputed
                  FLOPs at peak); the recompute overlay (time with a recompute
                  kernel running) is evidence, as time, and the headline when
                  no peak is known (then `unit` says so).
  input_pipeline  idle gaps with reason input_pipeline (a DataLoader op over
                  the gap).
  sync            idle gaps with reason sync (a synchronizing runtime call over
                  the gap).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core import fmt
from traceflops.core import hardware as hw
from traceflops.core.dtypes import COLLECTIVE_ITEMSIZE, collective_dtype_key
from traceflops.core.results import Analysis
from traceflops.core.trace import name_matches
from traceflops.core.vocab import (
    GAP_REASONS,
    OVERLAYS,
    PARTITION,
    dimension_name,
    tells_dimensions_apart,
)
from traceflops.metrics import budget as bd
from traceflops.metrics.peak import TF32_RE
from traceflops.stages import timeline as tl
from traceflops.stages.count import LAYOUT_KERNEL_RE
from traceflops.stages.link import nearest
from traceflops.stages.steps import counted_steps
from traceflops.views.rollup import CONV_OPS, GEMM_TIME_MATTERS, first_tensor_dtype

MIN_SHARE = 0.01
CONV_DOMINATES = 0.5  # from this share of matmul time in convolutions, the matmul and fusion remedies speak of convolutions
BUDGET_MIN_SHARE = 0.05  # a loss-budget term from this share of peak × step time gets an entry of its own
UNIT = "of step time at peak"  # the unit of every headline: a share of peak × step time, as the loss budget's terms
SHORT_KERNEL_US = 10.0  # a kernel shorter than this is mostly launch and ramp-up
TOP = 5

SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
SOFTMAX_BWD_OPS = frozenset({"aten::_softmax_backward_data"})
ATTN_MATMULS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm"})
SDPA_MATH = frozenset({"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_attention_math_for_mps"})
FUSED_ATTENTION_RE = r"flash_attention|efficient_attention|cudnn_attention|fused_attention_overrideable"

# Collective dtypes as the profiler names them -> bytes per element.
# ---------------------------------------------------------------- context


@dataclass
class _Ctx:
    a: Analysis
    steps: pl.DataFrame  # the steps counted (positive window, not excluded)
    ids: list[int]
    window: float  # µs, summed windows
    device: Any  # the device the partition's time terms are of (None: no device)
    kernels: pl.DataFrame  # kernels of those steps on that device, roofline columns attached
    gaps: pl.DataFrame | None  # idle gaps of those steps on that device
    time: dict[str, float]  # partition and overlays, µs
    mfu: float | None
    budget: dict[str, float | None] | None = None  # the loss budget of these steps (as the report's totals)
    conv: float | None = None  # share of matmul time in convolutions (`_conv_share`), once computed

    def share(self, us: float) -> float:
        return float(us) / self.window if self.window else 0.0


def _context(a: Analysis, exclude_steps) -> _Ctx | None:
    steps = counted_steps(a.steps, exclude_steps)
    window = float(steps["window"].sum()) if steps.height else 0.0
    if window <= 0:
        return None
    ids = steps["step"].to_list()
    device = tl.program_devices(a.partition.filter(pl.col("step").is_in(ids)))[0] if a.partition is not None else None
    k = a.kernels
    if a.roofline is not None and a.roofline.height == k.height:
        k = k.with_columns(a.roofline.select("bound", "recoverable_us", "achieved_bw_frac", "roof_bytes"))
    k = tl.on_devices(k.filter(pl.col("step").is_in(ids)), [device]) if k.height else k
    gaps = tl.on_devices(a.idle_gaps.filter(pl.col("step").is_in(ids)), [device]) if a.idle_gaps is not None else None
    time = {c: float(steps[f"time_{c}"].fill_null(0.0).sum()) if f"time_{c}" in steps.columns else 0.0
            for c in (*PARTITION, *OVERLAYS)}
    peak = (a.hardware or {}).get("peak_flops")
    peak = peak * ((a.hardware or {}).get("devices") or 1) if peak else peak  # every device that ran the program
    mfu = None
    if peak and steps["model_flops"].null_count() == 0:
        mfu = float(steps["model_flops"].sum()) / (window * 1e-6 * peak)
    # the loss budget of these steps by the totals' own sum, so every term is the report's number
    return _Ctx(a, steps, ids, window, device, k, gaps, time, mfu, bd.steps_budget(steps, peak))


# What to try in a JAX program (an XLA profile), where the PyTorch remedies name the wrong tools.
JAX_REMEDIES = {
    "host_bound": [
        "Put the whole step (model, loss, jax.grad and the optax update) under one jax.jit: one program dispatch per step",
        ("Keep the host ahead: no jax.device_get / float(x) / printing arrays inside the loop, and prefetch the next "
        "batch to the device (jax.device_put) while this step runs"),
        "A larger batch per step: the same dispatch, more work",
    ],
    "memory_bound": [
        ("Keep the step in one jit so XLA fuses the elementwise ops; host callbacks (jax.debug.print, pure_callback) and "
        "jit boundaries split fusions: check the optimized HLO (XLA_FLAGS=--xla_dump_to=DIR) for unfused ops"),
        "Apply the optax update inside the same jit as the gradient, so its elementwise chain fuses",
    ],
    "fp32_matmul": [
        ("Compute in bfloat16: flax modules with dtype=jnp.bfloat16 (param_dtype float32), or cast activations; "
        "jax.default_matmul_precision('bfloat16') (or 'tensorfloat32' on GPUs) for matmuls left in float32"),
    ],
    "communication": [
        ("Let XLA overlap collectives with compute: shard with jax.sharding (NamedSharding, PartitionSpec) inside one jit; "
        "on GPUs XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"),
        ("Move less: shard parameters and optimizer state (FSDP-style PartitionSpecs), accumulate gradients over "
        "micro-batches before reducing them"),
    ],
    "recompute": [
        ("Rematerialize selectively: jax.checkpoint(policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) "
        "(or checkpoint_dots, or save_only_these_names with jax.ad_checkpoint.checkpoint_name) saves the matmul "
        "outputs and recomputes only cheap ops; flax: nn.remat(Block, policy=...)"),
        "Remat fewer blocks (every other layer) where memory allows",
    ],
    "sync": [
        ("Drop host reads inside the step (float(loss), jax.device_get, printing arrays): log every N steps; "
        "block_until_ready only where you time"),
    ],
}


def _item(ctx: _Ctx, kind: str, title: str, recoverable_us: float, evidence: list[str], remedies: list[str],
          data: dict[str, Any] | None = None, share: float | None = None, unit: str = UNIT) -> dict[str, Any]:
    """One item; `share` (default: recoverable_us over the window) is its headline, taken as given so that a
    budget term's value is printed exactly."""
    if _jax(ctx) and kind in JAX_REMEDIES:
        remedies = JAX_REMEDIES[kind]
    rec = ctx.share(recoverable_us) if share is None else float(share)
    after = ctx.mfu / (1.0 - rec) if ctx.mfu is not None and rec < 1.0 else None
    return {
        "kind": kind,
        "title": title,
        "recoverable": rec,
        "share": rec,
        "unit": unit,
        "term": TERM_OF.get(kind, kind),
        "recoverable_us": float(recoverable_us),
        "mfu_after": after,
        "evidence": evidence,
        "remedies": remedies,
        "data": data or {},
    }


def _jax(ctx: _Ctx) -> bool:
    """An XLA profile (JAX): remedies and what to record name JAX's tools, never PyTorch's."""
    return ctx.a.meta.get("format") == "xplane"


# ---------------------------------------------------------------- rules


def _host_bound(ctx: _Ctx) -> dict | None:
    if ctx.gaps is None:
        return None
    g = ctx.gaps.filter(pl.col("reason").is_in(["host_bound", "launch_gap"]))
    if g.height == 0:
        return None
    hb = g.filter(pl.col("reason") == "host_bound")
    lg = g.filter(pl.col("reason") == "launch_gap")
    total = float(g["dur"].sum())
    ev = []
    if hb.height:
        worst = hb.sort("dur", descending=True).row(0, named=True)
        ev.append(
            f"{hb.height} idle gaps where the device waited for the host to launch the next kernel: "
            f"{fmt.duration(hb['dur'].sum())} ({fmt.pct(ctx.share(hb['dur'].sum()), keep_small=False)} of step time), longest {fmt.duration(worst['dur'])} "
            f"before {fmt.short(worst['next_kernel'], 70, '?')}"
        )
    if lg.height:
        ev.append(
            f"{lg.height} bubbles between kernels already queued: {fmt.duration(lg['dur'].sum())} "
            f"({fmt.pct(ctx.share(lg['dur'].sum()), keep_small=False)}), median {fmt.duration(lg['dur'].median())}"
        )
    data = {"host_bound_us": float(hb["dur"].sum()), "launch_gap_us": float(lg["dur"].sum()),
            "host_bound_gaps": hb.height, "launch_gaps": lg.height}
    title = "The device waits for kernel launches (host-bound)"
    path = ctx.a.path_summary or {}
    if path.get("available"):
        # The verdict rests on the critical path: only host time on the chain that bounded the step can be recovered.
        on_host = float(path["us"]["host"] + path["us"]["launch"])
        share = ctx.share(on_host)
        top = next((t for t in path["top"] if t["kind"] in ("host", "launch")), None)
        ev.insert(0, f"critical path: the host and its launches bounded {fmt.pct(share, keep_small=False)} of the step"
                     + (f" (longest: {fmt.short(top['name'], 60)}, {fmt.duration(top['us'])})" if top else ""))
        data["critical_path_host_us"] = on_host
        total = min(total, on_host)
        title = ("The host bounds the step (critical path): the device waits for launches" if share >= 0.5 else
                 "Idle gaps wait for the host, but the device bounds the step (critical path)")
    many_short = False
    if "launch_kernels" in ctx.steps.columns and ctx.steps["launch_kernels"].null_count() < ctx.steps.height:
        per_step = float(ctx.steps["launch_kernels"].mean())
        med = ctx.steps["launch_median_kernel_us"].median()
        delay = ctx.steps["launch_median_delay_us"].median()
        many_short = med is not None and med < SHORT_KERNEL_US
        line = f"{per_step:.0f} kernels per step"
        if med is not None:
            line += f", median kernel {fmt.duration(med)}"
        if delay is not None:
            line += f", median launch-to-start delay {fmt.duration(delay)}"
        if many_short:
            line += ": many short kernels, each paying a launch"
        ev.append(line)
        data.update(kernels_per_step=per_step, median_kernel_us=med, median_launch_delay_us=delay)
    remedies = [
        ("Capture the step's steady part in a CUDA/HIP graph (torch.compile(mode=\"reduce-overhead\"), or "
        "torch.cuda.graph): one launch replaces one per kernel"),
        "torch.compile the model: it fuses small kernels, so fewer launches and less host work per step",
        "A larger batch per step: the same launches, each doing more work",
    ]
    if not many_short:
        remedies = [remedies[1], remedies[0], remedies[2]]
    return _item(ctx, "host_bound", title, total, ev, remedies, data)


def _memory_bound(ctx: _Ctx) -> dict | None:
    k = ctx.kernels
    if "bound" not in k.columns or k.height == 0:
        return None
    mb = k.filter((pl.col("bound") == "memory") & pl.col("recoverable_us").is_not_null())
    if mb.height == 0:
        return None
    rec = float(mb["recoverable_us"].sum())
    part = tl.partition(mb, ctx.steps.select("step", "name", "ts", "dur", "start", "window"))
    mine = tl.on_devices(part, [ctx.device])
    busy = float((mine["window"] - mine["idle"]).sum())
    rec = min(rec, busy)
    dur = float(mb["dur"].sum())
    short = mb.filter(pl.col("dur") < SHORT_KERNEL_US)
    ev = [
        (f"{mb.height} memory-bound kernels (below the roofline ridge) ran {fmt.duration(dur)}; "
        f"{fmt.duration(rec)} ({fmt.pct(ctx.share(rec), keep_small=False)} of step time) of it is above their HBM floor (bytes / bandwidth)"),
        (f"{short.height} of them are shorter than {SHORT_KERNEL_US:.0f} µs ({fmt.duration(short['dur'].sum())}, "
        f"{fmt.duration(short['recoverable_us'].sum())} above the floor)"),
    ]
    top = (
        mb.group_by("name")
        .agg(pl.len().alias("n"), pl.col("dur").sum().alias("t"), pl.col("dur").median().alias("med"),
             pl.col("recoverable_us").sum().alias("r"), pl.col("achieved_bw_frac").median().alias("bw"),
             pl.col("cls").first())
        .sort(["r", "name"], descending=[True, False])
        .head(TOP)
    )
    for r in top.iter_rows(named=True):
        bw = f", median {fmt.pct(r['bw'], keep_small=False)} of HBM bandwidth" if r["bw"] is not None else ""
        ev.append(f"{fmt.short(r['name'], 70, '?')} ({r['cls']}): {r['n']}×, {fmt.duration(r['t'])}, median {fmt.duration(r['med'])}{bw}, "
                  f"{fmt.duration(r['r'])} above the floor")
    remedies = [
        (CONV_FUSE if _conv_dominates(ctx) else
         ("Fuse chains of elementwise and normalization ops (torch.compile, or fused kernels such as fused "
          "LayerNorm/RMSNorm and fused activations): the intermediates never go through HBM")),
        "A larger batch (or sequence) per kernel: small kernels cannot reach memory bandwidth",
    ]
    opt = float(mb.filter(pl.col("phase") == "optimizer")["recoverable_us"].sum())
    if opt >= 0.2 * rec and opt > 0:
        remedies.insert(1, f"The optimizer's kernels are {fmt.pct(opt / rec, keep_small=False)} of it: use a fused or foreach optimizer "
                           "(e.g. torch.optim.AdamW(..., fused=True))")
    data = {"kernels": mb.height, "time_us": dur, "above_floor_us": float(mb["recoverable_us"].sum()),
            "busy_us": busy, "short_kernels": short.height, "optimizer_us": opt}
    return _item(ctx, "memory_bound", "Memory-bound kernels run below bandwidth: fuse them", rec, ev, remedies, data)


def _dims(text) -> list | None:
    if text is None:
        return None
    try:
        d = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return d if isinstance(d, list) else None


def _shape(d) -> tuple[int, ...] | None:
    if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in d):
        return None
    return tuple(d)


def _mm_out_last2(name: str, dims: list | None) -> tuple[int, int] | None:
    """The last two output dims of a bmm / matmul / baddbmm (both operands ≥ 2-D)."""
    if dims is None:
        return None
    ia, ib = (1, 2) if name == "aten::baddbmm" else (0, 1)
    if len(dims) <= ib:
        return None
    a, b = _shape(dims[ia]), _shape(dims[ib])
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    return a[-2], b[-1]


def _mm_in_last2(name: str, dims: list | None) -> tuple[int, int] | None:
    if dims is None:
        return None
    ia = 1 if name == "aten::baddbmm" else 0
    a = _shape(dims[ia]) if len(dims) > ia else None
    return (a[-2], a[-1]) if a is not None and len(a) >= 2 else None


def _attention(ctx: _Ctx) -> dict | None:
    ops = ctx.a.ops
    if ops.height == 0 or "dims" not in ops.columns:
        return None
    device = ctx.a.kernels.height > 0
    names = ops["name"]
    parent = ops["parent"].to_numpy()
    use = ops["ran"].to_numpy() & ops["step"].is_in(ctx.ids).to_numpy()
    is_soft = names.is_in(list(SOFTMAX_OPS)).to_numpy()
    top_soft = is_soft & ~np.where(parent >= 0, is_soft[np.maximum(parent, 0)], False) & use
    if not top_soft.any():
        return None
    is_mm = names.is_in(list(ATTN_MATMULS)).to_numpy()
    top_mm = is_mm & ~np.where(parent >= 0, is_mm[np.maximum(parent, 0)], False)
    math_anc = nearest(parent, names.is_in(list(SDPA_MATH)).to_numpy())
    tid = ops["tid"].to_numpy()
    ts = ops["ts"].cast(pl.Float64).to_numpy()
    end = ts + ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    dims = ops["dims"].to_list()
    name_l = names.to_list()

    mm_by_tid: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for t in np.unique(tid[top_soft]):
        rows = np.flatnonzero(top_mm & (tid == t))
        by_end = rows[np.argsort(end[rows], kind="stable")]
        by_start = rows[np.argsort(ts[rows], kind="stable")]
        mm_by_tid[t] = (by_end, by_start, ts[by_start])

    blocks = []  # (softmax row, first matmul row, second matmul row, score shape)
    for s in np.flatnonzero(top_soft):
        d = _dims(dims[s])
        score = _shape(d[0]) if d else None
        if score is None or len(score) < 3:
            continue
        by_end, by_start, starts = mm_by_tid[tid[s]]
        i = np.searchsorted(end[by_end], ts[s], side="right") - 1
        j = np.searchsorted(starts, end[s], side="left")
        if i < 0 or j >= len(by_start):
            continue
        p, q = by_end[i], by_start[j]
        if _mm_out_last2(name_l[p], _dims(dims[p])) != score[-2:] or _mm_in_last2(name_l[q], _dims(dims[q])) != score[-2:]:
            continue
        blocks.append((s, p, q, score))
    if not blocks:
        return None

    # Every op on the block's thread between the first matmul's start and the second's end.
    by_tid = {}
    for t in {tid[b[0]] for b in blocks}:
        rows_t = np.flatnonzero(tid == t)
        rows_t = rows_t[np.argsort(ts[rows_t], kind="stable")]
        by_tid[t] = (rows_t, ts[rows_t])
    region_rows = []
    for s, p, q, _ in blocks:
        rows_t, ts_t = by_tid[tid[s]]
        region_rows.append(rows_t[np.searchsorted(ts_t, ts[p], side="left"):np.searchsorted(ts_t, end[q], side="right")])
    rows = np.unique(np.concatenate(region_rows))
    shapes = {b[3] for b in blocks}
    bwd = np.flatnonzero(names.is_in(list(SOFTMAX_BWD_OPS)).to_numpy() & use)
    bwd = np.array([r for r in bwd if (d := _dims(dims[r])) and _shape(d[0]) in shapes], dtype=np.int64)
    top_names = None
    if device:
        # what ran on the device: the chain's kernels that are not matmuls
        k = ctx.kernels.filter(pl.col("op_row").is_in(rows.tolist()))
        kb = ctx.kernels.filter(pl.col("op_row").is_in(bwd.tolist()))
        over = k.filter(pl.col("cls") != "matmul")
        mm_us = float(k.filter(pl.col("cls") == "matmul")["dur"].sum())
        over_us = float(over["dur"].sum())
        bwd_us = float(kb.filter(pl.col("cls") != "matmul")["dur"].sum())
        top_names = over.group_by("name").agg(pl.col("dur").sum().alias("t"), pl.len().alias("n"))
    else:
        # a CPU trace: the outermost ops between the two matmuls (the partition's other compute)
        is_op = (ops["cat"] == "cpu_op").fill_null(False).to_numpy()
        outer = is_op & ~np.where(parent >= 0, is_op[np.maximum(parent, 0)], False)
        dur = ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
        between = np.zeros(ops.height, bool)
        for s, p, q, _ in blocks:
            rows_t, ts_t = by_tid[tid[s]]
            mid = rows_t[np.searchsorted(ts_t, end[p], side="left"):np.searchsorted(ts_t, ts[q], side="left")]
            between[mid] = True
        sel = between & outer & ~top_mm
        mm_us = float(sum(dur[p] + dur[q] for _, p, q, _ in blocks))
        over_us = float(dur[sel].sum())
        bwd_us = float(dur[bwd].sum()) if len(bwd) else 0.0
        top_names = pl.DataFrame({"name": names.filter(pl.Series(sel)), "t": dur[sel]}).group_by("name").agg(
            pl.col("t").sum(), pl.len().alias("n"))
    rec = over_us + bwd_us
    if rec <= 0:
        return None

    n_math = sum(1 for s, *_ in blocks if math_anc[s] >= 0)
    fused = int(ops.filter(pl.col("name").str.contains(FUSED_ATTENTION_RE) & pl.col("ran") & pl.col("step").is_in(ctx.ids)).height)
    common = max(shapes, key=lambda sh: sum(1 for b in blocks if b[3] == sh))
    ev = [
        f"{len(blocks)} attention blocks ran unfused as matmul → softmax → matmul, scores of shape {list(common)}"
        + (f" (and {len(shapes) - 1} other shapes)" if len(shapes) > 1 else ""),
        f"their scale / mask / softmax / dropout {'kernels' if device else 'ops'} took {fmt.duration(over_us)}"
        + (f" and softmax backward {fmt.duration(bwd_us)}" if bwd_us else "")
        + f" ({fmt.pct(ctx.share(rec), keep_small=False)} of step time); the score matmuls {fmt.duration(mm_us)}",
    ]
    for r in top_names.sort("t", descending=True).head(3).iter_rows(named=True):
        ev.append(f"{fmt.short(r['name'], 70, '?')}: {r['n']}×, {fmt.duration(r['t'])}")
    if n_math:
        ev.append(f"{n_math} of them are SDPA's math fallback ({min(SDPA_MATH)})")
    ev.append(f"fused SDPA ops (flash / memory-efficient / cuDNN) also ran {fused} times" if fused
              else "no fused SDPA op (flash / memory-efficient / cuDNN) ran")
    remedies = []
    if n_math:
        remedies.append(
            "SDPA fell back to its math path: the fused kernels need fp16/bf16 inputs (flash), a supported head dim, "
            "and is_causal=True rather than a dense attn_mask where the mask is causal; check "
            "torch.nn.attention.sdpa_kernel settings")
    if n_math < len(blocks):
        remedies += [
            ("Call torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...) instead of "
            "matmul + softmax + matmul: the flash / memory-efficient / cuDNN kernels never write the score matrix"),
            "Hugging Face models: load with attn_implementation=\"sdpa\" (or \"flash_attention_2\")",
        ]
    data = {"blocks": len(blocks), "math_fallback": n_math, "fused_sdpa_ops": fused, "non_matmul_us": over_us,
            "softmax_backward_us": bwd_us, "matmul_us": mm_us, "score_shapes": [list(s) for s in sorted(shapes)]}
    return _item(ctx, "attention", "Attention is not on a fused kernel: use SDPA", rec, ev, remedies, data)


def _fp32_matmul(ctx: _Ctx) -> dict | None:
    h_info = ctx.a.hardware
    if not h_info or h_info.get("precision") == "tf32" or ctx.kernels.height == 0:
        return None
    h = hw.lookup(h_info.get("name") or "")
    if h is None:
        return None
    fp32, tf32 = h.peak("fp32"), h.peak("tf32")
    half_name = max(("bf16", "fp16"), key=lambda p: h.peak(p) or 0.0)  # fp16 on Volta / Turing: no bf16 tensor cores
    half = h.peak(half_name)
    target, target_name = (tf32, "TF32") if tf32 and fp32 and tf32 > fp32 else (half, half_name)
    if not fp32 or not target or target <= fp32:
        return None
    op_dtype = ctx.a.ops.select(pl.col("row").alias("matmul_row"), pl.col("dtype").alias("_dtype"), pl.col("name").alias("_op"),
                                (pl.col("types") if "types" in ctx.a.ops.columns else pl.lit(None, pl.Utf8)).alias("_types"))
    mm = ctx.kernels.filter(pl.col("cls") == "matmul").join(op_dtype, on="matmul_row", how="left")
    types = mm.filter(pl.col("_dtype").is_null() & pl.col("_types").is_not_null())["_types"].unique().to_list()
    if types:  # a backward convolution's first input is a size list: its dtype is its first tensor's
        first = pl.DataFrame({"_types": types, "_t": [first_tensor_dtype(t) for t in types]}, schema={"_types": pl.Utf8, "_t": pl.Utf8})
        mm = mm.join(first, on="_types", how="left").with_columns(_dtype=pl.coalesce("_dtype", "_t"))
    f32 = mm.filter((pl.col("_dtype") == "fp32") & ~pl.col("name").str.contains(TF32_RE.pattern))
    if f32.height == 0:
        return None
    t = float(f32["dur"].sum())
    t = min(t, ctx.time.get("matmul", t))
    rec = t * (1.0 - fp32 / target)
    flops = float(f32["flops"].fill_null(0).sum())
    achieved = flops / (float(f32["dur"].sum()) * 1e-6) if flops else None
    calls = f32["matmul_row"].n_unique()
    op_names = f32.group_by("_op").agg(pl.col("dur").sum().alias("t"), pl.col("matmul_row").n_unique().alias("n")).sort("t", descending=True)
    ev = [
        f"{calls} matmul-class calls with fp32 inputs ran {fmt.duration(t)} ({fmt.pct(ctx.share(t), keep_small=False)} of step time) on fp32 "
        f"(non-tensor-core) kernels" + (f" at {achieved / 1e12:.1f} TFLOP/s" if achieved else ""),
        (f"{h.name}: fp32 peak {fmt.tflops(fp32)}, TF32 {fmt.tflops(tf32)}, {half_name} {fmt.tflops(half)}; at the same fraction of the "
        f"{target_name} peak they would take {fmt.pct(fp32 / target, keep_small=False)} of that time"),
    ]
    if achieved and half and half > fp32:
        ev.append(f"against the {half_name} tensor-core peak they ran at {fmt.pct(achieved / half, keep_small=False)} "
                  f"(against their own fp32 peak {fmt.pct(achieved / fp32, keep_small=False)})")
    for r in op_names.head(3).iter_rows(named=True):
        ev.append(f"{r['_op']}: {r['n']} calls, {fmt.duration(r['t'])}")
    remedies = []
    if half and half > fp32:  # autocast first: it reaches the faster peak
        dt = "torch.bfloat16" if half_name == "bf16" else "torch.float16 (with torch.amp.GradScaler)"
        remedies.append(
            f"Mixed precision first: torch.autocast(device_type=\"cuda\", dtype={dt}) around the forward and loss "
            f"({half_name} tensor-core peak {fmt.tflops(half)}, {half / fp32:.0f}× fp32's)")
    if tf32 and tf32 > fp32:
        conv = any("conv" in (n or "") for n in op_names["_op"].to_list())
        remedies.append(
            "torch.set_float32_matmul_precision(\"high\") (or torch.backends.cuda.matmul.allow_tf32 = True): fp32 "
            "matmuls run on TF32 tensor cores, no model change"
            + ("; convolutions follow torch.backends.cudnn.allow_tf32" if conv else ""))
    data = {"calls": calls, "time_us": t, "flops": flops, "target": target_name, "peak_fp32": fp32, "peak_target": target,
            "peak_tensor": half, "tensor": half_name}
    return _item(ctx, "fp32_matmul", f"fp32 matmuls where {target_name} would do", rec, ev, remedies, data)


def _coll_bytes(n, dtype) -> float | None:
    size = COLLECTIVE_ITEMSIZE.get(collective_dtype_key(dtype))
    return None if size is None or n is None else float(n) * size


def _communication(ctx: _Ctx) -> dict | None:
    exposed = ctx.time.get("communication_exposed", 0.0)
    if exposed <= 0:
        return None
    overlapped = ctx.time.get("communication_overlapped", 0.0)
    total = ctx.time.get("communication_total", 0.0)
    ev = [
        (f"{fmt.duration(exposed)} ({fmt.pct(ctx.share(exposed), keep_small=False)} of step time) of communication ran with no compute beside it; "
        f"{fmt.duration(overlapped)} of {fmt.duration(total)} ({fmt.pct(overlapped / total, keep_small=False) if total else '0%'}) overlapped compute"),
    ]
    k = ctx.kernels.filter(pl.col("cls") == "communication")
    if k.height == 0 and ctx.kernels.height == 0 and _jax(ctx):  # XLA:CPU: its collective ops, as the partition took them
        k = _activities(ctx).filter(pl.col("cls") == "communication")
    kinds = set()
    if k.height:
        coll = pl.coalesce(pl.col("collective"), pl.col("name")) if "collective" in k.columns else pl.col("name")
        per = (
            k.with_columns(_c=coll)
            .group_by("_c", "phase")
            .agg(pl.len().alias("n"), pl.col("dur").sum().alias("t"),
                 (pl.col("in_nelems").mean() if "in_nelems" in k.columns else pl.lit(None)).alias("elems"),
                 (pl.col("coll_dtype").first() if "coll_dtype" in k.columns else pl.lit(None)).alias("dtype"),
                 (pl.col("group_size").first() if "group_size" in k.columns else pl.lit(None)).alias("g"))
            .sort("t", descending=True)
        )
        for r in per.head(TOP).iter_rows(named=True):
            kinds.add(str(r["_c"]).lower())
            size = _coll_bytes(r["elems"], r["dtype"])
            extra = (f", {fmt.nbytes(size)} per call" if size else "") + (f", group of {r['g']}" if r["g"] else "")
            ev.append(f"{fmt.short(r['_c'], 70, '?')} ({r['phase']}): {r['n']}×, {fmt.duration(r['t'])}{extra}")
    dims = _bydimension_name(ctx)
    title = "Communication is exposed: overlap it with compute"
    if dims is not None:
        top = dims.row(0, named=True)
        title = (f"Communication is exposed: {dimension_name(top['role'])} {top['kind']} in {top['phase']} "
                 f"{fmt.pct(top['exposed_share'], keep_small=False)} of step time")
        kinds |= set(dims["kind"].to_list())
        ev[0:0] = [f"{dimension_name(r['role'])} {r['kind']} in {r['phase']}: {fmt.pct(r['exposed_share'], keep_small=False)} of step "
                   f"time exposed, {fmt.pct(r['overlapped_share'], keep_small=False)} hidden ({r['calls']} calls)"
                   for r in dims.head(TOP).iter_rows(named=True)]
    joined = " ".join(kinds)
    dp = []
    if "allreduce" in joined or "all_reduce" in joined:
        dp.append(
            "Bucketing (DDP): tune bucket_cap_mb so the first buckets' all-reduce starts early in backward and runs "
            "under the remaining backward compute; with gradient accumulation, skip the all-reduce on all but the "
            "last micro-batch (no_sync())")
    if any(x in joined for x in ("allgather", "all_gather", "reducescatter", "reduce_scatter", "_allgather_base")):
        dp.append(
            "Prefetch (FSDP): forward_prefetch=True and backward_prefetch=BACKWARD_PRE (FSDP2: "
            "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), so the next all-gather runs "
            "under the current layer's compute")
    if dims is None:
        remedies = dp
    else:  # each dimension's remedies, the most exposed dimension first
        order = list(dict.fromkeys(dims["role"].to_list()))
        remedies = [x for r in order for x in (dp if r in ("dp", "world") else [DIMENSION_REMEDIES.get(r)]) if x]
        remedies += [x for x in dp if x not in remedies]
    remedies.append(
        "Overlap: issue collectives asynchronously (async_op=True, or on a side stream) and wait only where the result "
        "is needed; nothing should synchronize right after a collective")
    data = {"exposed_us": exposed, "overlapped_us": overlapped, "total_us": total}
    if dims is not None:
        data["by_dimension"] = dims.select("role", "phase", "kind", "exposed_share", "overlapped_share").to_dicts()
    return _item(ctx, "communication", title, exposed, ev, remedies, data)


DIMENSION_REMEDIES = {
    "tp": ("TP: keep the tensor-parallel group inside one node (NVLink), and overlap its all-gather and reduce-scatter with "
           "the GEMMs that use them (sequence parallelism with async TP: torch._inductor.config._micro_pipeline_tp, or "
           "Transformer Engine's comm-GEMM overlap); a smaller TP degree trades it for DP or PP"),
    "pp": ("PP: receives with nothing to run are the pipeline bubble; more micro-batches per step or an interleaved "
           "schedule (virtual stages) shrink it, see the job's pipeline section"),
    "ep": ("EP: overlap the token all-to-all with the shared expert's or the next micro-batch's compute, and balance the "
           "tokens per expert (an imbalanced all-to-all waits for the busiest rank)"),
    "cp": "CP: overlap the ring's key/value exchange with the attention of the block already received",
}


def _bydimension_name(ctx: _Ctx) -> pl.DataFrame | None:
    """The trace's communication by dimension with exposed time, when its groups tell dimensions apart."""
    d = getattr(ctx.a, "communication", None)
    if d is None or d.height == 0:
        return None
    if not tells_dimensions_apart(d["role"].to_list()):
        return None
    d = d.filter(pl.col("exposed_us") > 0)
    return d if d.height else None


def _recompute(ctx: _Ctx) -> dict | None:
    t = ctx.time.get("recompute", 0.0)
    if t <= 0:
        return None
    flops = float(ctx.steps["flops_recompute"].fill_null(0).sum()) if "flops_recompute" in ctx.steps.columns else 0.0
    executed = float(ctx.steps["flops_executed"].fill_null(0).sum()) if "flops_executed" in ctx.steps.columns else 0.0
    term = (ctx.budget or {}).get("recompute")
    what = "kernels" if ctx.kernels.height else "ops"
    ev = [f"recompute {what} ran {fmt.duration(t)} ({fmt.pct(ctx.share(t), keep_small=False)} of step time, as time)"
          + (f", redoing {flops / 1e9:.1f} GFLOP ({fmt.pct(flops / executed, keep_small=False)} of the executed matmul FLOPs)" if flops and executed else "")]
    if term is not None:
        ev.insert(0, f"the recomputed matmul FLOPs take {fmt.pct(term, keep_small=False)} {UNIT} (the loss budget's recompute term); "
                     "the rest of the recompute time is counted in non_matmul and matmul_below_peak")
    rk = ctx.kernels.filter(pl.col("phase") == "recompute")
    if rk.height:
        by = dict(rk.group_by("cls").agg(pl.col("dur").sum()).iter_rows())
        ev.append(f"of the recompute kernels' time: matmul {fmt.duration(by.get('matmul', 0.0))}, other compute "
                  f"{fmt.duration(by.get('other_compute', 0.0))}")
    bm = ctx.a.by_module
    if bm is not None and "time_recompute" in bm.columns:
        top = bm.filter(pl.col("time_recompute") > 0).sort("time_recompute", descending=True).head(3)
        for r in top.iter_rows(named=True):
            ev.append(f"module {fmt.short(r['module'], 70, '?')}: {fmt.duration(r['time_recompute'])} recomputed "
                      f"({fmt.pct(r['recompute_share'] or 0.0, keep_small=False)} of its kernel time, all steps)")
    remedies = [
        ("Selective activation checkpointing: save the outputs of the expensive ops (matmuls, convolutions, attention) "
        "and recompute only the cheap ones (torch.utils.checkpoint with create_selective_checkpoint_contexts, or "
        "your framework's checkpoint policy)"),
        "Checkpoint fewer blocks (e.g. every other layer) where memory allows: the blocks left out cost no recompute",
    ]
    data = {"time_us": t, "time_share": ctx.share(t), "flops": flops, "executed_flops": executed}
    if term is None:  # no peak: the budget has no recompute term, so the headline is the recompute time
        return _item(ctx, "recompute", "Recompute costs time: checkpoint selectively", t, ev, remedies, data,
                     unit="of step time (recompute time: without a peak the loss budget has no recompute term)")
    return _item(ctx, "recompute", "Recompute costs time: checkpoint selectively", t, ev, remedies, data, share=term)


def _gap_item(ctx: _Ctx, reason: str) -> tuple[pl.DataFrame, list[str]] | None:
    if ctx.gaps is None:
        return None
    g = ctx.gaps.filter(pl.col("reason") == reason)
    if g.height == 0:
        return None
    worst = float(g["dur"].max())
    return g, [(f"{g.height} idle gaps, {fmt.duration(g['dur'].sum())} ({fmt.pct(ctx.share(g['dur'].sum()), keep_small=False)} of step time), "
               f"longest {fmt.duration(worst)}")]


def _overlapping(frame: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """Rows of `frame` (ts, dur) that share time with any gap."""
    if frame.height == 0 or gaps.height == 0:
        return frame.head(0)
    gs = gaps["start"].to_numpy()
    ge = gs + gaps["dur"].to_numpy()
    o = np.argsort(gs)
    gs, ge = gs[o], np.maximum.accumulate(ge[o])
    s = frame["ts"].cast(pl.Float64).to_numpy()
    e = s + frame["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    j = np.searchsorted(gs, e, side="left") - 1
    hit = (j >= 0) & (ge[np.maximum(j, 0)] > s)
    return frame.filter(pl.Series(hit))


def _input_pipeline(ctx: _Ctx) -> dict | None:
    got = _gap_item(ctx, "input_pipeline")
    if got is None:
        return None
    g, ev = got
    loaders = _overlapping(ctx.a.ops.filter(tl.is_dataloader(pl.col("name"))), g)
    single = False
    if loaders.height:
        per = loaders.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("t")).sort("t", descending=True)
        for r in per.head(3).iter_rows(named=True):
            ev.append(f"{fmt.short(r['name'], 70, '?')}: {r['n']}× over the gaps, {fmt.duration(r['t'])} on the host")
        single = loaders["name"].str.contains("SingleProcess").any()
    if single:
        ev.append("the loader runs in the training process (num_workers=0)")
    remedies = [
        ("DataLoader(num_workers=N > 0, persistent_workers=True, prefetch_factor=2 or more): batches are prepared "
        "while the device computes"),
        "pin_memory=True with .to(device, non_blocking=True): the copy does not block the host",
        "Move decoding and augmentation to the device, or pre-process the data set offline",
    ]
    if not single:
        remedies[0] = "More DataLoader workers or a larger prefetch_factor: the workers do not keep up with the device"
    return _item(ctx, "input_pipeline", "The device waits for the data loader", float(g["dur"].sum()), ev, remedies,
                 {"gaps": g.height, "time_us": float(g["dur"].sum()), "single_process": bool(single)})


def _enclosing(ops: pl.DataFrame, calls: pl.DataFrame) -> list[str]:
    """Name of the innermost cpu op on the caller's thread that encloses each call (none: left out).

    The last op on the thread to start at or before the call, then up its
    parents to the first that is still running.
    """
    found: list[int] = []
    if calls.height == 0 or ops.height == 0:
        return []
    ops = ops.sort("row")
    tid = ops["tid"].to_numpy()
    ts = ops["ts"].cast(pl.Float64).to_numpy()
    end = ts + ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    parent = ops["parent"].to_numpy()
    is_op = (ops["cat"] == "cpu_op").fill_null(False).to_numpy() if "cat" in ops.columns else np.ones(ops.height, bool)
    per_tid: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    for t, at in calls.select("tid", pl.col("ts").cast(pl.Float64)).iter_rows():
        if t not in per_tid:
            rows_t = np.flatnonzero(tid == t)
            rows_t = rows_t[np.argsort(ts[rows_t], kind="stable")]
            per_tid[t] = (rows_t, ts[rows_t])
        rows_t, ts_t = per_tid[t]
        i = np.searchsorted(ts_t, at, side="right") - 1
        r = rows_t[i] if i >= 0 else -1
        while r >= 0 and (end[r] < at or not is_op[r]):  # running, and an op (not a step marker)
            r = parent[r]
        if r >= 0:
            found.append(int(r))
    return ops["name"].gather(found).to_list()  # a few names, not a Python string per op


def _sync(ctx: _Ctx) -> dict | None:
    got = _gap_item(ctx, "sync")
    if got is None:
        return None
    g, ev = got
    launches = ctx.a.trace.launches
    calls = _overlapping(launches.filter(tl.is_sync_call(pl.col("name"))), g) if launches is not None else None
    callers: list[str] = []
    if calls is not None and calls.height:
        per = calls.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("t")).sort("t", descending=True)
        ev.append("synchronizing calls over the gaps: " + ", ".join(f"{r['name']} {r['n']}× ({fmt.duration(r['t'])})" for r in per.head(3).iter_rows(named=True)))
        callers = _enclosing(ctx.a.ops, calls)
        if callers:
            top = pl.Series(callers).value_counts(sort=True).head(3)
            ev.append("made by: " + ", ".join(f"{n} ({c}×)" for n, c in top.iter_rows()))
    text = " ".join(callers + (calls["name"].to_list() if calls is not None and calls.height else []))
    remedies = []
    if re.search(r"item|_local_scalar_dense|is_nonzero|tolist", text) or not text:
        remedies.append("Drop .item() / .cpu() / .tolist() / print(tensor) inside the step: log every N steps, or "
                        "accumulate the metric on the device")
    if re.search(r"nonzero|masked_select|index|unique", text):
        remedies.append("Data-dependent shapes (nonzero, boolean-mask indexing, unique) wait for the device: use "
                        "fixed-shape ops (torch.where, masked arithmetic)")
    if re.search(r"Memcpy|copy_|aten::to\b|_to_copy", text):
        remedies.append("Blocking copies: copy from pinned memory with non_blocking=True, and read results back "
                        "once per step at most")
    if re.search(r"DeviceSynchronize|StreamSynchronize|EventSynchronize", text):
        remedies.append("Remove explicit torch.cuda.synchronize() / event.synchronize() from the training loop "
                        "(keep them for timing runs only)")
    if not remedies:
        remedies.append("Find the host call that waits for the device (the callers above) and move it out of the step")
    return _item(ctx, "sync", "Host-device synchronisations stall the device", float(g["dur"].sum()), ev, remedies,
                 {"gaps": g.height, "time_us": float(g["dur"].sum()), "callers": callers[:20]})


# ---------------------------------------------------------------- loss-budget entries
#
# Every loss-budget term of at least BUDGET_MIN_SHARE gets an entry whose headline is the term itself; the rules'
# items that explain part of a term are folded into its entry (`findings`), so the largest losses always say what
# to do next, and a cause the trace cannot tell is said with what to record next time.

TERM_OF = {  # the budget term a rule's item explains part of
    "host_bound": "idle", "input_pipeline": "idle", "sync": "idle",
    "memory_bound": "non_matmul", "attention": "non_matmul",
    "fp32_matmul": "matmul_below_peak",
    "communication": "communication_exposed", "recompute": "recompute",
}
ENTRY_KIND = {"communication_exposed": "communication"}  # a term whose entry keeps its rule's kind (else: the term)
FUSE_GAP_US = 5.0  # short kernels this close on one stream run back to back
FUSE_RUN = 3  # so many short non-matmul kernels in a row are one fusion candidate
LAYOUT_SHARE = 0.1  # layout transposes this much of the non-matmul time are worth their own remedy

RECORD = {  # what to record next time, by framework
    "shapes": ("profile with record_shapes=True: the ops' input shapes give FLOPs and GEMM shapes",
               ("FLOPs and shapes come from the HLO in the profile: capture it with jax.profiler.trace around jitted "
               "steps of this process, so the profile holds the programs' HLO modules")),
    "stack": (("profile with with_stack=True (and a schedule over several steps after warm-up): the Python stack "
              "shows what the host ran over the gaps"),
              ("profile with jax.profiler.trace over several steps after warm-up, with the Python tracer on "
              "(jax.profiler.ProfileOptions: python_tracer_level=1, host_tracer_level=2): it shows what the host ran "
              "over the gaps")),
    "device": (("profile on the accelerator with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]: the "
               "kernels, their launches and the idle gaps between them are then in the trace"),
               ("profile on the accelerator (jax.profiler.trace on a GPU or TPU backend): the device's ops and the "
               "idle gaps between them are then in the profile")),
    "hardware": (("name the device (--hardware NAME) instead of a bare --peak-tflops: the roofline, tensor-core "
                 "dtypes and wave quantization need its bandwidth and SM count"),) * 2,
}


def _record(ctx: _Ctx, *what: str) -> list[str]:
    """What to record next time, worded for the trace's framework."""
    return [RECORD[w][1 if _jax(ctx) else 0] for w in what]


def _say(ctx: _Ctx, pytorch: list[str], jax: list[str]) -> list[str]:
    return jax if _jax(ctx) else pytorch


def _activities(ctx: _Ctx) -> pl.DataFrame:
    """What did the work in the counted steps: the device's kernels, or on a CPU trace the ops as the partition took them
    (those of the device the time terms are of, a program over several XLA:CPU devices)."""
    if ctx.kernels.height or ctx.a.ops.height == 0:
        return ctx.kernels
    return tl.on_devices(tl.cpu_activities(ctx.a.ops).filter(pl.col("step").is_in(ctx.ids)), [ctx.device])


def _cpu_other(ctx: _Ctx) -> pl.DataFrame:
    """A CPU trace's non-matmul work by op: the outermost aten (or XLA) ops that are not matmuls, each with the time
    of the matmuls nested in it taken out (the partition counts that time as matmul). Autograd nodes and module
    wrappers are looked through, so the names are the ops a fuser would merge. XLA collectives are communication, not
    here; on several XLA:CPU devices, the ops of the device the time terms are of."""
    ops = ctx.a.ops
    parent = ops["parent"].to_numpy()
    unit = (ops["name"].str.starts_with("aten::") | (ops["cat"] == "xla_op")).fill_null(False).to_numpy()
    outer = unit & ~np.where(parent >= 0, nearest(parent, unit)[np.maximum(parent, 0)] >= 0, False)
    mm = (ops["matmul"] & ops["ran"]).to_numpy()
    dur = ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
    inner = np.flatnonzero(mm & (parent >= 0))
    anc = nearest(parent, outer)[parent[inner]]
    keep = anc >= 0
    nested = np.bincount(anc[keep], weights=dur[inner[keep]], minlength=len(dur))
    sel = outer & ~mm & ops["ran"].to_numpy()
    if "collective" in ops.columns:
        sel &= ~((ops["cat"] == "xla_op") & ops["collective"].is_not_null()).fill_null(False).to_numpy()
    own = pl.DataFrame({"_i": np.flatnonzero(sel).astype(np.uint32), "_own": np.maximum(dur - nested, 0.0)[sel]})
    cpu = ops.with_row_index("_i").join(own, on="_i", how="inner").filter(pl.col("step").is_in(ctx.ids) & (pl.col("_own") > 0))
    device = pl.col("device").cast(pl.Int64) if "device" in cpu.columns else pl.lit(None, pl.Int64)
    return tl.on_devices(cpu.select("name", device.alias("device"), pl.col("tid").alias("stream"), "ts",
                                    pl.col("_own").alias("dur"), pl.lit("other_compute").alias("cls"), "phase", "step"),
                         [ctx.device])


def _top_names(frame: pl.DataFrame, ctx: _Ctx, n: int = TOP) -> list[str]:
    """The names that took the most time, with their count, time and share of step time (as time)."""
    if frame.height == 0:
        return []
    top = (frame.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("t"), pl.col("dur").median().alias("med"))
           .sort(["t", "name"], descending=[True, False]).head(n))
    return [f"{fmt.short(r['name'], 70, '?')}: {r['n']}×, {fmt.duration(r['t'])} ({fmt.pct(ctx.share(r['t']), keep_small=False)} "
            f"of step time, as time), median {fmt.duration(r['med'])}" for r in top.iter_rows(named=True)]


def short_runs(acts: pl.DataFrame, short_us: float = SHORT_KERNEL_US, gap_us: float = FUSE_GAP_US,
               min_run: int = FUSE_RUN) -> pl.DataFrame:
    """Runs of at least `min_run` short non-matmul activities back to back on one stream: what a fuser merges.

    Columns: run, n (activities), t (their time, µs), names (distinct, most frequent first).
    """
    out = {"run": pl.UInt32, "n": pl.UInt32, "t": pl.Float64, "names": pl.List(pl.Utf8)}
    if acts.height == 0:
        return pl.DataFrame(schema=out)
    lanes = [c for c in ("device", "stream") if c in acts.columns]
    # Only the columns the runs need, sorted (not the kernels' every column: a million kernels' copy is hundreds of MB);
    # the names of the short ones are gathered afterwards by row.
    s = (acts.select(*lanes, "ts", "dur", "cls").with_row_index("_row").filter(pl.col("dur").is_not_null())
         .sort([*lanes, "ts"], nulls_last=True)
         .with_columns(_short=((pl.col("cls") == "other_compute") & (pl.col("dur") < short_us)).fill_null(False)))
    same = pl.int_range(pl.len()) > 0
    for c in lanes:
        same = same & pl.col(c).eq_missing(pl.col(c).shift(1))
    close = ((pl.col("ts") - (pl.col("ts") + pl.col("dur")).shift(1)) <= gap_us).fill_null(False)
    goes_on = pl.col("_short") & pl.col("_short").shift(1).fill_null(False) & same & close
    short = s.with_columns(run=(~goes_on).cast(pl.UInt32).cum_sum()).filter(pl.col("_short"))
    runs = (short.group_by("run").agg(pl.len().alias("n"), pl.col("dur").sum().cast(pl.Float64).alias("t"))
            .filter(pl.col("n") >= min_run).sort("t", descending=True))
    # The names of the runs kept only, most frequent first (counted per (run, name): no per-group value_counts).
    kept = short.join(runs.select("run"), on="run", how="semi")
    names = (kept.with_columns(name=acts["name"].gather(kept["_row"])).group_by("run", "name").agg(pl.len().alias("_k"))
             .sort(["run", "_k", "name"], descending=[False, True, False]).group_by("run", maintain_order=True)
             .agg(pl.col("name").alias("names")))
    runs = runs.join(names, on="run", how="left", maintain_order="left")
    return runs.select(list(out)).cast(out)


def _folded(findings: list[dict], ctx: _Ctx) -> list[str]:
    """One line per folded item: its headline share and its first piece of evidence."""
    return [f"{it['title']}: {fmt.pct(it['recoverable'], keep_small=False)} {UNIT}"
            + (f" ({it['evidence'][0]})" if it["evidence"] else "") for it in findings]


def _remedies_of(findings: list[dict]) -> list[str]:
    out = []
    for it in findings:
        out += it["remedies"][:2]
    return out


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _by_phase(frame: pl.DataFrame, ctx: _Ctx) -> str | None:
    if frame.height == 0 or "phase" not in frame.columns:
        return None
    by = frame.group_by("phase").agg(pl.col("dur").sum()).sort("dur", descending=True)
    total = float(by["dur"].sum())
    if not total:
        return None
    return "by phase (as time): " + ", ".join(f"{p} {fmt.pct(t / total, keep_small=False)}" for p, t in by.iter_rows())


def _non_matmul(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    device = ctx.kernels.height > 0
    if device or ctx.a.ops.height == 0:
        other = ctx.kernels.filter(pl.col("cls") == "other_compute") if device else ctx.kernels
    else:
        other = _cpu_other(ctx)
    what = "kernels" if device else "ops"
    t_other = float(other["dur"].sum()) if other.height else 0.0
    ev = [f"non-matmul compute (elementwise, normalization, reductions, softmax, copies) takes "
          f"{fmt.pct(value, keep_small=False)} {UNIT}: {other.height} {what}, {fmt.duration(t_other)} of time"
          + ("" if device else f" inside ops (the rest of the {fmt.duration(value * ctx.window)} in autograd nodes and "
                               "wrappers around them)")]
    ev += _folded(findings, ctx)
    ev += _top_names(other, ctx, 3)
    runs = short_runs(other)
    data: dict[str, Any] = {"activities": other.height, "time_us": float(other["dur"].sum()) if other.height else 0.0,
                            "fusion_runs": runs.height, "fusion_run_activities": int(runs["n"].sum()) if runs.height else 0,
                            "top": other.group_by("name").agg(pl.col("dur").sum().alias("t")).sort(["t", "name"], descending=[True, False])
                            .head(TOP)["name"].to_list() if other.height else []}
    if runs.height:
        names = pl.Series("name", [n for ns in runs["names"].to_list() for n in ns[:3]]).value_counts(sort=True).head(3)["name"].to_list()
        ev.append(f"fusion candidates: {runs.height} runs of {FUSE_RUN} or more {what} shorter than {SHORT_KERNEL_US:.0f} µs back to back "
                  f"({int(runs['n'].sum())} {what}, {fmt.duration(runs['t'].sum())}), e.g. "
                  + ", ".join(fmt.short(n, 50, '?') for n in names))
        data["fusion_names"] = names
    phase = _by_phase(other, ctx)
    if phase:
        ev.append(phase)
    opt = float(other.filter(pl.col("phase") == "optimizer")["dur"].sum()) if other.height and "phase" in other.columns else 0.0
    total = float(other["dur"].sum()) if other.height else 0.0
    layout = other.filter(name_matches(other["name"], LAYOUT_KERNEL_RE)) if device and other.height else other.clear()
    data["layout_transpose_us"] = t_layout = float(layout["dur"].sum()) if layout.height else 0.0
    layout_matters = total > 0 and t_layout >= LAYOUT_SHARE * total
    if layout_matters:
        ev.append(f"{layout.height} layout transposes around convolutions (NCHW to NHWC and back) take {fmt.duration(t_layout)}, "
                  f"{fmt.pct(t_layout / total, keep_small=False)} of it")
    remedies = _remedies_of(findings)
    if layout_matters:
        remedies += _say(ctx, [("channels_last: model.to(memory_format=torch.channels_last) and the same for its inputs, so cuDNN "
                               "runs the convolutions in NHWC without transposing (tensor cores want NHWC, above all in fp16/bf16)")],
                         [("The convolutions are transposed to and from the layout cuDNN runs: give the convolutions NHWC "
                           "(dimension_numbers=('NHWC', 'HWIO', 'NHWC')) so XLA has nothing to transpose")])
    remedies += _say(ctx, [
        ("torch.compile the model (or its hot blocks): Inductor fuses chains of elementwise and normalization ops into one kernel, "
        "so the intermediates never go through memory"),
        CONV_FUSE if _conv_dominates(ctx) else
        ("Fused kernels for the common chains: fused LayerNorm/RMSNorm, fused activations (e.g. Liger, Apex, Transformer Engine), "
         "SDPA for attention"),
    ], [
        ("Keep the whole step in one jax.jit so XLA fuses the elementwise chains; host callbacks and jit boundaries split "
        "fusions: check the optimized HLO (XLA_FLAGS=--xla_dump_to=DIR) for unfused ops"),
        "Fused attention (jax.nn.dot_product_attention, or a Pallas / cuDNN kernel) instead of einsum + softmax + einsum",
    ])
    if total and opt >= 0.2 * total:
        remedies.insert(0, _say(ctx, [(f"The optimizer is {fmt.pct(opt / total, keep_small=False)} of it: a fused or foreach optimizer "
                                      "(torch.optim.AdamW(..., fused=True))")],
                                [(f"The optimizer is {fmt.pct(opt / total, keep_small=False)} of it: apply the optax update inside "
                                 "the same jit as the gradient, so its elementwise chain fuses")])[0])
    record: list[str] = []
    if not device and not _jax(ctx):
        record = _record(ctx, "device")
        ev.append("a CPU trace: which of these ops would be memory-bound kernels on the device, and which fuse, cannot be told from it")
    elif device and ("bound" not in ctx.kernels.columns or ctx.kernels["bound"].null_count() == ctx.kernels.height):
        record = _record(ctx, "hardware")
        ev.append("the hardware is not known (a bare peak was given): which kernels are memory-bound cannot be told")
    return "Non-matmul compute: fuse the small kernels", ev, remedies, data, record, other.height > 0


def _idle(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    ev = [(f"{'the device did nothing' if ctx.kernels.height else 'no work ran'} for {fmt.pct(value, keep_small=False)} {UNIT} "
          f"({fmt.duration(value * ctx.window)})")]
    data: dict[str, Any] = {}
    record: list[str] = []
    remedies = _remedies_of(findings)
    if ctx.gaps is not None and ctx.gaps.height:
        got = dict(ctx.gaps.group_by("reason").agg(pl.col("dur").sum()).iter_rows())
        by = {r: float(got.get(r, 0.0)) for r in GAP_REASONS}
        data["by_reason_us"] = by
        ev.append("by reason: " + ", ".join(f"{r} {fmt.pct(ctx.share(t), keep_small=False)}"
                                            for r, t in sorted(by.items(), key=lambda x: -x[1]) if t > 0))
        ev += _folded(findings, ctx)
        unknown = by["unknown"]
        if ctx.share(unknown) >= MIN_SHARE:
            ev.append(f"{fmt.pct(ctx.share(unknown), keep_small=False)} of step time is idle with no cause in the trace "
                      "(no launch, synchronising call or data-loader op over the gap): it cannot be told what the host did")
            record = _record(ctx, "stack")
    elif ctx.kernels.height == 0 and not _jax(ctx):
        ev.append("a CPU trace: idle is time when no op ran (Python between ops, waits outside ops); why cannot be told "
                  "from a CPU trace")
        record = _record(ctx, "stack", "device")
    elif ctx.kernels.height == 0:
        ev.append("an XLA:CPU profile: idle is time when no XLA op ran (dispatch between programs, Python); why cannot "
                  "be told from it")
        record = _record(ctx, "stack", "device")
    else:
        ev.append("no idle gap inside the steps holds a cause: it cannot be told what the host did")
        record = _record(ctx, "stack")
    if not remedies:
        remedies = _say(ctx, [
            "Find what the host runs over the longest gaps (with_stack=True) and move it out of the step or overlap it",
            "torch.compile / CUDA graphs where the host launches many small kernels",
        ], [
            "Find what the host runs over the longest gaps (the Python tracer) and move it out of the step",
            "Put the whole step under one jax.jit, and keep the host ahead: no jax.device_get / float(x) inside the loop",
        ])
    return "The device sits idle: keep it fed", ev, remedies, data, record, not record


def _gemm_lines(ctx: _Ctx) -> tuple[list[str], dict[str, Any]]:
    """The GEMM shapes that took the most matmul time, their throughput and wave quantization (device traces)."""
    g = ctx.a.by_gemm_shape
    peak1 = (ctx.a.hardware or {}).get("peak_flops")
    if g is None or g.height == 0 or float(g["time_us"].sum()) <= 0:
        return [], {}
    ev = []
    conv = pl.col("conv").is_not_null() if "conv" in g.columns else pl.lit(False)
    conv_share = float(g.filter(conv)["share"].fill_null(0.0).sum())
    if conv_share >= GEMM_TIME_MATTERS:
        passes = g.filter(conv).group_by("conv").agg(pl.col("share").sum()).sort(["share", "conv"], descending=[True, False])
        ev.append(f"convolutions take {fmt.pct(conv_share, keep_small=False)} of matmul time ("
                  + ", ".join(f"{PASS_WORDS.get(c, c)} {fmt.pct(v, keep_small=False)}" for c, v in passes.iter_rows())
                  + "); each is shown as its implicit GEMM: M = batch × output height × width, N = output channels, "
                  "K = input channels × kernel height × width")
    for r in g.filter(pl.col("time_us") > 0).head(3).iter_rows(named=True):
        dims = f"{r['M']}×{r['N']}×{r['K']}" + (f" ×{r['batch']}" if r["batch"] > 1 else "")
        rate = (f", {r['tflops']:.1f} TFLOP/s" + (f" ({fmt.pct(r['tflops'] * 1e12 / peak1, keep_small=False)} of peak)" if peak1 else "")
                if r["tflops"] is not None else "")
        what = f"convolution {PASS_WORDS.get(r['conv'], r['conv'])}, implicit GEMM" if r.get("conv") else "GEMM"
        if r.get("conv") and peak1 and r["tflops"] is not None and r["tflops"] * 1e12 > peak1:
            rate += ": above peak, as counted: a Winograd or FFT algorithm does fewer multiplications than the direct convolution"
        ev.append(f"{what} M×N×K {dims} ({r['dtype'] or '?'}): {r['count']} calls, {fmt.duration(r['time_us'])} "
                  f"({fmt.pct(r['share'], keep_small=False)} of matmul time){rate}")
    by_dtype = g.group_by("dtype").agg(pl.col("time_us").sum()).sort("time_us", descending=True)
    tot = float(by_dtype["time_us"].sum())
    by_dtype = by_dtype.filter(pl.col("time_us") >= GEMM_TIME_MATTERS * tot) if tot else by_dtype
    if by_dtype.height > 1 or (by_dtype.height == 1 and by_dtype["dtype"][0] == "fp32"):
        ev.append("matmul time by dtype: " + ", ".join(f"{d or '?'} {fmt.pct(t / tot, keep_small=False)}" for d, t in by_dtype.iter_rows()))
    waves = g.filter(pl.col("wave_hint").fill_null(False))
    if waves.height:
        ev.append(f"wave quantization: {waves.height} shapes ({fmt.pct(waves['share'].sum(), keep_small=False)} of matmul time) leave "
                  f"the last wave under half full, e.g. {waves['hint'][0]}")
    small = g.filter(pl.col("waves").is_not_null() & (pl.col("waves") < 1) & (pl.col("share") >= GEMM_TIME_MATTERS))
    if small.height:
        ev.append(f"{small.height} shapes ({fmt.pct(small['share'].sum(), keep_small=False)} of matmul time) have fewer output "
                  "tiles than the device has SMs: too small to fill it")
    return ev, {"wave_hint_shapes": waves.height, "small_shapes": small.height,
                "dtypes": {str(d): float(t) for d, t in by_dtype.iter_rows()}, "conv_share": conv_share}


PASS_WORDS = {"fwd": "forward", "dgrad": "input gradient", "wgrad": "weight gradient",
              "dgrad+wgrad": "input and weight gradients", "bwd": "backward"}
# Fusing what surrounds the convolutions (a CNN's non-matmul time is BatchNorm, ReLU and residual adds).
CONV_FUSE = ("Fuse BatchNorm + ReLU (+ the residual add) around the convolutions: torch.compile the model (Inductor fuses them, "
             "with channels_last); for inference fold BatchNorm into the convolution weights (torch.ao.quantization.fuse_modules)")
CONV_REMEDIES = [
    ("Mixed precision first: torch.autocast(device_type=\"cuda\", dtype=torch.float16 or torch.bfloat16) runs the convolutions "
     "on tensor cores; TF32 for what stays fp32 (torch.backends.cudnn.allow_tf32, Ampere and later)"),
    ("channels_last: model.to(memory_format=torch.channels_last) and the same for its inputs: cuDNN's tensor-core convolution "
     "kernels are NHWC, so NCHW pays layout transposes"),
    "torch.backends.cudnn.benchmark = True with fixed input sizes: cuDNN times its algorithms once and keeps the fastest",
    ("Channel counts in multiples of 8 (fp16/bf16; 4 for TF32) so the convolutions run on tensor cores, 64 or more to fill "
     "their tiles: pad the stem's 3 input channels to 4 or 8"),
    CONV_FUSE,
]
CONV_REMEDIES_JAX = [
    "Compute in bfloat16: flax nn.Conv(..., dtype=jnp.bfloat16) (param_dtype float32), or cast the activations",
    ("NHWC convolutions (flax's default; dimension_numbers=('NHWC', 'HWIO', 'NHWC') in lax.conv_general_dilated) with "
     "feature counts in multiples of 128 on TPUs (8 on GPUs)"),
    "A larger batch per device: the late layers' small spatial sizes cannot fill the matrix units",
]


XLA_CONV_RE = r"(?i)^(convolution|cudnn-conv|conv[-_.])|conv_general"


def _conv_share(ctx: _Ctx) -> float:
    """The share of matmul time spent in convolutions: their kernels (device), or their ops (a CPU trace)."""
    if ctx.conv is not None:
        return ctx.conv
    share = 0.0
    if ctx.kernels.height and "matmul_row" in ctx.kernels.columns and ctx.a.ops.height:
        mm = ctx.kernels.filter(pl.col("cls") == "matmul").select("matmul_row", "dur")
        names = ctx.a.ops.select(pl.col("row").cast(pl.Int64).alias("matmul_row"), pl.col("name").alias("_op"))
        mm = mm.with_columns(pl.col("matmul_row").cast(pl.Int64)).join(names, on="matmul_row", how="left")
        tot = float(mm["dur"].sum())
        conv = pl.col("_op").is_in(list(CONV_OPS))
        if _jax(ctx):  # HLO instructions: convolution.N, cudnn-conv.N (XLA's cuDNN / MIOpen call)
            conv = conv | pl.col("_op").str.contains(XLA_CONV_RE)
        share = float(mm.filter(conv)["dur"].sum()) / tot if tot else 0.0
    elif ctx.kernels.height:
        mm = ctx.kernels.filter(pl.col("cls") == "matmul")
        tot = float(mm["dur"].sum())
        share = float(mm.filter(pl.col("name").str.contains("(?i)conv"))["dur"].sum()) / tot if tot else 0.0
    else:
        mm = _activities(ctx).filter(pl.col("cls") == "matmul") if ctx.a.ops.height else ctx.kernels
        tot = float(mm["dur"].sum()) if mm.height else 0.0
        conv = pl.col("name").is_in(list(CONV_OPS)) | pl.col("name").str.contains(XLA_CONV_RE)
        share = float(mm.filter(conv)["dur"].sum()) / tot if tot else 0.0
    ctx.conv = share
    return share


def _conv_dominates(ctx: _Ctx) -> bool:
    return _conv_share(ctx) >= CONV_DOMINATES


def _matmul_ops(ctx: _Ctx) -> list[str]:
    """The matmul ops (a CPU trace) or kernels (XLA) that took the most time, with their achieved rate."""
    acts = _activities(ctx)
    mm = acts.filter(pl.col("cls") == "matmul") if acts.height else acts
    if mm.height == 0:
        return []
    if ctx.kernels.height == 0 and not _jax(ctx) and "dims" in ctx.a.ops.columns:  # a CPU trace: each op with its shapes
        ops = ctx.a.ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("step").is_in(ctx.ids))
        mm = ops.with_columns(name=pl.col("name") + pl.lit(" ") + pl.col("dims").fill_null("[?]"))
    top = (mm.group_by("name").agg(pl.len().alias("n"), pl.col("dur").sum().alias("t"),
                                   pl.col("flops").cast(pl.Float64).sum().alias("f"), pl.col("flops").null_count().alias("u"))
           .sort(["t", "name"], descending=[True, False]).head(3))
    per = (ctx.a.hardware or {}).get("peak_flops")  # one device's: these ops ran on one
    out = []
    for r in top.iter_rows(named=True):
        rate = r["f"] / (r["t"] * 1e-6) if r["t"] and r["f"] and not r["u"] else None
        out.append(f"{fmt.short(r['name'], 90, '?')}: {r['n']}×, {fmt.duration(r['t'])}"
                   + (f", {fmt.si(rate, 'FLOP/s')}" + (f" ({fmt.pct(rate / per, keep_small=False)} of peak)" if per else "") if rate else ""))
    return out


def _matmul_below_peak(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    known = ctx.share(ctx.time.get("matmul_known", 0.0))
    at_peak = known - value
    ev = [f"matmuls with known FLOPs ran {fmt.pct(known, keep_small=False)} of step time; at peak they would take "
          f"{fmt.pct(at_peak, keep_small=False)}: {fmt.pct(value, keep_small=False)} {UNIT} is lost to matmuls below peak"
          + (f" (they ran at {fmt.pct(at_peak / known, keep_small=False)} of peak on average)" if known > 0 else "")]
    by = ctx.a.totals.get("mfu_by_precision") or {}
    own = next(iter(by), None)
    if own in ("fp32", "tf32") and len(by) > 1:
        best, v = list(by.items())[-1]
        ev.append(f"an {own} run: its MFU is graded against the {own} peak; against the {best} tensor-core peak the same work is "
                  f"{fmt.pct(v, keep_small=False)} of peak: mixed precision is the first lever")
    ev += _folded(findings, ctx)
    lines, data = _gemm_lines(ctx)
    shown = lines or _matmul_ops(ctx)
    ev += shown
    acts = _activities(ctx)
    mm = acts.filter(pl.col("cls") == "matmul") if acts.height else acts
    tiny = mm.filter(pl.col("dur") < SHORT_KERNEL_US) if ctx.kernels.height else mm.head(0)
    if tiny.height:
        ev.append(f"{tiny.height} matmul kernels shorter than {SHORT_KERNEL_US:.0f} µs ({fmt.duration(tiny['dur'].sum())}): "
                  "small tiles that cannot fill the device")
    data["short_matmul_kernels"] = tiny.height
    phase = _by_phase(mm, ctx)
    if phase:
        ev.append(phase)
    record: list[str] = []
    h = ctx.a.hardware or {}
    if ctx.kernels.height == 0:
        ev.append("a CPU trace (or XLA:CPU): tensor-core dtypes and wave quantization cannot be told from it")
        record = _record(ctx, "device")
    elif h.get("source") == "--peak-tflops" or hw.lookup(h.get("name") or "") is None:
        ev.append("the hardware is not known (a bare peak was given): wave quantization and tensor-core dtypes cannot be told")
        record = _record(ctx, "hardware")
    elif not lines and not _jax(ctx):
        ev.append("no GEMM shape is recorded: which shapes run slowly cannot be told")
        record = _record(ctx, "shapes")
    if _conv_dominates(ctx):
        own = _remedies_of(findings)
        conv_remedies = CONV_REMEDIES[1:] if any(f["kind"] == "fp32_matmul" for f in findings) else CONV_REMEDIES  # said once
        said = _say(ctx, conv_remedies, CONV_REMEDIES_JAX)
        if (ctx.a.hardware or {}).get("precision") in ("bf16", "fp16", "fp8") and said and said[0] in (CONV_REMEDIES[0], CONV_REMEDIES_JAX[0]):
            said = said[1:] + said[:1]  # already in 16 bits: precision is not the first lever
        remedies = own + said
        return "Convolutions run below peak: layout, precision and channel counts", ev, remedies, data, record, bool(lines or shown)
    remedies = _remedies_of(findings) + _say(ctx, [
        "Shapes the tensor cores like: hidden, FFN, vocab and batch × sequence sizes in multiples of 64 (128 better)",
        ("bf16 or fp16 for the matmuls (torch.autocast), and TF32 for what stays fp32 "
        "(torch.set_float32_matmul_precision(\"high\"))"),
        "Larger matmuls: a larger batch per step, or fewer, fused GEMMs (torch.compile(mode=\"max-autotune\") picks tiles)",
    ], [
        "Shapes the matrix units like: feature, hidden and batch sizes in multiples of 128 (256 on newer TPUs)",
        "Compute in bfloat16 (flax dtype=jnp.bfloat16), and jax.default_matmul_precision for what stays float32",
        "A larger batch per device: small dots cannot fill the matrix units",
    ])
    return "Matmuls run below peak: shapes, dtypes and tiles", ev, remedies, data, record, bool(lines or shown)


def _from_finding(kind: str, title: str, what: str):
    """An entry that is one rule's item (communication, recompute), with the budget's number as its headline."""
    def entry(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
        own = [f for f in findings if f["kind"] == kind]
        rest = [f for f in findings if f["kind"] != kind]
        if own:
            it = own[0]
            head = [] if any(UNIT in e for e in it["evidence"]) else [f"{what} takes {fmt.pct(value, keep_small=False)} {UNIT}"]
            return (it["title"], head + it["evidence"] + _folded(rest, ctx), it["remedies"] + _remedies_of(rest), it["data"],
                    [], True)
        return (title, [f"{fmt.pct(value, keep_small=False)} {UNIT}: the trace holds no detail of it"], [], {},
                _record(ctx, "stack"), False)
    return entry


def _memcpy_exposed(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    mc = ctx.kernels.filter(pl.col("cls").is_in(["memcpy", "memset"])) if ctx.kernels.height else ctx.kernels
    ev = [f"copies and memsets with no compute beside them take {fmt.pct(value, keep_small=False)} {UNIT}"]
    ev += _top_names(mc, ctx, 3)
    data: dict[str, Any] = {}
    if mc.height and "bytes" in mc.columns and mc["bytes"].null_count() < mc.height:
        b = float(mc["bytes"].sum())
        t = float(mc["dur"].sum())
        data = {"bytes": b, "time_us": t}
        ev.append(f"{fmt.nbytes(b)} moved in {fmt.duration(t)} ({b / (t * 1e-6) / 1e9:.1f} GB/s)" if t else f"{fmt.nbytes(b)} moved")
    remedies = _say(ctx, [
        "Host-to-device copies: pin_memory=True in the DataLoader and .to(device, non_blocking=True), so the copy overlaps compute",
        "Device-to-host copies (.cpu(), .item(), .tolist()) once per step at most, or on a side stream",
        "Copies inside the model (.contiguous(), dtype casts, torch.cat): fuse them away (torch.compile) or keep one layout",
    ], [
        "Prefetch the next batch to the device (jax.device_put, or a prefetching iterator) while this step runs",
        ("Keep arrays on the device between steps: no jax.device_get / np.asarray inside the loop; donate buffers "
        "(jax.jit(..., donate_argnums=...)) so XLA does not copy them"),
    ])
    record = [] if mc.height else _record(ctx, "device")
    return "Memory copies stall compute: overlap or drop them", ev, remedies, data, record, mc.height > 0


def _matmul_flops_unknown(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    acts = _activities(ctx)
    mm = acts.filter((pl.col("cls") == "matmul") & pl.col("flops").is_null()) if acts.height else acts
    ev = [(f"matmul time whose FLOPs are unknown takes {fmt.pct(value, keep_small=False)} {UNIT}: how far below peak it "
          "ran cannot be told")]
    ev += _top_names(mm, ctx, 3)
    if ctx.a.ops.height == 0:
        ev.append("the trace holds device activity only: no op gives these kernels' shapes")
        record = _record(ctx, "device", "shapes")
    else:
        record = _record(ctx, "shapes")
    remedies = ["Once their FLOPs are known, the matmul_below_peak entry says which shapes and dtypes to change"]
    return "Matmul time of unknown FLOPs: record shapes to judge it", ev, remedies, {"kernels": mm.height}, record, False


def _extra_executed(ctx: _Ctx, value: float, findings: list[dict]) -> tuple:
    model = float(ctx.steps["model_flops"].sum())
    executed = float(ctx.steps["flops_executed"].fill_null(0).sum()) if "flops_executed" in ctx.steps.columns else 0.0
    recompute = float(ctx.steps["flops_recompute"].fill_null(0).sum()) if "flops_recompute" in ctx.steps.columns else 0.0
    ev = [(f"matmuls did {fmt.pct(value, keep_small=False)} {UNIT} of work the model's FLOP count does not hold: "
          f"{executed / 1e9:.1f} GFLOP executed, {recompute / 1e9:.1f} of them recompute, {model / 1e9:.1f} GFLOP of model")]
    remedies = _say(ctx, [
        ("Check the model description (--model, sequence length, vocabulary, layers): the executed matmuls may be right and the "
        "model FLOPs low"),
        "Padding: pack sequences or bucket by length, so the matmuls do not work on padding tokens",
        "Work outside the model's formula (an extra head, a loss projection, a second forward): drop what is not needed",
    ], [
        ("Check the model description (--model, sequence length, vocabulary, layers): the executed dots may be right and the "
        "model FLOPs low"),
        "Padding: pack sequences or bucket by length, so the dots do not work on padding tokens",
    ])
    return "Matmuls do more work than the model needs", ev, remedies, {"model_flops": model, "executed_flops": executed}, [], True


# One entry per loss term of the budget, in this order when two are equal (mfu is no loss; the mask credit is never positive).
ENTRIES = {
    "non_matmul": _non_matmul,
    "idle": _idle,
    "matmul_below_peak": _matmul_below_peak,
    "communication_exposed": _from_finding("communication", "Communication is exposed: overlap it with compute",
                                           "communication with no compute beside it"),
    "recompute": _from_finding("recompute", "Recompute costs time: checkpoint selectively", "recomputed work"),
    "memcpy_exposed": _memcpy_exposed,
    "matmul_flops_unknown": _matmul_flops_unknown,
    "extra_executed": _extra_executed,
}


def _entry(ctx: _Ctx, term: str, value: float, findings: list[dict]) -> dict[str, Any]:
    """The entry of one budget term: its value as the headline, the items that explain it folded in."""
    title, ev, remedies, data, record, known = ENTRIES[term](ctx, value, findings)
    kind = ENTRY_KIND.get(term, term)
    it = _item(ctx, kind, title, value * ctx.window, ev, _unique(remedies + record if known else record + remedies), data,
               share=value)
    it["term"] = term
    it["findings"] = [f for f in findings if f["kind"] != kind]
    it["cause_known"] = bool(known)
    it["record"] = record
    return it


RULES = (_host_bound, _memory_bound, _attention, _fp32_matmul, _communication, _recompute, _input_pipeline, _sync)


def advise(a: Analysis, exclude_steps=None, min_share: float = MIN_SHARE,
           term_share: float = BUDGET_MIN_SHARE) -> list[dict[str, Any]]:
    """Items of advice the trace supports, largest share of peak × step time first.

    Every loss-budget term of at least `term_share` is an entry headed by the term's value, the rules' items that
    explain it folded in (`findings`); the rules' items of smaller terms stand alone when they reach `min_share`.
    `exclude_steps`: steps left out; by default those the analysis' totals left out (asked, cut, the unbounded last).
    """
    if exclude_steps is None:
        exclude_steps = tuple((a.totals.get("step_count") or {}).get("excluded") or ())
    ctx = _context(a, exclude_steps)
    if ctx is None:
        return []
    found = [it for rule in RULES if (it := rule(ctx)) is not None and it["recoverable"] >= min_share]
    budget = ctx.budget or {}
    big = [t for t in ENTRIES if budget.get(t) is not None and budget[t] >= term_share]
    entries = [_entry(ctx, t, budget[t], sorted((f for f in found if f["term"] == t), key=lambda f: -f["recoverable"]))
               for t in big]
    alone = [f for f in found if f["term"] not in big]
    return sorted(entries + alone, key=lambda it: (-it["recoverable"], it["kind"]))
