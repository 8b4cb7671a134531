"""Analytical model FLOPs per token, as PaLM defines them (Chowdhery et al. 2022, appendix B).

    training  (forward + backward):  6 N + 12 L H Q T   FLOPs per token
    inference (forward only):        2 N +  4 L H Q T   FLOPs per token

N is the number of weights a token is multiplied by (matmul weights), L the
number of layers, H the attention heads, Q the head dimension (H*Q is the
attention width, which need not equal d_model) and T the sequence length. The
attention term counts the full T x T score and value matmuls, as PaLM does,
even for a causal mask; the "causal" figure beside it scales that term by the
fraction of a square causal mask that is actually needed, (T+1)/(2T).

What N includes here: every weight used in a matmul per token -- attention
projections, MLP (or the router plus the top-k routed experts plus any shared
experts for MoE), and the LM head (counted once, whether or not it is tied to
the input embedding). Excluded: lookup embeddings (token and learned
positions), norms and biases.

MFU = tokens/s x model FLOPs per token / (devices x peak FLOP/s). HFU is the
same ratio with the FLOPs actually executed (recomputation included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MODES = ("training", "inference")

BAND_CAVEAT = (
    "The verdict bands are rules of thumb for dense-model training on current accelerators; "
    "they do not apply to inference (decode is memory-bound), to small models (too little "
    "arithmetic per step to fill the machine) or to MoE models (routing, all-to-all and "
    "ragged expert matmuls lower attainable MFU). MFU measures model arithmetic against the "
    "clock, not convergence: a run can score high MFU and still train badly."
)


# --- specs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    params_matmul: int  # N: weights used in matmuls per token (active only, for MoE)
    layers: int  # L
    heads: int  # H (query heads)
    head_dim: int  # Q
    seq_len: int  # T
    source: str  # 'flags' | 'config'
    breakdown: dict[str, int]  # what was counted in N, summed over layers
    total_params: int | None = None  # all parameters incl. embeddings/norms/biases, when known
    excluded: dict[str, int] = field(default_factory=dict)  # known parameters not in N
    model_type: str = ""
    notes: tuple[str, ...] = ()
    seq_len_source: str = "flag"  # 'flag' (given) | 'config' (its maximum context, a last resort) | 'trace'
    # Weight shapes (out, in) of each part of N, for telling the trace's GEMMs apart; empty when unknown.
    part_shapes: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(
            (self.params_matmul, self.layers, self.heads, self.head_dim, self.seq_len, self.source, self.model_type)
        )

    def describe(self) -> str:
        """A few printable lines: what N counts and what it leaves out."""
        lines = [
            f"N = {self.params_matmul:,} matmul weights per token "
            f"(L={self.layers}, H={self.heads}, Q={self.head_dim}, T={self.seq_len}; "
            f"from {self.source}{' ' + self.model_type if self.model_type else ''})"
        ]
        for k, v in self.breakdown.items():
            lines.append(f"  counted   {k:<20} {v:>16,}")
        for k, v in self.excluded.items():
            lines.append(f"  excluded  {k:<20} {v:>16,}")
        if self.total_params is not None:
            lines.append(f"  total parameters           {self.total_params:>16,}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def pos_int(name: str, value, where: str = "") -> int:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be a positive integer{where}, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer{where}, got {value!r}") from None
    if not math.isfinite(f) or f <= 0 or f != int(f):
        raise ValueError(f"{name} must be a positive integer{where}, got {value!r}")
    return int(f)


def spec_from_flags(params: int, layers: int, heads: int, head_dim: int, seq_len: int) -> ModelSpec:
    """A spec from command-line numbers: N, L, H, Q, T (see the module docstring for N)."""
    n = pos_int("--params", params)
    return ModelSpec(
        params_matmul=n,
        layers=pos_int("--layers", layers),
        heads=pos_int("--heads", heads),
        head_dim=pos_int("--head-dim", head_dim),
        seq_len=pos_int("--seq-len", seq_len),
        source="flags",
        breakdown={"params (as given)": n},
        total_params=None,
        notes=(
            "N taken as given: it should count matmul weights only (incl. the LM head, "
            "excl. lookup embeddings); for MoE, only the active experts.",
        ),
    )


# --- FLOPs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFlops:
    per_token: float  # PaLM: 6N + 12LHQT (training) or 2N + 4LHQT (inference)
    per_token_no_attention: float  # 6N (or 2N)
    per_token_causal: float  # attention term x (T+1)/(2T)
    mode: str
    tokens_per_step: float | None
    per_step: float | None
    per_step_no_attention: float | None
    per_step_causal: float | None
    labels: dict[str, str]
    attention_per_token: float = 0.0  # the full (PaLM) attention term alone
    causal_fraction: float = 1.0


def model_flops(spec: ModelSpec, mode: str = "training", tokens_per_step: float | None = None) -> ModelFlops:
    """PaLM appendix-B model FLOPs per token (and per step when tokens_per_step is given)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if tokens_per_step is not None and (
        isinstance(tokens_per_step, bool)
        or not (isinstance(tokens_per_step, (int, float)) and math.isfinite(tokens_per_step) and tokens_per_step > 0)
    ):
        raise ValueError(f"tokens_per_step must be a positive number, got {tokens_per_step!r}")
    N, L, H, Q, T = (spec.params_matmul, spec.layers, spec.heads, spec.head_dim, spec.seq_len)
    wmul, amul = (6, 12) if mode == "training" else (2, 4)
    dense = float(wmul * N)
    attn = float(amul * L * H * Q * T)
    frac = (T + 1) / (2 * T)
    per_token = dense + attn
    causal = dense + attn * frac
    what = "training (forward + backward)" if mode == "training" else "inference (forward only)"
    labels = {
        "per_token": (
            f"{what} model FLOPs/token, PaLM app. B: {wmul}N + {amul}·L·H·Q·T (full T×T attention, as PaLM counts it)"
        ),
        "per_token_no_attention": f"{what} model FLOPs/token without attention: {wmul}N",
        "per_token_causal": (
            f"{what} model FLOPs/token with causal-effective attention: "
            f"{wmul}N + {amul}·L·H·Q·T·(T+1)/(2T), (T+1)/(2T) = {frac:.4f}"
        ),
    }
    if mode == "inference":
        labels["per_token"] += (
            "; assumes a full T-token forward (prefill): a decode token attends to its context length, not T"
        )
    steps: tuple[float | None, float | None, float | None]
    if tokens_per_step is None:
        steps = (None, None, None)
    else:
        steps = (per_token * tokens_per_step, dense * tokens_per_step, causal * tokens_per_step)
        labels["per_step"] = f"per_token × {tokens_per_step:g} tokens per step"
    return ModelFlops(
        per_token=per_token,
        per_token_no_attention=dense,
        per_token_causal=causal,
        mode=mode,
        tokens_per_step=None if tokens_per_step is None else float(tokens_per_step),
        per_step=steps[0],
        per_step_no_attention=steps[1],
        per_step_causal=steps[2],
        labels=labels,
        attention_per_token=attn,
        causal_fraction=frac,
    )


def mfu(tokens_per_second: float, flops_per_token: float, devices: int, peak_flops: float) -> float:
    """Model FLOPs utilization (a fraction): achieved model FLOP/s over aggregate peak.

    Pass executed FLOPs per token (recomputation included) instead to get HFU.
    """
    for name, v in (
        ("tokens_per_second", tokens_per_second),
        ("flops_per_token", flops_per_token),
        ("devices", devices),
        ("peak_flops", peak_flops),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    return tokens_per_second * flops_per_token / (devices * peak_flops)


def verdict_band(mfu: float) -> str:
    """Rule-of-thumb label for a training MFU (fraction). Read BAND_CAVEAT alongside."""
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not math.isfinite(mfu) or mfu < 0:
        raise ValueError(f"mfu must be a non-negative fraction, got {mfu!r}")
    if mfu > 1.0:
        return "above peak (impossible: check the peak, the FLOPs or the device count)"
    if mfu < 0.20:
        return "likely broken"
    if mfu < 0.35:
        return "room to improve"
    if mfu < 0.55:
        return "good"
    if mfu <= 0.75:
        return "excellent"
    return "exceptional"
