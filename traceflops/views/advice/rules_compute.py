"""The rules of compute below its roof: memory_bound (kernels above their HBM floor), attention (an unfused
matmul → softmax → matmul chain) and fp32_matmul (fp32 matmuls where a faster tensor-core peak exists).

Their items explain part of the loss budget's non_matmul (memory_bound, attention) and matmul_below_peak
(fp32_matmul) terms.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core import fmt
from traceflops.core import hardware as hw
from traceflops.core.sections import AdviceItem
from traceflops.metrics.peak import TF32_RE
from traceflops.stages import timeline as tl
from traceflops.stages.link import by_row, nearest
from traceflops.views.advice.context import SHORT_KERNEL_US, TOP, Ctx, conv_dominates
from traceflops.views.advice.items import item, time_by
from traceflops.views.advice.wording import CONV_FUSE
from traceflops.views.gemm_shapes import first_tensor_dtype

SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
SOFTMAX_BWD_OPS = frozenset({"aten::_softmax_backward_data"})
ATTN_MATMULS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm"})
SDPA_MATH = frozenset({"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_attention_math_for_mps"})
FUSED_ATTENTION_RE = r"flash_attention|efficient_attention|cudnn_attention|fused_attention_overrideable"


def memory_bound(ctx: Ctx) -> AdviceItem | None:
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
        (
            f"{mb.height} memory-bound kernels (below the roofline ridge) ran {fmt.duration(dur)}; "
            f"{fmt.duration(rec)} ({fmt.pct(ctx.share(rec), keep_small=False)} of step time) of it is above their HBM "
            "floor (bytes / bandwidth)"
        ),
        (
            f"{short.height} of them are shorter than {SHORT_KERNEL_US:.0f} µs "
            f"({fmt.duration(float(short['dur'].sum()))}, "
            f"{fmt.duration(float(short['recoverable_us'].sum()))} above the floor)"
        ),
    ]
    top = (
        mb.group_by("name")
        .agg(
            pl.len().alias("n"),
            pl.col("dur").sum().alias("t"),
            pl.col("dur").median().alias("med"),
            pl.col("recoverable_us").sum().alias("r"),
            pl.col("achieved_bw_frac").median().alias("bw"),
            pl.col("cls").first(),
        )
        .sort(["r", "name"], descending=[True, False])
        .head(TOP)
    )
    for r in top.iter_rows(named=True):
        bw = f", median {fmt.pct(r['bw'], keep_small=False)} of HBM bandwidth" if r["bw"] is not None else ""
        ev.append(
            f"{fmt.named(r['name'], 70, '?')} ({r['cls']}): {r['n']}×, {fmt.duration(r['t'])}, median "
            f"{fmt.duration(r['med'])}{bw}, "
            f"{fmt.duration(r['r'])} above the floor"
        )
    remedies = [
        (
            CONV_FUSE
            if conv_dominates(ctx)
            else (
                "Fuse chains of elementwise and normalization ops (torch.compile, or fused kernels such as fused "
                "LayerNorm/RMSNorm and fused activations): the intermediates never go through HBM"
            )
        ),
        "A larger batch (or sequence) per kernel: small kernels cannot reach memory bandwidth",
    ]
    opt = float(mb.filter(pl.col("phase") == "optimizer")["recoverable_us"].sum())
    if opt >= 0.2 * rec and opt > 0:
        remedies.insert(
            1,
            f"The optimizer's kernels are {fmt.pct(opt / rec, keep_small=False)} of it: use a fused or foreach "
            "optimizer "
            "(e.g. torch.optim.AdamW(..., fused=True))",
        )
    data = {
        "kernels": mb.height,
        "time_us": dur,
        "above_floor_us": float(mb["recoverable_us"].sum()),
        "busy_us": busy,
        "short_kernels": short.height,
        "optimizer_us": opt,
    }
    return item(ctx, "memory_bound", "Memory-bound kernels run below bandwidth: fuse them", rec, ev, remedies, data)


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


def attention(ctx: Ctx) -> AdviceItem | None:
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
        if (
            _mm_out_last2(name_l[p], _dims(dims[p])) != score[-2:]
            or _mm_in_last2(name_l[q], _dims(dims[q])) != score[-2:]
        ):
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
        region_rows.append(
            rows_t[np.searchsorted(ts_t, ts[p], side="left") : np.searchsorted(ts_t, end[q], side="right")]
        )
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
        top_names = time_by(over, "name")
    else:
        # a CPU trace: the outermost ops between the two matmuls (the partition's other compute)
        is_op = (ops["cat"] == "cpu_op").fill_null(False).to_numpy()
        outer = is_op & ~np.where(parent >= 0, is_op[np.maximum(parent, 0)], False)
        dur = ops["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()
        between = np.zeros(ops.height, bool)
        for s, p, q, _ in blocks:
            rows_t, ts_t = by_tid[tid[s]]
            mid = rows_t[np.searchsorted(ts_t, end[p], side="left") : np.searchsorted(ts_t, ts[q], side="left")]
            between[mid] = True
        sel = between & outer & ~top_mm
        mm_us = float(sum(dur[p] + dur[q] for _, p, q, _ in blocks))
        over_us = float(dur[sel].sum())
        bwd_us = float(dur[bwd].sum()) if len(bwd) else 0.0
        top_names = time_by(pl.DataFrame({"name": names.filter(pl.Series(sel)), "dur": dur[sel]}), "name")
    rec = over_us + bwd_us
    if rec <= 0:
        return None

    n_math = sum(1 for s, *_ in blocks if math_anc[s] >= 0)
    fused = int(
        ops.filter(
            pl.col("name").str.contains(FUSED_ATTENTION_RE) & pl.col("ran") & pl.col("step").is_in(ctx.ids)
        ).height
    )
    common = max(shapes, key=lambda sh: sum(1 for b in blocks if b[3] == sh))
    ev = [
        f"{len(blocks)} attention blocks ran unfused as matmul → softmax → matmul, scores of shape {list(common)}"
        + (f" (and {len(shapes) - 1} other shapes)" if len(shapes) > 1 else ""),
        f"their scale / mask / softmax / dropout {'kernels' if device else 'ops'} took {fmt.duration(over_us)}"
        + (f" and softmax backward {fmt.duration(bwd_us)}" if bwd_us else "")
        + f" ({fmt.pct(ctx.share(rec), keep_small=False)} of step time); the score matmuls {fmt.duration(mm_us)}",
    ]
    for r in top_names.head(3).iter_rows(named=True):
        ev.append(f"{fmt.named(r['name'], 70, '?')}: {r['n']}×, {fmt.duration(r['t'])}")
    if n_math:
        ev.append(f"{n_math} of them are SDPA's math fallback ({min(SDPA_MATH)})")
    ev.append(
        f"fused SDPA ops (flash / memory-efficient / cuDNN) also ran {fused} times"
        if fused
        else "no fused SDPA op (flash / memory-efficient / cuDNN) ran"
    )
    remedies = []
    if n_math:
        remedies.append(
            "SDPA fell back to its math path: the fused kernels need fp16/bf16 inputs (flash), a supported head dim, "
            "and is_causal=True rather than a dense attn_mask where the mask is causal; check "
            "torch.nn.attention.sdpa_kernel settings"
        )
    if n_math < len(blocks):
        remedies += [
            (
                "Call torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...) instead of "
                "matmul + softmax + matmul: the flash / memory-efficient / cuDNN kernels never write the score matrix"
            ),
            'Hugging Face models: load with attn_implementation="sdpa" (or "flash_attention_2")',
        ]
    data = {
        "blocks": len(blocks),
        "math_fallback": n_math,
        "fused_sdpa_ops": fused,
        "non_matmul_us": over_us,
        "softmax_backward_us": bwd_us,
        "matmul_us": mm_us,
        "score_shapes": [list(s) for s in sorted(shapes)],
    }
    return item(ctx, "attention", "Attention is not on a fused kernel: use SDPA", rec, ev, remedies, data)


def fp32_matmul(ctx: Ctx) -> AdviceItem | None:
    h_info = ctx.a.hardware
    if h_info is None or h_info.precision == "tf32" or ctx.kernels.height == 0:
        return None
    h = hw.lookup(h_info.name or "")
    if h is None:
        return None
    fp32, tf32 = h.peak("fp32"), h.peak("tf32")
    half_name = max(("bf16", "fp16"), key=lambda p: h.peak(p) or 0.0)  # fp16 on Volta / Turing: no bf16 tensor cores
    half = h.peak(half_name)
    target, target_name = (tf32, "TF32") if tf32 and fp32 and tf32 > fp32 else (half, half_name)
    if not fp32 or not target or target <= fp32:
        return None
    mm = ctx.kernels.select("name", "dur", "flops", "matmul_row").filter(  # the columns read below only
        ctx.kernels["cls"] == "matmul"
    )
    ops = ctx.a.ops if "types" in ctx.a.ops.columns else ctx.a.ops.with_columns(types=pl.lit(None, pl.Utf8))
    at = by_row(ops, mm["matmul_row"], "dtype", "name", "types")  # the op at each kernel's row: a gather, no join
    mm = pl.concat([mm, at.rename({"dtype": "_dtype", "name": "_op", "types": "_types"})], how="horizontal")
    types = mm.filter(pl.col("_dtype").is_null() & pl.col("_types").is_not_null())["_types"].unique().to_list()
    if types:  # a backward convolution's first input is a size list: its dtype is its first tensor's
        first = pl.DataFrame(
            {"_types": types, "_t": [first_tensor_dtype(t) for t in types]}, schema={"_types": pl.Utf8, "_t": pl.Utf8}
        )
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
    op_names = (
        f32.group_by("_op")
        .agg(pl.col("dur").sum().alias("t"), pl.col("matmul_row").n_unique().alias("n"))
        .sort(["t", "_op"], descending=[True, False], nulls_last=True)
    )
    ev = [
        f"{calls} matmul-class calls with fp32 inputs ran {fmt.duration(t)} ({fmt.pct(ctx.share(t), keep_small=False)} "
        "of step time) on fp32 "
        f"(non-tensor-core) kernels" + (f" at {achieved / 1e12:.1f} TFLOP/s" if achieved else ""),
        (
            f"{h.name}: fp32 peak {fmt.tflops(fp32)}, TF32 {fmt.tflops(tf32)}, {half_name} {fmt.tflops(half)}; at the "
            "same fraction of the "
            f"{target_name} peak they would take {fmt.pct(fp32 / target, keep_small=False)} of that time"
        ),
    ]
    if achieved and half and half > fp32:
        ev.append(
            f"against the {half_name} tensor-core peak they ran at {fmt.pct(achieved / half, keep_small=False)} "
            f"(against their own fp32 peak {fmt.pct(achieved / fp32, keep_small=False)})"
        )
    for r in op_names.head(3).iter_rows(named=True):
        ev.append(f"{r['_op']}: {r['n']} calls, {fmt.duration(r['t'])}")
    remedies = []
    if half and half > fp32:  # autocast first: it reaches the faster peak
        dt = "torch.bfloat16" if half_name == "bf16" else "torch.float16 (with torch.amp.GradScaler)"
        remedies.append(
            f'Mixed precision first: torch.autocast(device_type="cuda", dtype={dt}) around the forward and loss '
            f"({half_name} tensor-core peak {fmt.tflops(half)}, {half / fp32:.0f}× fp32's)"
        )
    if tf32 and tf32 > fp32:
        conv = any("conv" in (n or "") for n in op_names["_op"].to_list())
        remedies.append(
            'torch.set_float32_matmul_precision("high") (or torch.backends.cuda.matmul.allow_tf32 = True): fp32 '
            "matmuls run on TF32 tensor cores, no model change"
            + ("; convolutions follow torch.backends.cudnn.allow_tf32" if conv else "")
        )
    data = {
        "calls": calls,
        "time_us": t,
        "flops": flops,
        "target": target_name,
        "peak_fp32": fp32,
        "peak_target": target,
        "peak_tensor": half,
        "tensor": half_name,
    }
    return item(ctx, "fp32_matmul", f"fp32 matmuls where {target_name} would do", rec, ev, remedies, data)
