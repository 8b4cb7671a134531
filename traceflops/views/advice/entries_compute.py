"""The two compute entries of the loss budget: non_matmul (the kernels or ops that take it, fusion candidates,
layout transposes) and matmul_below_peak (GEMM shapes, dtypes, wave quantization, small tiles).

The largest and most detailed entries, each with the helpers only it uses (`short_runs`, the GEMM-shape lines).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceflops.core import fmt
from traceflops.core import hardware as hw
from traceflops.core.sections import AdviceItem
from traceflops.core.trace import name_matches
from traceflops.stages import timeline as tl
from traceflops.stages.count import LAYOUT_KERNEL_RE
from traceflops.stages.link import nearest
from traceflops.views.advice.context import (
    SHORT_KERNEL_US,
    TOP,
    UNIT,
    Ctx,
    activities,
    conv_dominates,
    is_jax,
)
from traceflops.views.advice.items import by_phase, folded, remedies_of, time_by, top_names
from traceflops.views.advice.wording import (
    CONV_FUSE,
    CONV_REMEDIES,
    CONV_REMEDIES_JAX,
    PASS_WORDS,
    say,
    to_record,
)
from traceflops.views.gemm_shapes import GEMM_TIME_MATTERS

FUSE_GAP_US = 5.0  # short kernels this close on one stream run back to back
FUSE_RUN = 3  # so many short non-matmul kernels in a row are one fusion candidate
LAYOUT_SHARE = 0.1  # layout transposes this much of the non-matmul time are worth their own remedy


def _cpu_other(ctx: Ctx) -> pl.DataFrame:
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
    cpu = (
        ops.with_row_index("_i")
        .join(own, on="_i", how="inner")
        .filter(pl.col("step").is_in(ctx.ids) & (pl.col("_own") > 0))
    )
    device = pl.col("device").cast(pl.Int64) if "device" in cpu.columns else pl.lit(None, pl.Int64)
    return tl.on_devices(
        cpu.select(
            "name",
            device.alias("device"),
            pl.col("tid").alias("stream"),
            "ts",
            pl.col("_own").alias("dur"),
            pl.lit("other_compute").alias("cls"),
            "phase",
            "step",
        ),
        [ctx.device],
    )


def short_runs(
    acts: pl.DataFrame, short_us: float = SHORT_KERNEL_US, gap_us: float = FUSE_GAP_US, min_run: int = FUSE_RUN
) -> pl.DataFrame:
    """Runs of at least `min_run` short non-matmul activities back to back on one stream: what a fuser merges.

    Columns: run, n (activities), t (their time, µs), names (distinct, most frequent first).
    """
    out: dict[str, pl.DataType | type[pl.DataType]] = {
        "run": pl.UInt32,
        "n": pl.UInt32,
        "t": pl.Float64,
        "names": pl.List(pl.Utf8),
    }
    if acts.height == 0:
        return pl.DataFrame(schema=out)
    lanes = [c for c in ("device", "stream") if c in acts.columns]
    # Only the columns the runs need, sorted (not the kernels' every column: a million kernels' copy is hundreds of MB);
    # the names of the short ones are gathered afterwards by row.
    s = (
        acts.select(*lanes, "ts", "dur", "cls")
        .with_row_index("_row")
        .filter(pl.col("dur").is_not_null())
        .sort([*lanes, "ts"], nulls_last=True)
        .with_columns(_short=((pl.col("cls") == "other_compute") & (pl.col("dur") < short_us)).fill_null(False))
    )
    same = pl.int_range(pl.len()) > 0
    for c in lanes:
        same = same & pl.col(c).eq_missing(pl.col(c).shift(1))
    close = ((pl.col("ts") - (pl.col("ts") + pl.col("dur")).shift(1)) <= gap_us).fill_null(False)
    goes_on = pl.col("_short") & pl.col("_short").shift(1).fill_null(False) & same & close
    short = s.with_columns(run=(~goes_on).cast(pl.UInt32).cum_sum()).filter(pl.col("_short"))
    runs = (
        short.group_by("run")
        .agg(pl.len().alias("n"), pl.col("dur").sum().cast(pl.Float64).alias("t"))
        .filter(pl.col("n") >= min_run)
        .sort(["t", "run"], descending=[True, False])
    )
    # The names of the runs kept only, most frequent first (counted per (run, name): no per-group value_counts).
    kept = short.join(runs.select("run"), on="run", how="semi")
    names = (
        kept.with_columns(name=acts["name"].gather(kept["_row"]))
        .group_by("run", "name")
        .agg(pl.len().alias("_k"))
        .sort(["run", "_k", "name"], descending=[False, True, False])
        .group_by("run", maintain_order=True)
        .agg(pl.col("name").alias("names"))
    )
    runs = runs.join(names, on="run", how="left", maintain_order="left")
    return runs.select(list(out)).cast(out)  # type: ignore[arg-type]  # polars stubs: a str-keyed dict is a schema (Mapping's key is invariant)


def non_matmul(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    device = ctx.kernels.height > 0
    if device or ctx.a.ops.height == 0:
        read = [c for c in ("name", "dur", "phase", "device", "stream", "ts", "cls") if c in ctx.kernels.columns]
        # The columns read below only (not the kernels' every column): a filter copies each column it keeps.
        other = ctx.kernels.select(read).filter(ctx.kernels["cls"] == "other_compute") if device else ctx.kernels
    else:
        other = _cpu_other(ctx)
    what = "kernels" if device else "ops"
    t_other = float(other["dur"].sum()) if other.height else 0.0
    ev = [
        f"non-matmul compute (elementwise, normalization, reductions, softmax, copies) takes "
        f"{fmt.pct(value, keep_small=False)} {UNIT}: {other.height} {what}, {fmt.duration(t_other)} of time"
        + (
            ""
            if device
            else f" inside ops (the rest of the {fmt.duration(value * ctx.window)} in autograd nodes and "
            "wrappers around them)"
        )
    ]
    ev += folded(findings, ctx)
    ev += top_names(other, ctx, 3)
    runs = short_runs(other)
    data: dict[str, Any] = {
        "activities": other.height,
        "time_us": float(other["dur"].sum()) if other.height else 0.0,
        "fusion_runs": runs.height,
        "fusion_run_activities": int(runs["n"].sum()) if runs.height else 0,
        "top": other.group_by("name")
        .agg(pl.col("dur").sum().alias("t"))
        .sort(["t", "name"], descending=[True, False])
        .head(TOP)["name"]
        .to_list()
        if other.height
        else [],
    }
    if runs.height:
        names = (
            pl.Series("name", [n for ns in runs["names"].to_list() for n in ns[:3]])
            .value_counts(sort=True)
            .head(3)["name"]
            .to_list()
        )
        ev.append(
            f"fusion candidates: {runs.height} runs of {FUSE_RUN} or more {what} shorter than {SHORT_KERNEL_US:.0f} µs "
            "back to back "
            f"({int(runs['n'].sum())} {what}, {fmt.duration(float(runs['t'].sum()))}), e.g. "
            + ", ".join(fmt.named(n, 50, "?") for n in names)
        )
        data["fusion_names"] = names
    phase = by_phase(other, ctx)
    if phase:
        ev.append(phase)
    opt = (
        float(other.filter(pl.col("phase") == "optimizer")["dur"].sum())
        if other.height and "phase" in other.columns
        else 0.0
    )
    total = float(other["dur"].sum()) if other.height else 0.0
    layout = other.filter(name_matches(other["name"], LAYOUT_KERNEL_RE)) if device and other.height else other.clear()
    data["layout_transpose_us"] = t_layout = float(layout["dur"].sum()) if layout.height else 0.0
    layout_matters = total > 0 and t_layout >= LAYOUT_SHARE * total
    if layout_matters:
        ev.append(
            f"{layout.height} layout transposes around convolutions (NCHW to NHWC and back) take "
            f"{fmt.duration(t_layout)}, "
            f"{fmt.pct(t_layout / total, keep_small=False)} of it"
        )
    remedies = remedies_of(findings)
    if layout_matters:
        remedies += say(
            ctx,
            [
                (
                    "channels_last: model.to(memory_format=torch.channels_last) and the same for its inputs, so cuDNN "
                    "runs the convolutions in NHWC without transposing (tensor cores want NHWC, above all in fp16/bf16)"
                )
            ],
            [
                (
                    "The convolutions are transposed to and from the layout cuDNN runs: give the convolutions NHWC "
                    "(dimension_numbers=('NHWC', 'HWIO', 'NHWC')) so XLA has nothing to transpose"
                )
            ],
        )
    remedies += say(
        ctx,
        [
            (
                "torch.compile the model (or its hot blocks): Inductor fuses chains of elementwise and normalization "
                "ops into one kernel, "
                "so the intermediates never go through memory"
            ),
            CONV_FUSE
            if conv_dominates(ctx)
            else (
                "Fused kernels for the common chains: fused LayerNorm/RMSNorm, fused activations (e.g. Liger, Apex, "
                "Transformer Engine), "
                "SDPA for attention"
            ),
        ],
        [
            (
                "Keep the whole step in one jax.jit so XLA fuses the elementwise chains; host callbacks and jit "
                "boundaries split "
                "fusions: check the optimized HLO (XLA_FLAGS=--xla_dump_to=DIR) for unfused ops"
            ),
            "Fused attention (jax.nn.dot_product_attention, or a Pallas / cuDNN kernel) instead of einsum + softmax + "
            "einsum",
        ],
    )
    if total and opt >= 0.2 * total:
        remedies.insert(
            0,
            say(
                ctx,
                [
                    (
                        f"The optimizer is {fmt.pct(opt / total, keep_small=False)} of it: a fused or foreach "
                        "optimizer "
                        "(torch.optim.AdamW(..., fused=True))"
                    )
                ],
                [
                    (
                        f"The optimizer is {fmt.pct(opt / total, keep_small=False)} of it: apply the optax update "
                        "inside "
                        "the same jit as the gradient, so its elementwise chain fuses"
                    )
                ],
            )[0],
        )
    record: list[str] = []
    if not device and not is_jax(ctx):
        record = to_record(ctx, "device")
        ev.append(
            "a CPU trace: which of these ops would be memory-bound kernels on the device, and which fuse, cannot be "
            "told from it"
        )
    elif device and ("bound" not in ctx.kernels.columns or ctx.kernels["bound"].null_count() == ctx.kernels.height):
        record = to_record(ctx, "hardware")
        ev.append("the hardware is not known (a bare peak was given): which kernels are memory-bound cannot be told")
    return "Non-matmul compute: fuse the small kernels", ev, remedies, data, record, other.height > 0


def _gemm_lines(ctx: Ctx) -> tuple[list[str], dict[str, Any]]:
    """The GEMM shapes that took the most matmul time, their throughput and wave quantization (device traces)."""
    g = ctx.a.by_gemm_shape
    peak1 = ctx.a.hardware.peak_flops if ctx.a.hardware else None
    if g is None or g.height == 0 or float(g["time_us"].sum()) <= 0:
        return [], {}
    ev = []
    conv = pl.col("conv").is_not_null() if "conv" in g.columns else pl.lit(False)
    conv_share = float(g.filter(conv)["share"].fill_null(0.0).sum())
    if conv_share >= GEMM_TIME_MATTERS:
        passes = (
            g.filter(conv).group_by("conv").agg(pl.col("share").sum()).sort(["share", "conv"], descending=[True, False])
        )
        ev.append(
            f"convolutions take {fmt.pct(conv_share, keep_small=False)} of matmul time ("
            + ", ".join(f"{PASS_WORDS.get(c, c)} {fmt.pct(v, keep_small=False)}" for c, v in passes.iter_rows())
            + "); each is shown as its implicit GEMM: M = batch × output height × width, N = output channels, "
            "K = input channels × kernel height × width"
        )
    for r in g.filter(pl.col("time_us") > 0).head(3).iter_rows(named=True):
        dims = f"{r['M']}×{r['N']}×{r['K']}" + (f" ×{r['batch']}" if r["batch"] > 1 else "")
        rate = (
            f", {r['tflops']:.1f} TFLOP/s"
            + (f" ({fmt.pct(r['tflops'] * 1e12 / peak1, keep_small=False)} of peak)" if peak1 else "")
            if r["tflops"] is not None
            else ""
        )
        what = f"convolution {PASS_WORDS.get(r['conv'], r['conv'])}, implicit GEMM" if r.get("conv") else "GEMM"
        if r.get("conv") and peak1 and r["tflops"] is not None and r["tflops"] * 1e12 > peak1:
            rate += (
                ": above peak, as counted: a Winograd or FFT algorithm does fewer multiplications than the direct "
                "convolution"
            )
        ev.append(
            f"{what} M×N×K {dims} ({r['dtype'] or '?'}): {r['count']} calls, {fmt.duration(r['time_us'])} "
            f"({fmt.pct(r['share'], keep_small=False)} of matmul time){rate}"
        )
    by_dtype = time_by(g, "dtype", of="time_us").select("dtype", pl.col("t").alias("time_us"))
    tot = float(by_dtype["time_us"].sum())
    by_dtype = by_dtype.filter(pl.col("time_us") >= GEMM_TIME_MATTERS * tot) if tot else by_dtype
    if by_dtype.height > 1 or (by_dtype.height == 1 and by_dtype["dtype"][0] == "fp32"):
        ev.append(
            "matmul time by dtype: "
            + ", ".join(f"{d or '?'} {fmt.pct(t / tot, keep_small=False)}" for d, t in by_dtype.iter_rows())
        )
    waves = g.filter(pl.col("wave_hint").fill_null(False))
    if waves.height:
        ev.append(
            f"wave quantization: {waves.height} shapes ({fmt.pct(waves['share'].sum(), keep_small=False)} of matmul "
            "time) leave "
            f"the last wave under half full, e.g. {waves['hint'][0]}"
        )
    small = g.filter(pl.col("waves").is_not_null() & (pl.col("waves") < 1) & (pl.col("share") >= GEMM_TIME_MATTERS))
    if small.height:
        ev.append(
            f"{small.height} shapes ({fmt.pct(small['share'].sum(), keep_small=False)} of matmul time) have fewer "
            "output "
            "tiles than the device has SMs: too small to fill it"
        )
    return ev, {
        "wave_hint_shapes": waves.height,
        "small_shapes": small.height,
        "dtypes": {str(d): float(t) for d, t in by_dtype.iter_rows()},
        "conv_share": conv_share,
    }


def _matmul_ops(ctx: Ctx) -> list[str]:
    """The matmul ops (a CPU trace) or kernels (XLA) that took the most time, with their achieved rate."""
    acts = activities(ctx)
    mm = acts.filter(pl.col("cls") == "matmul") if acts.height else acts
    if mm.height == 0:
        return []
    if (
        ctx.kernels.height == 0 and not is_jax(ctx) and "dims" in ctx.a.ops.columns
    ):  # a CPU trace: each op with its shapes
        ops = ctx.a.ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("step").is_in(ctx.ids))
        mm = ops.with_columns(name=pl.col("name") + pl.lit(" ") + pl.col("dims").fill_null("[?]"))
    top = (
        mm.group_by("name")
        .agg(
            pl.len().alias("n"),
            pl.col("dur").sum().alias("t"),
            pl.col("flops").cast(pl.Float64).sum().alias("f"),
            pl.col("flops").null_count().alias("u"),
        )
        .sort(["t", "name"], descending=[True, False])
        .head(3)
    )
    per = ctx.a.hardware.peak_flops if ctx.a.hardware else None  # one device's: these ops ran on one
    out = []
    for r in top.iter_rows(named=True):
        rate = r["f"] / (r["t"] * 1e-6) if r["t"] and r["f"] and not r["u"] else None
        out.append(
            f"{fmt.named(r['name'], 90, '?')}: {r['n']}×, {fmt.duration(r['t'])}"
            + (
                f", {fmt.si(rate, 'FLOP/s')}" + (f" ({fmt.pct(rate / per, keep_small=False)} of peak)" if per else "")
                if rate
                else ""
            )
        )
    return out


def matmul_below_peak(ctx: Ctx, value: float, findings: list[AdviceItem]) -> tuple:
    known = ctx.share(ctx.time.get("matmul_known", 0.0))
    at_peak = known - value
    ev = [
        f"matmuls with known FLOPs ran {fmt.pct(known, keep_small=False)} of step time; at peak they would take "
        f"{fmt.pct(at_peak, keep_small=False)}: {fmt.pct(value, keep_small=False)} {UNIT} is lost to matmuls below peak"
        + (f" (they ran at {fmt.pct(at_peak / known, keep_small=False)} of peak on average)" if known > 0 else "")
    ]
    by = ctx.a.totals.mfu_by_precision or {}  # UNSET or None: no other peak
    own = next(iter(by), None)
    if own in ("fp32", "tf32") and len(by) > 1:
        best, v = list(by.items())[-1]
        ev.append(
            f"{fmt.a_run(own)}: its MFU is graded against the {own} peak; against the {best} tensor-core peak the same "
            "work is "
            f"{fmt.pct(v, keep_small=False)} of peak: mixed precision is the first lever"
        )
    ev += folded(findings, ctx)
    lines, data = _gemm_lines(ctx)
    shown = lines or _matmul_ops(ctx)
    ev += shown
    acts = activities(ctx)
    mm = acts.filter(pl.col("cls") == "matmul") if acts.height else acts
    tiny = mm.filter(pl.col("dur") < SHORT_KERNEL_US) if ctx.kernels.height else mm.head(0)
    if tiny.height:
        ev.append(
            f"{tiny.height} matmul kernels shorter than {SHORT_KERNEL_US:.0f} µs "
            f"({fmt.duration(float(tiny['dur'].sum()))}): "
            "small tiles that cannot fill the device"
        )
    data["short_matmul_kernels"] = tiny.height
    phase = by_phase(mm, ctx)
    if phase:
        ev.append(phase)
    record: list[str] = []
    h = ctx.a.hardware
    if ctx.kernels.height == 0:
        ev.append("a CPU trace (or XLA:CPU): tensor-core dtypes and wave quantization cannot be told from it")
        record = to_record(ctx, "device")
    elif h is None or h.source == "--peak-tflops" or hw.lookup(h.name or "") is None:
        ev.append(
            "the hardware is not known (a bare peak was given): wave quantization and tensor-core dtypes cannot be told"
        )
        record = to_record(ctx, "hardware")
    elif not lines and not is_jax(ctx):
        ev.append("no GEMM shape is recorded: which shapes run slowly cannot be told")
        record = to_record(ctx, "shapes")
    if conv_dominates(ctx):
        own_remedies = remedies_of(findings)
        conv_remedies = (
            CONV_REMEDIES[1:] if any(f.kind == "fp32_matmul" for f in findings) else CONV_REMEDIES
        )  # said once
        said = say(ctx, conv_remedies, CONV_REMEDIES_JAX)
        if (
            h is not None
            and h.precision in ("bf16", "fp16", "fp8")
            and said
            and said[0] in (CONV_REMEDIES[0], CONV_REMEDIES_JAX[0])
        ):
            said = said[1:] + said[:1]  # already in 16 bits: precision is not the first lever
        remedies = own_remedies + said
        return (
            "Convolutions run below peak: layout, precision and channel counts",
            ev,
            remedies,
            data,
            record,
            bool(lines or shown),
        )
    remedies = remedies_of(findings) + say(
        ctx,
        [
            "Shapes the tensor cores like: hidden, FFN, vocab and batch × sequence sizes in multiples of 64 (128 "
            "better)",
            (
                "bf16 or fp16 for the matmuls (torch.autocast), and TF32 for what stays fp32 "
                '(torch.set_float32_matmul_precision("high"))'
            ),
            'Larger matmuls: a larger batch per step, or fewer, fused GEMMs (torch.compile(mode="max-autotune") picks '
            "tiles)",
        ],
        [
            "Shapes the matrix units like: feature, hidden and batch sizes in multiples of 128 (256 on newer TPUs)",
            "Compute in bfloat16 (flax dtype=jnp.bfloat16), and jax.default_matmul_precision for what stays float32",
            "A larger batch per device: small dots cannot fill the matrix units",
        ],
    )
    return "Matmuls run below peak: shapes, dtypes and tiles", ev, remedies, data, record, bool(lines or shown)
