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


def _pos_int(name: str, value, where: str = "") -> int:
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
    n = _pos_int("--params", params)
    return ModelSpec(
        params_matmul=n,
        layers=_pos_int("--layers", layers),
        heads=_pos_int("--heads", heads),
        head_dim=_pos_int("--head-dim", head_dim),
        seq_len=_pos_int("--seq-len", seq_len),
        source="flags",
        breakdown={"params (as given)": n},
        total_params=None,
        notes=(
            "N taken as given: it should count matmul weights only (incl. the LM head, "
            "excl. lookup embeddings); for MoE, only the active experts.",
        ),
    )


# --- Hugging Face config.json -------------------------------------------------------------

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "granite"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3"}
_SUPPORTED = sorted(_LLAMA_LIKE | _MOE | {"gpt2", "gpt_neox"})
_TIED_DEFAULT = {"gpt2": True, "gemma": True}


def _get(cfg: dict, *names, default=None):
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def _need(cfg: dict, mt: str, *names: str) -> int:
    v = _get(cfg, *names)
    if v is None:
        raise ValueError(f"{mt} config has no {' / '.join(names)}: cannot count parameters")
    return _pos_int(names[0], v, f" in the {mt} config")


def _family(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if mt:
        mt = str(mt)
        if mt in _LLAMA_LIKE or mt in _MOE or mt in ("gpt2", "gpt_neox"):
            return mt
        raise ValueError(
            f"model_type {mt!r} is not supported by spec_from_config (supported: "
            f"{', '.join(_SUPPORTED)}); pass --params/--layers/--heads/--head-dim/--seq-len"
        )
    if "text_config" in cfg:
        raise ValueError(
            "this looks like a multimodal config (it has text_config): the vision "
            "part would not be counted; pass the numbers with flags instead"
        )
    if "n_embd" in cfg and "n_layer" in cfg:
        return "gpt2"
    if "num_local_experts" in cfg:
        return "mixtral"
    if {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers"} <= set(cfg):
        return "llama"
    raise ValueError(
        "config has no model_type and is neither GPT-2 style (n_embd, n_layer, "
        "n_head) nor Llama style (hidden_size, intermediate_size, "
        "num_attention_heads, num_hidden_layers)"
    )


def spec_from_config(config: dict, seq_len: int | None = None) -> ModelSpec:
    """Count N (and total parameters) from a Hugging Face ``config.json`` dict.

    Supports GPT-2, GPT-NeoX, Llama-style dense models (llama, mistral, qwen2,
    qwen3, gemma, phi3, granite; GQA via num_key_value_heads, SwiGLU with three
    matrices) and MoE models (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3
    incl. MLA attention). T defaults to max_position_embeddings / n_positions.
    Raises ValueError for unsupported or inconsistent configs.
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict (parsed config.json), got {type(config).__name__}")
    fam = _family(config)
    if fam in ("gpt2", "gpt_neox"):
        c = _count_gpt(config, fam)
    else:
        c = _count_decoder(config, fam)
    notes = list(c.pop("notes"))
    seq_len_source = "flag"
    if seq_len is None:
        seq_len_source = "config"  # a last resort: the analysis takes the trace's T where it can, and says so
        seq_len = _get(config, "max_position_embeddings", "n_positions", "n_ctx")
        if seq_len is None:
            raise ValueError("config has no max_position_embeddings/n_positions: pass seq_len")
    T = _pos_int("seq_len", seq_len)
    window = config.get("sliding_window")
    use_window = config.get("use_sliding_window", True)
    if isinstance(window, int) and not isinstance(window, bool) and use_window and 0 < window < T:
        notes.append(
            f"sliding-window attention ({window}) < T: PaLM's attention term counts "
            f"all T={T} keys, more than the model computes"
        )

    return ModelSpec(
        params_matmul=c["N"],
        layers=c["L"],
        heads=c["H"],
        head_dim=c["Q"],
        seq_len=T,
        source="config",
        breakdown=c["counted"],
        total_params=c["total"],
        excluded=c["excluded"],
        model_type=fam,
        notes=tuple(notes),
        seq_len_source=seq_len_source,
        part_shapes=c["shapes"],
    )


def _tied(cfg: dict, fam: str) -> bool:
    v = cfg.get("tie_word_embeddings")
    if v is None:
        return _TIED_DEFAULT.get(fam, False)
    return bool(v)


def _count_gpt(cfg: dict, fam: str) -> dict:
    if fam == "gpt2":
        d = _need(cfg, fam, "n_embd", "hidden_size")
        L = _need(cfg, fam, "n_layer", "num_hidden_layers")
        H = _need(cfg, fam, "n_head", "num_attention_heads")
        ff = _pos_int("n_inner", cfg["n_inner"]) if cfg.get("n_inner") else 4 * d
        P = _need(cfg, fam, "n_positions", "n_ctx", "max_position_embeddings")
    else:  # gpt_neox
        d = _need(cfg, fam, "hidden_size")
        L = _need(cfg, fam, "num_hidden_layers")
        H = _need(cfg, fam, "num_attention_heads")
        ff = _need(cfg, fam, "intermediate_size")
        P = 0  # rotary: no learned positions
    V = _need(cfg, fam, "vocab_size")
    if d % H:
        raise ValueError(f"{fam} config: hidden size {d} is not divisible by {H} heads")
    Q = d // H
    tied = _tied(cfg, fam)
    attn = L * (3 * d * d + d * d)
    mlp = L * 2 * d * ff
    lm_head = V * d
    biases = L * (3 * d + d + ff + d)
    norms = L * 2 * (2 * d) + 2 * d  # LayerNorm weight + bias, two per layer, plus the final one
    emb = V * d
    excluded = {"embedding": emb}
    if P:
        excluded["position_embedding"] = P * d
    excluded.update({"norms": norms, "biases": biases})
    counted = {"attention": attn, "mlp": mlp, "lm_head": lm_head}
    N = attn + mlp + lm_head
    total = attn + mlp + sum(excluded.values()) + (0 if tied else lm_head)
    notes = [f"{'tied' if tied else 'untied'} LM head ({V:,} x {d}) counted once in N", "2-matrix GELU MLP"]
    shapes = {"lm_head": ((V, d),), "mlp": ((ff, d), (d, ff)), "attention": ((3 * d, d), (d, d))}
    return {
        "N": N,
        "L": L,
        "H": H,
        "Q": Q,
        "counted": counted,
        "excluded": excluded,
        "total": total,
        "notes": notes,
        "shapes": shapes,
    }


def _count_decoder(cfg: dict, fam: str) -> dict:
    d = _need(cfg, fam, "hidden_size")
    L = _need(cfg, fam, "num_hidden_layers")
    H = _need(cfg, fam, "num_attention_heads")
    V = _need(cfg, fam, "vocab_size")
    notes: list[str] = []
    tied = _tied(cfg, fam)
    mla = fam in ("deepseek_v2", "deepseek_v3")

    # ---- attention ------------------------------------------------------------
    attn_bias = 0
    attn_norm = 0
    if mla:
        nope = _need(cfg, fam, "qk_nope_head_dim")
        rope = _need(cfg, fam, "qk_rope_head_dim")
        vdim = _need(cfg, fam, "v_head_dim")
        kv_lora = _need(cfg, fam, "kv_lora_rank")
        q_lora = cfg.get("q_lora_rank")
        qk = nope + rope
        if q_lora:
            q_lora = _pos_int("q_lora_rank", q_lora)
            q_w = d * q_lora + q_lora * H * qk
            attn_norm += q_lora
        else:
            q_w = d * H * qk
        attn_w = q_w + d * (kv_lora + rope) + kv_lora * H * (nope + vdim) + H * vdim * d
        attn_norm += kv_lora
        if cfg.get("attention_bias"):
            attn_bias = (q_lora or 0) + (kv_lora + rope) + d
        if (qk + vdim) % 2:
            raise ValueError(f"{fam} config: qk head dim {qk} + v head dim {vdim} is odd")
        Q = (qk + vdim) // 2
        notes.append(
            f"MLA attention: scores use {qk}-dim q/k heads, values {vdim}-dim heads; "
            f"Q = ({qk}+{vdim})/2 = {Q} makes 4*H*Q*T exact"
        )
    else:
        K = int(_get(cfg, "num_key_value_heads", default=H))
        if K <= 0 or H % K:
            raise ValueError(f"{fam} config: {H} attention heads are not a multiple of {K} key/value heads")
        hd = cfg.get("head_dim")
        if hd is None:
            if d % H:
                raise ValueError(
                    f"{fam} config: hidden_size {d} is not divisible by {H} heads and there is no head_dim"
                )
            hd = d // H
        Q = _pos_int("head_dim", hd)
        attn_w = d * H * Q + 2 * d * K * Q + H * Q * d
        if fam in ("qwen2", "qwen2_moe"):
            attn_bias = H * Q + 2 * K * Q  # Qwen2 always has q/k/v biases
        elif cfg.get("attention_bias"):
            attn_bias = H * Q + 2 * K * Q + d
        if fam in ("qwen3", "qwen3_moe"):
            attn_norm = 2 * Q
        elif fam == "olmoe":
            attn_norm = d + K * Q
        if K != H:
            notes.append(f"GQA: {K} key/value heads for {H} query heads")

    # ---- MLP / MoE -----------------------------------------------------------------
    mlp_bias = bool(cfg.get("mlp_bias"))
    experts = routed_k = moe_ff = 0
    shared_ff = 0
    shared_gate = False
    router_bias = 0
    moe_layers: list[int] = []
    dense_ff = cfg.get("intermediate_size")
    if fam == "mixtral":
        experts = _need(cfg, fam, "num_local_experts")
        routed_k = _need(cfg, fam, "num_experts_per_tok")
        moe_ff = _need(cfg, fam, "intermediate_size")
        moe_layers = list(range(L))
    elif fam == "olmoe":
        experts = _need(cfg, fam, "num_experts")
        routed_k = _need(cfg, fam, "num_experts_per_tok")
        moe_ff = _need(cfg, fam, "intermediate_size")
        moe_layers = list(range(L))
    elif fam in ("qwen2_moe", "qwen3_moe"):
        experts = _need(cfg, fam, "num_experts")
        routed_k = _need(cfg, fam, "num_experts_per_tok")
        moe_ff = _need(cfg, fam, "moe_intermediate_size")
        step = int(_get(cfg, "decoder_sparse_step", default=1))
        if step <= 0:
            raise ValueError(f"{fam} config: decoder_sparse_step must be positive, got {step}")
        only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = [i for i in range(L) if i not in only and (i + 1) % step == 0]
        if fam == "qwen2_moe":
            shared_ff = int(_get(cfg, "shared_expert_intermediate_size", default=0))
            shared_gate = shared_ff > 0
    elif mla:
        experts = int(_get(cfg, "n_routed_experts", default=0))
        if experts:
            routed_k = _need(cfg, fam, "num_experts_per_tok")
            moe_ff = _need(cfg, fam, "moe_intermediate_size")
            first = int(_get(cfg, "first_k_dense_replace", default=0))
            freq = int(_get(cfg, "moe_layer_freq", default=1))
            if freq <= 0:
                raise ValueError(f"{fam} config: moe_layer_freq must be positive, got {freq}")
            moe_layers = [i for i in range(L) if i >= first and i % freq == 0]
            shared_ff = int(_get(cfg, "n_shared_experts", default=0)) * moe_ff
            if cfg.get("topk_method") == "noaux_tc":
                router_bias = experts  # e_score_correction_bias
        if cfg.get("num_nextn_predict_layers"):
            notes.append(
                "multi-token-prediction layers in the checkpoint are not part of the "
                "Hugging Face model and are not counted"
            )
    if experts and routed_k > experts:
        raise ValueError(f"{fam} config: num_experts_per_tok={routed_k} exceeds the {experts} experts")
    n_moe = len(moe_layers)
    n_dense = L - n_moe
    if n_dense:
        if dense_ff is None:
            raise ValueError(f"{fam} config has dense layers but no intermediate_size")
        dense_ff = _pos_int("intermediate_size", dense_ff)

    gated = 3  # gate, up, down (SwiGLU / GeGLU)
    dense_mlp = n_dense * gated * d * (dense_ff or 0)
    expert_w = gated * d * moe_ff
    experts_all = n_moe * experts * expert_w
    experts_active = n_moe * routed_k * expert_w
    shared = n_moe * gated * d * shared_ff
    router = n_moe * (d * experts + (d if shared_gate else 0))
    attn_total = L * attn_w
    lm_head = V * d

    counted = {"attention": attn_total}
    if dense_mlp:
        counted["mlp"] = dense_mlp
    if n_moe:
        counted["router"] = router
        counted["experts_active"] = experts_active
        if shared:
            counted["shared_experts"] = shared
    counted["lm_head"] = lm_head
    N = sum(counted.values())

    norms = L * (2 * d + attn_norm) + d
    biases = L * attn_bias + n_moe * router_bias
    if mlp_bias:
        biases += n_dense * (2 * (dense_ff or 0) + d)  # gate/up/down biases of dense MLPs
    excluded = {"embedding": V * d, "norms": norms}
    if biases:
        excluded["biases"] = biases
    if n_moe and experts_all - experts_active:
        excluded["experts_inactive"] = experts_all - experts_active
    total = attn_total + dense_mlp + experts_all + shared + router + norms + biases + V * d + (0 if tied else lm_head)

    notes.insert(0, f"{'tied' if tied else 'untied'} LM head ({V:,} x {d}) counted once in N; 3-matrix gated MLP")
    if n_moe:
        notes.append(
            f"MoE: {n_moe} of {L} layers route each token to {routed_k} of {experts} "
            f"experts (expert FFN {moe_ff})"
            + (f" plus shared FFN {shared_ff}" if shared_ff else "")
            + "; N counts the active experts, total_params all of them"
        )
    shapes: dict[str, tuple[tuple[int, int], ...]] = {"lm_head": ((V, d),)}
    if not mla:
        shapes["attention"] = ((H * Q, d), (K * Q, d), (d, H * Q))
    if dense_mlp and not n_moe:
        assert dense_ff is not None  # dense layers need intermediate_size (checked above)
        shapes["mlp"] = ((dense_ff, d), (d, dense_ff))
    return {
        "N": N,
        "L": L,
        "H": H,
        "Q": Q,
        "counted": counted,
        "excluded": excluded,
        "total": total,
        "notes": notes,
        "shapes": shapes,
    }


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
