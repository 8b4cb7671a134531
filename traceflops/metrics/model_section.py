"""The report's model section: model FLOPs per step from a description (PaLM) or from the trace, tokens per step, the
MFU band."""

from __future__ import annotations

import math
from dataclasses import replace

import orjson
import polars as pl
from msgspec import UNSET

from traceflops.core import fmt, sections
from traceflops.core import hardware as hw
from traceflops.core.results import ModelOptions
from traceflops.core.sections import Hardware, ModelPart, ModelSection, Totals
from traceflops.flops import model as mf


def _input_lookups(ops: pl.DataFrame) -> list[tuple[int, list[int]]]:
    """(step, index shape) of each lookup in the input embedding.

    The input embedding is the forward `aten::embedding` table looked up with the
    most indices (the token ids: a learned position table may be larger than a
    small vocabulary, but is looked up once per position, not per token); a tie
    goes to the larger table.
    """
    emb = ops.filter(
        (pl.col("name") == "aten::embedding") & pl.col("dims").is_not_null() & (pl.col("phase") == "forward")
    )
    by_table: dict[int, list[tuple[int, list[int]]]] = {}
    for dims, step in emb.select("dims", "step").iter_rows():
        d = orjson.loads(dims)
        if len(d) >= 2 and _shape(d[0]) and len(d[0]) == 2 and _shape(d[1]):
            by_table.setdefault(d[0][0], []).append((step, d[1]))
    if not by_table:
        return []
    vocab = max(by_table, key=lambda v: (sum(math.prod(shape) for _, shape in by_table[v]), v))
    return by_table[vocab]


def _shape(x) -> bool:
    """A plausible recorded tensor shape: a non-empty list of dimensions, each an int below 2^40 (exact products, no
    wrap)."""
    return (
        isinstance(x, list)
        and bool(x)
        and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 40 for n in x)
    )


def infer_tokens(lookups: list[tuple[int, list[int]]]) -> int | None:
    """Tokens per step from the input embedding's index shapes (`_input_lookups`)."""
    per_step: dict[int, int] = {}
    for step, shape in lookups:
        per_step[step] = per_step.get(step, 0) + math.prod(shape)
    return max(per_step.values()) if per_step else None


def infer_seq_len(lookups: list[tuple[int, list[int]]]) -> int | None:
    """The sequence length the trace ran: the last dimension of the input embedding's [batch, T] index shape."""
    lengths = {int(shape[-1]) for _, shape in lookups if len(shape) >= 2}
    return max(lengths) if lengths else None


_SDPA_RE = r"scaled_dot_product"  # [batch, heads, T, head_dim] query: the attention ops of torch's SDPA family


def infer_seq_len_from_attention(ops: pl.DataFrame, head_dim: int | None) -> int | None:
    """T from the forward attention when no embedding lookup shows it (compiled: Inductor fuses the lookup away).

    An SDPA-family op's query is [batch, heads, T, head_dim]; attention written as
    matmuls runs Q·Kᵀ as a `bmm` of [batch·heads, T, head_dim] by [batch·heads,
    head_dim, S]. The longest query seen is T.
    """
    fwd = ops.filter(pl.col("matmul") & (pl.col("phase") == "forward") & pl.col("dims").is_not_null())
    sdpa = fwd.filter(pl.col("name").str.contains(_SDPA_RE)).select("dims").unique()
    lengths = set()
    for (dims,) in sdpa.iter_rows():
        d = orjson.loads(dims)
        if d and _shape(d[0]) and len(d[0]) == 4 and (head_dim is None or d[0][3] == head_dim):
            lengths.add(d[0][2])
    if not lengths and head_dim:
        for (dims,) in fwd.filter(pl.col("name") == "aten::bmm").select("dims").unique().iter_rows():
            d = orjson.loads(dims)
            if (
                len(d) >= 2
                and _shape(d[0])
                and _shape(d[1])
                and len(d[0]) == len(d[1]) == 3
                and d[0][0] == d[1][0]
                and d[0][2] == d[1][1] == head_dim
                and d[1][2] == d[0][1]
            ):
                lengths.add(d[0][1])  # Q·Kᵀ of self-attention: S = T
    return max(lengths) if lengths else None


