"""Hugging Face transformers training steps against FlopCounterMode's truth over the same steps.

`fixtures/generate_hf.py` profiled tiny Llama (GQA, non-square) and GPT-2 (Conv1D, tied
head) models built from configs, trained by transformers' own modeling code: SDPA and
eager attention, reentrant and non-reentrant `gradient_checkpointing_enable`, and
per-layer `torch.compile` with checkpointing inside; it measured each phase's FLOPs with
torch.utils.flop_counter while the same steps ran again.  See fixtures/hf/README.md.

Only the generator needs transformers; this file reads what it wrote, and skips when
that is absent.  Every case is exact.
"""

import functools
import json

import pytest

from tests.builders import FIXTURES
from traceflops.run.load import analyze
from traceflops.run.options import model_options

HF = FIXTURES / "hf"
TRUTH_PATH = HF / "truth.json"
CASES = ("llama_sdpa", "llama_eager", "llama_ckpt_reentrant", "llama_ckpt_nonreentrant",
         "llama_compiled_ckpt", "gpt2", "gpt2_ckpt")
LORA_CASES = ("llama_lora",)  # peft adapters on a frozen base: not the model's 6N work
PHASES = ("forward", "backward", "recompute", "optimizer", "other")
REGENERATE = "run `python fixtures/generate_hf.py` (needs transformers)"

@functools.cache
def all_truth():
    if not TRUTH_PATH.exists():
        return None
    return json.loads(TRUTH_PATH.read_text())


def truth_of(name):
    truth = all_truth()
    if truth is None:
        pytest.skip(f"{TRUTH_PATH} absent: {REGENERATE}")
    if name not in truth or not trace_path(name).exists():
        pytest.skip(f"{name} not generated ({trace_path(name)}): {REGENERATE}")
    return truth[name]


def trace_path(name):
    return HF / f"{name}.json.gz"


@functools.cache
def plain_analysis(name):
    return analyze(str(trace_path(name)))


def steps_of(a):
    return list(a.steps.sort("ts").iter_rows(named=True))


# ---------------------------------------------------------------- the analyzer against the truth


def test_every_case_is_covered():
    truth = all_truth()
    if truth is None:
        pytest.skip(f"{TRUTH_PATH} absent: {REGENERATE}")
    assert set(truth) == set(CASES) | set(LORA_CASES)


@pytest.mark.parametrize("column, key", [("flops", "flops"), ("count", "matmul_count")])
@pytest.mark.parametrize("name", CASES + LORA_CASES)
def test_per_phase_flops_and_matmul_counts_equal_flopcountermode_exactly(name, column, key):
    truth = truth_of(name)
    got = steps_of(plain_analysis(name))
    assert len(got) == len(truth["steps"])
    for s, t in zip(got, truth["steps"]):
        assert {p: s[f"{column}_{p}"] for p in PHASES} == t[key], name


def by_hand(cfg):
    """(N, L, H, Q) from the config's numbers: N counts every matmul weight once (PaLM), the LM
    head included (once, tied or not), embeddings, norms and biases excluded."""
    if cfg["model_type"] == "llama":
        d, L, H, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["vocab_size"]
        K, f = cfg["num_key_value_heads"], cfg["intermediate_size"]
        Q = cfg.get("head_dim") or d // H
        per_layer = d * H * Q + 2 * d * K * Q + H * Q * d + 3 * d * f  # q, k, v (GQA), o; gate, up, down
        return L * per_layer + V * d, L, H, Q
    assert cfg["model_type"] == "gpt2"
    d, L, H, V = cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["vocab_size"]
    f = cfg["n_inner"] or 4 * d
    return L * (3 * d * d + d * d + 2 * d * f) + V * d, L, H, d // H  # c_attn, c_proj; c_fc, c_proj


