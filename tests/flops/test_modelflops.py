"""Analytical model FLOPs (PaLM appendix B) checked against published numbers.

Parameter counts are recomputed here longhand from each config's own numbers,
not by calling the module, and compared with the sizes the model authors
published. Configs and their sources: tests/data/configs/README.md.
"""

from __future__ import annotations

import copy
import json

import pytest

from tests.builders import DATA
from traceflops.flops.model import (
    BAND_CAVEAT,
    ModelSpec,
    mfu,
    model_flops,
    spec_from_flags,
    verdict_band,
)
from traceflops.flops.model_config import spec_from_config

CONFIGS = DATA / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


# --- PaLM 540B (Chowdhery et al. 2022, section 4.1 / appendix B) -------------------------------

PALM = dict(params=540_000_000_000, layers=118, heads=48, head_dim=256, seq_len=2048)
PALM_TOKENS_PER_S = 238.3e3
PALM_CHIPS = 6144
PALM_PEAK = 275e12  # TPU v4 bf16


def test_palm_540b_mfu_without_and_with_attention():
    spec = spec_from_flags(**PALM)
    f = model_flops(spec, "training", None)
    assert f.per_token_no_attention == 6 * 540e9
    assert f.per_token == 6 * 540e9 + 12 * 118 * 48 * 256 * 2048
    without = mfu(PALM_TOKENS_PER_S, f.per_token_no_attention, PALM_CHIPS, PALM_PEAK)
    with_attn = mfu(PALM_TOKENS_PER_S, f.per_token, PALM_CHIPS, PALM_PEAK)
    assert round(100 * without, 1) == 45.7
    assert round(100 * with_attn, 1) == 46.2


def test_palm_540b_hfu():
    # PaLM: 4.10 TFLOPs executed per token (with rematerialization) -> HFU 57.8%
    assert round(100 * mfu(PALM_TOKENS_PER_S, 4.10e12, PALM_CHIPS, PALM_PEAK), 1) == 57.8


def test_causal_and_inference_terms():
    spec = spec_from_flags(**PALM)
    T = 2048
    attn_train = 12 * 118 * 48 * 256 * T
    f = model_flops(spec, "training", tokens_per_step=T * 2048)
    assert f.causal_fraction == (T + 1) / (2 * T)
    assert f.per_token_causal == pytest.approx(6 * 540e9 + attn_train * (T + 1) / (2 * T))
    assert f.per_token_no_attention < f.per_token_causal < f.per_token
    assert f.per_step == pytest.approx(f.per_token * T * 2048)
    assert f.per_step_no_attention == pytest.approx(f.per_token_no_attention * T * 2048)
    assert f.per_step_causal == pytest.approx(f.per_token_causal * T * 2048)
    for key in ("per_token", "per_token_no_attention", "per_token_causal", "per_step"):
        assert f.labels[key]
    assert "PaLM" in f.labels["per_token"]
    g = model_flops(spec, "inference", None)
    assert g.per_token == 2 * 540e9 + 4 * 118 * 48 * 256 * T
    assert g.per_token_no_attention == 2 * 540e9
    assert g.per_step is None and g.mode == "inference"
    assert "prefill" in g.labels["per_token"]


def test_model_flops_rejects_bad_input():
    spec = spec_from_flags(**PALM)
    with pytest.raises(ValueError):
        model_flops(spec, "train", None)
    with pytest.raises(ValueError):
        model_flops(spec, "training", -5)
    for args in ((0, 1, 1, 1), (1, 1, 0, 1), (1, -1, 1, 1), (1, 1, 1, float("nan"))):
        with pytest.raises(ValueError):
            mfu(*args)


def test_spec_from_flags_validation():
    with pytest.raises(ValueError):
        spec_from_flags(-1, 1, 1, 1, 1)
    with pytest.raises(ValueError):
        spec_from_flags(10, 0, 1, 1, 1)
    with pytest.raises(ValueError):
        spec_from_flags(10, 1, 1, 1, 1.5)
    s = spec_from_flags(**PALM)
    assert s.source == "flags" and s.total_params is None


# --- Llama-2-7B: dense, multi-head attention -----------------------------------------------------

def test_llama2_7b():
    c = _cfg("llama-2-7b-hf.json")
    d, L, V, ff, H = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], \
        c["intermediate_size"], c["num_attention_heads"]
    hd = d // H
    attn = d * d * 4  # q, k, v, o: 32 KV heads = full multi-head
    mlp = 3 * d * ff  # gate, up, down
    N = L * (attn + mlp) + V * d  # + LM head (untied), embedding excluded
    total = L * (attn + mlp + 2 * d) + d + 2 * V * d  # + 2 RMSNorms/layer, final norm, embed+head
    s = spec_from_config(c, seq_len=4096)
    assert s.params_matmul == N
    assert s.total_params == total
    assert total == 6_738_415_616  # published Llama-2-7B parameter count
    assert (s.layers, s.heads, s.head_dim, s.seq_len, s.source) == (32, 32, hd, 4096, "config")
    assert s.breakdown["lm_head"] == V * d
    assert s.excluded["embedding"] == V * d