def resolve_seq_len(spec, seen: int | None, warnings: list[str]):
    """T from --seq-len, else the one the trace ran (`seen`), and only as a last resort the config's (with a
    warning)."""
    if spec.seq_len_source == "flag":
        if seen is not None and seen != spec.seq_len:
            warnings.append(
                f"model T = {spec.seq_len} as given, but the trace's input sequences are {seen} tokens long"
            )
        return spec
    if seen is not None:
        return replace(spec, seq_len=seen, seq_len_source="trace")
    warnings.append(
        f"model T = {spec.seq_len} is the config's maximum context (the trace does not show the sequence "
        "length): give --seq-len"
    )
    return spec


def weight_shape(name: str, dims) -> tuple[int, int] | None:
    """The 2-D operand of a GEMM op (its weight, as recorded), as an unordered pair; None when there is none."""
    d = orjson.loads(dims) if isinstance(dims, str) else dims
    two = [x for x in (d or []) if isinstance(x, list) and len(x) == 2]
    if not two:
        return None
    w = two[1] if name == "aten::addmm" and len(two) >= 2 else two[-1]
    return (min(w), max(w))


def output_shape(name: str, dims) -> tuple[int, int] | None:
    """A 2-D GEMM's output [M, N] from its last two 2-D operands ([M, K] x [K, N]), as an unordered pair: a weight
    gradient's (dY^T X) is its weight's shape though neither operand is."""
    d = orjson.loads(dims) if isinstance(dims, str) else dims
    two = [x for x in (d or []) if isinstance(x, list) and len(x) == 2]
    if len(two) < 2 or name not in ("aten::mm", "aten::addmm"):
        return None
    a, b = two[-2], two[-1]
    return (min(a[0], b[1]), max(a[0], b[1]))


def by_part(spec, ops: pl.DataFrame, mode: str, tokens: float | None, steps: int) -> list[ModelPart] | None:
    """Each part of N (attention, MLP, LM head) against the GEMMs seen in the trace with that part's weight shapes.

    Per step: the model's FLOPs of the part (2 or 6 × its weights × tokens) and the
    trace's FLOPs of GEMMs whose 2-D operand has one of the part's shapes (the
    forward, or forward + backward in training), and in the backward of GEMMs
    whose output has it (the weight gradients). A part the step did not run
    shows 0; a frozen part's training FLOPs are 2/3 of its 6·N·tokens.
    """
    if not spec.part_shapes or tokens is None or steps <= 0:
        return None
    phases = ["forward"] if mode == "inference" else ["forward", "backward"]
    work = ops.filter(
        pl.col("matmul")
        & pl.col("ran")
        & pl.col("phase").is_in(phases)
        & pl.col("dims").is_not_null()
        & (pl.col("step") >= 0)
    )
    shape_of: dict[tuple[int, int] | None, str] = {}  # (looked up with None: a shape that does not fit)
    for which in ("lm_head", "mlp", "attention"):  # first match wins: the LM head's shape is the most distinctive
        for o, i in spec.part_shapes.get(which, ()):
            shape_of.setdefault((min(o, i), max(o, i)), which)
    seen: dict[str, float] = {}
    count: dict[str, int] = {}
    shapes = work.group_by("name", "dims", "phase").agg(
        pl.col("flops").sum(), pl.len().alias("n")
    )  # a few distinct shapes
    for name, dims, phase, flops, n in shapes.iter_rows():
        part = shape_of.get(weight_shape(name, dims))
        if part is None and phase == "backward":
            part = shape_of.get(output_shape(name, dims))
        if part is not None:
            seen[part] = seen.get(part, 0.0) + float(flops or 0)
            count[part] = count.get(part, 0) + n
    mult = 2 if mode == "inference" else 6
    return [
        ModelPart(
            part=part,
            params=spec.breakdown.get(part),
            model_flops_per_step=mult * spec.breakdown[part] * tokens,
            trace_flops_per_step=seen.get(part, 0.0) / steps,
            gemms_per_step=count.get(part, 0) / steps,
        )
        for part in ("attention", "mlp", "lm_head")
        if part in spec.part_shapes and spec.breakdown.get(part)
    ]