@pytest.mark.parametrize("name", CASES)
def test_model_flops_from_the_hf_config(name):
    truth = truth_of(name)
    cfg, m = truth["config"], truth["model"]
    T, tok = m["seq_len"], m["tokens_per_step"]
    N, L, H, Q = by_hand(cfg)
    assert (N, L, H, Q) == (m["params_matmul"], m["layers"], m["heads"], m["head_dim"])
    a = analyze(str(trace_path(name)), model_options(model_config=cfg, seq_len=T, tokens_per_step=tok))
    per_token = 6 * N + 12 * L * H * Q * T
    assert a.model["source"] == "config" and a.model["mode"] == "training"
    assert a.model["params_matmul"] == N
    assert a.model["seq_len"] == T
    assert a.model["flops_per_token"] == per_token
    assert a.model["flops_per_step"] == per_token * tok


@pytest.mark.parametrize("name", CASES)
def test_seq_len_comes_from_the_trace_not_the_config(name):
    """The configs' maximum context (4096 / 1024) is far above the T the steps ran."""
    truth = truth_of(name)
    cfg, T = truth["config"], truth["model"]["seq_len"]
    assert cfg.get("max_position_embeddings", cfg.get("n_positions")) > T
    a = analyze(str(trace_path(name)), model_options(model_config=cfg, tokens_per_step=truth["model"]["tokens_per_step"]))
    assert a.model["seq_len"] == T


@pytest.mark.parametrize("name", CASES)
def test_tokens_inferred_from_the_embedding(name):
    truth = truth_of(name)
    m = truth["model"]
    a = analyze(str(trace_path(name)), model_options(model_config=truth["config"], seq_len=m["seq_len"]))
    assert a.model["tokens_per_step"] == m["tokens_per_step"]


# ---------------------------------------------------------------- the truth itself (no analyzer)


def layer_forward(truth):
    """Forward FLOPs of one decoder layer for one micro-batch: (Linear GEMMs in order, attention)."""
    s = truth["shape"]
    B, T, d, H, K, Q, f = s["B"], s["T"], s["d"], s["H"], s["K"], s["Q"], s["f"]
    tok = B * T
    if truth["family"] == "llama":
        io = [(d, H * Q), (d, K * Q), (d, K * Q), (H * Q, d), (d, f), (d, f), (f, d)]
    else:
        io = [(d, 3 * d), (d, d), (d, f), (f, d)]
    return [2 * tok * i * o for i, o in io], 4 * B * H * T * T * Q


def per_mb(truth, step, key, field="flops"):
    v = truth["steps"][step][field][key]
    assert v % truth["microbatches"] == 0
    return v // truth["microbatches"]


@pytest.mark.parametrize("name", CASES)
def test_truth_forward_and_backward_are_palms_numbers(name):
    """Every case does the model's work once: forward 2N + 4·L·H·Q·T, backward twice that, per token."""
    truth = truth_of(name)
    m = truth["model"]
    attn = m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]
    for t in truth["steps"]:
        assert t["flops"]["forward"] == (2 * m["params_matmul"] + 4 * attn) * m["tokens_per_step"]
        assert t["flops"]["backward"] == 2 * t["flops"]["forward"]
        assert t["flops"]["optimizer"] == t["flops"]["other"] == 0
        assert t["trace_matmul_events"] == sum(t["matmul_count"].values()) + truth["phantom_matmul_events_per_step"]


# recompute per layer and micro-batch: which Linears re-run (indices into layer_forward's list),
# whether the attention forward re-runs, and the ops counted
RECOMPUTE = {
    # SDPA CPU flash backward: its in-kernel score recompute only
    "llama_sdpa": ([], False, 0),
    "llama_eager": ([], False, 0),
    "gpt2": ([], False, 0),  # dropout 0.1: SDPA runs the math kernel (bmm), no score recompute
    "llama_ckpt_reentrant": (list(range(7)), True, 8),
    # early stop: down_proj's mm is dispatched but raises before its kernel (a phantom event)
    "llama_ckpt_nonreentrant": (list(range(6)), True, 7),
    # inductor's recompute inside each layer's CompiledFunctionBackward: the same ops
    "llama_compiled_ckpt": (list(range(6)), True, 7),
    # the layer ends in a dropout, which saves its mask after mlp.c_proj: c_proj re-runs
    "gpt2_ckpt": (list(range(4)), True, 6),
}


