"""A Hugging Face `config.json` → the `ModelSpec` PaLM's formula needs (N, L, H, Q, T), per model family.

N counts every weight a token is multiplied by (`flops.model` says what is in
and out); the families read here differ in where they keep those numbers (GPT-2
and GPT-NeoX names, Llama-like, mixture-of-experts routing and shared experts,
DeepSeek's low-rank attention), so each family has its own count.
"""

from __future__ import annotations

from traceflops.flops.model import ModelSpec, pos_int

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
    return pos_int(names[0], v, f" in the {mt} config")


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
    T = pos_int("seq_len", seq_len)
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
        ff = pos_int("n_inner", cfg["n_inner"]) if cfg.get("n_inner") else 4 * d
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
            q_lora = pos_int("q_lora_rank", q_lora)
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
        Q = pos_int("head_dim", hd)
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
        dense_ff = pos_int("intermediate_size", dense_ff)

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