SHORTFALL = 0.05  # model FLOPs this far above what the trace executed name a cause
FROZEN_TOLERANCE = 0.03  # a part whose executed / model FLOPs are this near 2/3 ran no weight gradients


def frozen_parts(model: ModelSection | None) -> list[str]:
    """The parts of a training run whose traced FLOPs are 2/3 of their 6·N·tokens: forward and data gradient, no
    weight gradient (frozen weights: LoRA / peft adapters, a frozen base)."""
    if model is None or model.mode != "training":
        return []
    return [
        p.part
        for p in model.by_part or []
        if p.part is not None
        and p.model_flops_per_step
        and p.trace_flops_per_step is not None
        and abs(p.trace_flops_per_step / p.model_flops_per_step - 2 / 3) <= FROZEN_TOLERANCE
    ]


def shortfall_warnings(model: ModelSection, steps: pl.DataFrame) -> list[str]:
    """When the model's FLOPs per step exceed the forward + backward FLOPs the trace executed, the likely cause (a
    model section from a description: a trace-derived one has no share of its own)."""
    share = model.flops_per_step_device
    use = steps.filter(pl.col("step") >= 0)
    if share is None or share is UNSET or use.height == 0:
        return []
    executed = float((use["flops_forward"] + use["flops_backward"]).mean())  # type: ignore[arg-type]  # polars stubs: a mean
    if executed <= 0 or share <= executed * (1 + SHORTFALL):
        return []
    parts = model.by_part or []
    missing = [p.part for p in parts if p.trace_flops_per_step == 0 and p.part is not None]
    frozen = frozen_parts(model)
    head = (
        f"model FLOPs per step ({share:.4g}) exceed the forward + backward FLOPs the trace executed ({executed:.4g}) "
        f"by {share / executed - 1:.0%}"
    )
    if missing:
        return [
            f"{head}: the step did not run the model's {', '.join(missing)} GEMMs on every token "
            "(e.g. an inference prefill that keeps only the last position's logits); see model.by_part"
        ]
    if frozen:
        return [
            (
                f"{head}: the backward ran no weight-gradient GEMMs for the model's {', '.join(frozen)} weights "
                "(the trace executed 2/3 of 6·N·tokens for them: forward and data gradient only): frozen weights, "
                "e.g. LoRA / peft adapters or a frozen base model. 6N counts weight gradients that were not computed, "
                "so MFU above HFU is expected here, not a counting error; see model.by_part"
            )
        ]
    return [
        f"{head}: check T ({model.seq_len}, {model.seq_len_source}), the tokens per step "
        f"({model.tokens_per_step}, {model.tokens_source}) and the world size against the trace; see model.by_part"
    ]