@pytest.mark.parametrize("name", CASES)
def test_truth_recompute_closed_form(name):
    truth = truth_of(name)
    lins, attn = layer_forward(truth)
    which, attn_again, ops = RECOMPUTE[name]
    L = truth["shape"]["L"]
    flash = truth["steps"][0]["trace_matmul_by_name"].get("aten::_scaled_dot_product_flash_attention_for_cpu", 0) > 0
    score = attn // 2 if flash else 0  # 2·B·H·T²·Q per attention backward
    for k in range(len(truth["steps"])):
        want = L * (sum(lins[i] for i in which) + (attn if attn_again else 0) + score)
        assert per_mb(truth, k, "recompute") == want, name
        assert per_mb(truth, k, "recompute", "matmul_count") == L * ops, name
        assert truth["steps"][k]["sdpa_score_recompute_flops"] == truth["microbatches"] * L * score


def test_truth_compiled_case_has_two_regions_per_micro_batch():
    truth = truth_of("llama_compiled_ckpt")
    n = truth["compiled"]["compiled_function_events_per_step"]
    assert len(n) == len(truth["steps"]) and min(n) >= 2 * truth["microbatches"]


# ---------------------------------------------------------------- frozen weights (peft LoRA)


def test_lora_parts_without_weight_gradients_are_named_as_frozen():
    """The base model is frozen: its MLP and LM head GEMMs run forward and data gradient only, 2/3 of 6N.

    The truth's own numbers say so: the backward executed less than twice the forward
    (no weight gradients), and the warning must name frozen weights, not T, tokens or
    world size.
    """
    name = LORA_CASES[0]
    truth = truth_of(name)
    m = truth["model"]
    for t in truth["steps"]:
        assert t["flops"]["backward"] < 2 * t["flops"]["forward"] * 0.75
    a = analyze(str(trace_path(name)), model_options(model_config=truth["config"], tokens_per_step=m["tokens_per_step"]))
    parts = {p["part"]: p["trace_flops_per_step"] / p["model_flops_per_step"] for p in a.model["by_part"]}
    assert parts["mlp"] == pytest.approx(2 / 3) and parts["lm_head"] == pytest.approx(2 / 3)
    (w,) = [w for w in a.warnings if w.startswith("model FLOPs per step")]
    assert "frozen" in w and "LoRA" in w and "mlp" in w and "lm_head" in w
    assert "check T" not in w and "world size" not in w


def test_by_part_counts_the_weight_gradients():
    """GPT-2 trained in full: every part's GEMMs ran forward, data gradient and weight gradient on every token, so
    each part's traced FLOPs are its 6 · N_part · tokens exactly (a weight gradient dY^T·X has the weight's shape as
    its output, not as an operand)."""
    truth = truth_of("gpt2")
    m = truth["model"]
    a = analyze(str(trace_path("gpt2")), model_options(model_config=truth["config"], tokens_per_step=m["tokens_per_step"]))
    parts = {p["part"]: p for p in a.model["by_part"]}
    assert set(parts) == {"attention", "mlp", "lm_head"}
    for p in parts.values():
        assert p["trace_flops_per_step"] == pytest.approx(p["model_flops_per_step"], rel=1e-12), p


def test_lora_mfu_above_hfu_is_said_expected_not_a_counting_error():
    truth = truth_of(LORA_CASES[0])
    m = truth["model"]
    a = analyze(str(trace_path(LORA_CASES[0])), model_options(model_config=truth["config"], tokens_per_step=m["tokens_per_step"],
                                                                peak_tflops=1))
    assert a.totals["mfu"] > a.totals["hfu"]  # 6N counts the frozen weights' gradients, which never ran
    (w,) = [w for w in a.warnings if w.startswith("MFU ") and "exceeds HFU" in w]
    assert "frozen weights" in w and "not a counting error" in w and "check the model description" not in w