def test_llama2_default_seq_len_and_tied_variant():
    c = _cfg("llama-2-7b-hf.json")
    s = spec_from_config(c)
    assert s.seq_len == c["max_position_embeddings"]
    tied = dict(c, tie_word_embeddings=True)
    t = spec_from_config(tied)
    # LM head counted once in N either way; total loses the duplicate matrix
    assert t.params_matmul == s.params_matmul
    assert s.total_params - t.total_params == c["vocab_size"] * c["hidden_size"]


# --- Mistral-7B: grouped-query attention ---------------------------------------------------------

def test_mistral_7b_gqa():
    c = _cfg("mistral-7b-v0.1.json")
    d, L, V, ff = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    hd = d // H
    attn = d * (H * hd) + 2 * d * (K * hd) + (H * hd) * d  # q, k, v (8 KV heads), o
    assert attn == 4096 * 4096 * 2 + 2 * 4096 * 1024
    mlp = 3 * d * ff
    N = L * (attn + mlp) + V * d
    total = L * (attn + mlp + 2 * d) + d + 2 * V * d
    s = spec_from_config(c, seq_len=4096)
    assert s.params_matmul == N
    assert s.total_params == total
    assert total == 7_241_732_096  # published Mistral-7B parameter count (7.24B)
    assert s.breakdown["attention"] == L * attn
    # PaLM's attention term uses the query heads: H*Q = 4096, not the KV width
    assert (s.heads, s.head_dim) == (32, 128)


def test_mistral_sliding_window_note():
    s = spec_from_config(_cfg("mistral-7b-v0.1.json"), seq_len=8192)
    assert any("sliding" in n for n in s.notes)


# --- Mixtral-8x7B: MoE, 8 experts, top-2 ---------------------------------------------------------

def test_mixtral_8x7b_moe():
    c = _cfg("mixtral-8x7b-instruct-v0.1.json")
    d, L, V, ff = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    H, K, E, k = (c["num_attention_heads"], c["num_key_value_heads"], c["num_local_experts"],
                  c["num_experts_per_tok"])
    hd = d // H
    attn = 2 * d * H * hd + 2 * d * K * hd
    expert = 3 * d * ff
    router = d * E
    N = L * (attn + k * expert + router) + V * d
    total = L * (attn + E * expert + router + 2 * d) + d + 2 * V * d
    s = spec_from_config(c, seq_len=4096)
    assert s.params_matmul == N
    assert s.total_params == total
    # published: 46.7B total, 12.9B active. Mistral's "active" includes the embedding
    # (and norms); N (matmul weights incl. the LM head) is 12.75B, 1.2% below.
    assert total == pytest.approx(46.7e9, rel=1e-3)
    active_with_embedding = N + V * d + L * 2 * d + d
    assert active_with_embedding == pytest.approx(12.9e9, rel=5e-3)
    assert N == pytest.approx(12.9e9, rel=2e-2)
    assert s.breakdown["experts_active"] == L * k * expert
    assert s.breakdown["router"] == L * router
    assert s.excluded["experts_inactive"] == L * (E - k) * expert


# --- Qwen1.5-MoE-A2.7B: MoE with a shared expert and qkv biases -----------------------------------

def test_qwen15_moe_a27b():
    c = _cfg("qwen1.5-moe-a2.7b.json")
    d, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    H, E, k = c["num_attention_heads"], c["num_experts"], c["num_experts_per_tok"]
    fe, fs = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    hd = d // H
    attn = 4 * d * H * hd  # 16 KV heads = full MHA
    qkv_bias = 3 * H * hd  # Qwen2 q/k/v projections carry biases (not counted in N)
    expert = 3 * d * fe
    shared = 3 * d * fs
    router = d * E + d  # expert router + the shared expert's sigmoid gate (d -> 1)
    N = L * (attn + k * expert + shared + router) + V * d
    total = L * (attn + qkv_bias + E * expert + shared + router + 2 * d) + d + 2 * V * d
    s = spec_from_config(c)
    assert s.params_matmul == N
    assert s.total_params == total
    assert total == pytest.approx(14.3e9, rel=5e-3)  # published 14.3B total
    # published "2.7B activated" counts embedding and LM head
    assert N + V * d + L * (qkv_bias + 2 * d) + d == pytest.approx(2.7e9, rel=1e-2)
    assert s.breakdown["shared_experts"] == L * shared


# --- DeepSeek-V2-Lite architecture: MLA attention, routed + shared experts, first layer dense -----