def model_section(opt: ModelOptions, ops, steps, mode, world, warnings):
    """Model FLOPs per step for this trace's device (its share of a job's global tokens)."""
    if opt.spec is not None:
        lookups = _input_lookups(ops)
        seen = infer_seq_len(lookups)
        if seen is None:
            seen = infer_seq_len_from_attention(ops, opt.spec.head_dim)
        spec = resolve_seq_len(opt.spec, seen, warnings)
        tokens = opt.tokens_per_step
        tokens_source = "flag"
        if tokens is None:
            inferred = infer_tokens(lookups)
            if inferred is not None:
                tokens = inferred * world  # the trace shows one rank's batch
                tokens_source = "inferred from the input embedding's shape"
        if tokens is None:
            warnings.append("tokens per step unknown: give --tokens-per-step (global) to get MFU")
        m = mf.model_flops(spec, mode, tokens)
        share = None if m.per_step is None else m.per_step / world
        share_na = None if m.per_step_no_attention is None else m.per_step_no_attention / world
        parts = by_part(
            spec, ops, mode, None if share is None else share / m.per_token, steps.filter(pl.col("step") >= 0).height
        )
        model = ModelSection(
            source=spec.source,
            mode=mode,
            seq_len=spec.seq_len,
            seq_len_source=spec.seq_len_source,
            flops_per_token=m.per_token,
            flops_per_token_no_attention=m.per_token_no_attention,
            flops_per_token_causal=m.per_token_causal,
            tokens_per_step=tokens,
            tokens_source=tokens_source,
            flops_per_step=m.per_step,
            flops_per_step_no_attention=m.per_step_no_attention,
            flops_per_step_causal=m.per_step_causal,
            flops_per_step_device=share,
            params_matmul=spec.params_matmul,
            counted=dict(spec.breakdown),
            labels=dict(m.labels),
            notes=list(spec.notes),
            by_part=parts,
            band=None,
            band_caveat=mf.BAND_CAVEAT,
        )
        warnings += shortfall_warnings(model, steps)
        return model, pl.lit(share, pl.Float64), pl.lit(share_na, pl.Float64)
    # Trace-derived: forward + backward matmul FLOPs of model ops.
    known = pl.col("flops_forward") + pl.col("flops_backward")
    per = pl.when((known == 0) & (pl.col("flops_unknown_count") > 0)).then(None).otherwise(known)
    no_attn = per - pl.col("attention_model_flops")
    model = ModelSection(
        source="trace",
        mode=mode,
        flops_per_step=None,
        flops_per_step_no_attention=None,
        note="model FLOPs derived from the trace: forward + backward matmul FLOPs (no recompute, no optimizer); see "
        "flops_coverage",
        band=None,
        band_caveat=mf.BAND_CAVEAT,
    )
    return model, per.cast(pl.Float64), no_attn.cast(pl.Float64)


def known_peak(hardware: Hardware | None) -> bool:
    """Whether the peak is a known device's (the hardware table's), not one given with --peak-tflops: a band graded
    against an arbitrary peak says nothing."""
    return hardware is not None and hardware.source != "--peak-tflops" and hw.lookup(hardware.name) is not None


def above_executed(model: ModelSection, totals: Totals) -> str | None:
    """Why the model's FLOPs exceed those the trace executed, in a few words for the headline; None when they do not.

    Told by the utilization (MFU above HFU) or by the loss budget (a negative extra_executed: the model FLOPs above the
    executed ones less recompute). The cause is the model section's: parts whose weights ran no weight gradients
    (frozen: expected), parts the step did not run, else the description (T, tokens per step, world size).
    """
    mfu, hfu = totals.mfu, totals.hfu
    above = mfu is not None and hfu is not None and mfu > hfu * (1 + 1e-9)
    extra = (totals.loss_budget or {}).get("extra_executed")
    negative = extra is not None and extra < -EXTRA_TOLERANCE
    if not above and not negative:
        return None
    what = (
        f"MFU {fmt.pct(mfu)} above HFU {fmt.pct(hfu)}"
        if above
        else f"model FLOPs above the executed ones (extra_executed {fmt.pct(extra)})"
    )
    frozen = frozen_parts(model)
    missing = [p.part for p in model.by_part or [] if p.trace_flops_per_step == 0 and p.part is not None]
    if frozen:
        why = f"frozen weights ({', '.join(frozen)}): no weight gradients ran, 6N counts them; expected"
    elif missing:
        why = f"the step did not run the model's {', '.join(missing)} GEMMs on every token"
    else:
        why = "check T, tokens per step and world size against the trace"
    return f"{what}: {why}"


EXTRA_TOLERANCE = 1e-6  # an extra_executed this far below 0 is model FLOPs above the executed ones, not rounding


def with_band(model: ModelSection, totals: Totals, hardware: Hardware | None) -> ModelSection:
    """The section with the MFU band (training against a known device's peak only: none against --peak-tflops) and why
    the model's FLOPs exceed the executed ones, where they do."""
    mfu = totals.mfu
    band = mf.verdict_band(mfu) if mfu is not None and model.mode == "training" and known_peak(hardware) else None
    why = above_executed(model, totals)
    return sections.replace(model, band=band, **({"above_executed": why} if why is not None else {}))
