"""The report's model section: model FLOPs per step from a description (PaLM) or from the trace, tokens per step, the MFU band."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import polars as pl

from traceflops.core.results import ModelOptions
from traceflops.flops import model as mf


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


def band_of(mfu: float | None, mode: str, model: dict) -> dict[str, Any]:
    if mfu is None or mode != "training":
        return {"band": None, "band_caveat": mf.BAND_CAVEAT}
    return {"band": mf.verdict_band(mfu), "band_caveat": mf.BAND_CAVEAT}