def test_deepseek_v2_lite_mla_moe():
    c = _cfg("deepseek-coder-v2-lite-base.json")
    d, L, V, H = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_attention_heads"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    r = c["kv_lora_rank"]
    assert c["q_lora_rank"] is None  # Lite: plain q projection
    attn = (d * H * (nope + rope)  # q_proj
            + d * (r + rope)  # kv_a_proj_with_mqa
            + r * H * (nope + vd)  # kv_b_proj
            + H * vd * d)  # o_proj
    dense_layers = c["first_k_dense_replace"]
    moe_layers = L - dense_layers
    E, k, fe = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    dense_mlp = 3 * d * c["intermediate_size"]
    expert = 3 * d * fe
    shared = 3 * d * fe * c["n_shared_experts"]
    router = d * E
    N = (L * attn + dense_layers * dense_mlp
         + moe_layers * (k * expert + shared + router) + V * d)
    norms = L * (2 * d + r) + d  # 2 RMSNorms per layer + kv_a_layernorm, final norm
    total = (L * attn + dense_layers * dense_mlp + moe_layers * (E * expert + shared + router)
             + norms + 2 * V * d)
    s = spec_from_config(c, seq_len=4096)
    assert s.params_matmul == N
    assert s.total_params == total
    assert total == pytest.approx(15.7e9, rel=5e-3)  # DeepSeek-V2-Lite: 15.7B total
    assert N == pytest.approx(2.4e9, rel=3e-2)  # 2.4B activated
    # attention term: scores over (nope+rope) dims, values over v dims -> Q = mean
    assert s.head_dim == (nope + rope + vd) // 2
    f = model_flops(s, "training", None)
    assert f.attention_per_token == 12 * L * H * s.head_dim * 4096
    assert f.attention_per_token == 6 * L * H * 4096 * ((nope + rope) + vd)


# --- GPT-2: tied LM head, learned positions, 2-matrix MLP, config without model_type ----------------

def test_gpt2_small():
    c = _cfg("gpt2.json")
    assert "model_type" not in c
    d, L, V, P = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
    ff = 4 * d  # n_inner unset
    weights = L * (3 * d * d + d * d + 2 * d * ff)  # c_attn, c_proj, c_fc, mlp c_proj
    biases = L * (3 * d + d + ff + d)
    norms = L * 2 * 2 * d + 2 * d  # LayerNorm weight and bias
    N = weights + V * d  # tied: the LM head is the embedding matrix, counted once in N
    total = weights + biases + norms + V * d + P * d  # embedding once, positions
    s = spec_from_config(c)
    assert s.params_matmul == N
    assert s.total_params == total == 124_439_808  # published GPT-2 small (124M)
    assert s.excluded["position_embedding"] == P * d
    assert (s.heads, s.head_dim, s.seq_len) == (12, 64, 1024)


# --- configs that must be refused ---------------------------------------------------------------

def test_unsupported_and_inconsistent_configs():
    base = _cfg("mistral-7b-v0.1.json")
    bad = [
        dict(base, model_type="t5"),
        dict(base, num_key_value_heads=5),  # 32 heads not a multiple of 5
        {k: v for k, v in base.items() if k != "intermediate_size"},
        dict(base, hidden_size=4100),  # not divisible by 32 heads, no head_dim
        dict(base, num_hidden_layers=0),
        dict(_cfg("mixtral-8x7b-instruct-v0.1.json"), num_experts_per_tok=9),
        {"text_config": {}, "vision_config": {}},
        {"foo": 1},
        "not a dict",
    ]
    for cfg in bad:
        with pytest.raises(ValueError):
            spec_from_config(copy.deepcopy(cfg) if isinstance(cfg, dict) else cfg)
    with pytest.raises(ValueError):
        spec_from_config(base, seq_len=0)


def test_explicit_head_dim_is_used():
    c = dict(_cfg("mistral-7b-v0.1.json"), head_dim=256)  # H*Q = 8192 != hidden_size
    s = spec_from_config(c, seq_len=1024)
    assert s.head_dim == 256
    d, H, K = 4096, 32, 8
    assert s.breakdown["attention"] == 32 * (2 * d * H * 256 + 2 * d * K * 256)


def test_describe_mentions_what_was_counted():
    text = spec_from_config(_cfg("mixtral-8x7b-instruct-v0.1.json"), seq_len=4096).describe()
    for word in ("experts_active", "router", "lm_head", "embedding", "experts_inactive"):
        assert word in text
    assert isinstance(spec_from_flags(**PALM), ModelSpec)


# --- verdict bands --------------------------------------------------------------------------------

@pytest.mark.parametrize("value,band", [
    (0.0, "likely broken"), (0.199, "likely broken"), (0.20, "room to improve"),
    (0.349, "room to improve"), (0.35, "good"), (0.462, "good"), (0.549, "good"),
    (0.55, "excellent"), (0.75, "excellent"), (0.751, "exceptional"), (1.0, "exceptional"),
])
def test_verdict_band(value, band):
    assert verdict_band(value) == band


def test_verdict_band_edges():
    assert "above peak" in verdict_band(1.2)
    with pytest.raises(ValueError):
        verdict_band(-0.1)
    with pytest.raises(ValueError):
        verdict_band(float("nan"))
    for word in ("inference", "small", "MoE", "convergence"):
        assert word in BAND_CAVEAT
