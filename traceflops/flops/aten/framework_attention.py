"""FLOP formulas of framework attention ops: aiter CK, flash-attn 2, vLLM, SageAttention and xformers.

They take packed (variable-length) or paged batches and their own argument orders; packed batches are
counted only when the recorded sizes pin every sequence's lengths down, vLLM's from the step's annotation.
Each formula is registered beside it in TABLE, which registry merges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from traceflops.flops.aten.attention import AttnSpec, attn, attn_mask_kind
from traceflops.flops.aten.shapes import Args, Bad, R, is_int, unknown, valid_shape
from traceflops.flops.aten.table import Formula, FormulaTable

TABLE = FormulaTable()  # this module's registrations, merged by registry
_reg_ns = TABLE.ns


# --------------------------------------------------------------------------------------
# framework (non-aten) ops: aiter, vLLM, flash-attn, SageAttention, xformers
# --------------------------------------------------------------------------------------
# These projects register their kernels with torch.library, so the profiler records them under
# their namespace with their schema's arguments; each registration below names the schema it reads.
# Only leaf formulas count: a wrapper whose child op has a formula (aiter::gemm_a16w16 falling back
# to aten::linear) is counted through the child, one that launches its kernels itself through its own.


# ---- attention over packed (variable-length) batches ----


@dataclass(frozen=True)
class _Varlen:
    """Where a packed ([total, H, D]) attention op keeps its batch description."""

    cu_q: int  # cu_seqlens_q, [B+1]
    max_q: int  # max_seqlen_q
    max_k: int  # max_seqlen_k
    paged: bool = False  # keys always in a paged cache (else: when k is 4-D or 5-D)
    padded_k: tuple[int, ...] = ()  # seqused_k / leftpad_k: keys not contiguous per sequence


def _uniform_lengths(a: Args, vl: _Varlen, total_q: int, k0: int, paged: bool, name: str) -> tuple[int, int, int] | str:
    """(B, sq, sk) when every sequence of a packed batch provably has sq queries and sk keys; else why not.

    Only cu_seqlens' sizes and the max lengths are recorded, never the per-sequence lengths. But when
    total_q == B·max_seqlen_q every sequence has max_seqlen_q queries; the keys then follow from
    total_k == B·max_seqlen_k (contiguous keys), or, since a sequence's keys include its queries' own
    positions (sk >= sq), from max_seqlen_k == max_seqlen_q. q is taken to hold exactly the batch's tokens.
    """
    if not a.is_tensor(vl.cu_q):
        return "cu_seqlens_q not recorded"
    (n1,) = a.shape(vl.cu_q, "cu_seqlens_q", (1,))
    b, mq, mk = n1 - 1, a.c_int(vl.max_q), a.c_int(vl.max_k)
    if b < 1:
        raise Bad(f"{name}: cu_seqlens_q of size {n1} describes no sequence")
    if mq is None or mk is None:
        return "per-sequence lengths are not recorded (nor max_seqlen: no Concrete Inputs)"
    if mq < 1 or mk < 1 or total_q != b * mq:
        return f"per-sequence lengths are not recorded ({total_q} queries in {b} sequences of at most {mq})"
    contiguous = not paged and not any(a.is_tensor(i) for i in vl.padded_k)
    if contiguous and k0 == b * mk:
        return b, mq, mk
    if mk == mq and not (contiguous and k0 < b * mk):
        return b, mq, mk
    return f"per-sequence key lengths are not recorded ({b} sequences of {mq} queries, at most {mk} keys)"


def _kv_geometry(a: Args, ik: int, iv: int, name: str) -> tuple[int, int, int]:
    """(kv heads, key head dim, value head dim) of packed or paged keys and values:
    [tokens, H, D]; [blocks, block_size, H, D] (flash-attn's paged cache); aiter's vectorised cache,
    keys [blocks, H, D/x, block_size, x] and values [blocks, H, block_size/x, D, x]."""
    k = a.shape(ik, "key", (3, 4, 5))
    v = a.shape(iv, "value", (len(k),))
    if len(k) == 3:
        hk, dk, hv, dv = k[1], k[2], v[1], v[2]
    elif len(k) == 4:
        hk, dk, hv, dv = k[2], k[3], v[2], v[3]
    else:
        hk, dk, hv, dv = k[1], k[2] * k[4], v[1], v[3]
    if hk != hv:
        raise Bad(f"{name}: key/value heads differ (k {list(k)}, v {list(v)})")
    return hk, dk, dv


def _varlen_attn(spec: AttnSpec, vl: _Varlen, name: str):
    """An attention op taking packed [total, H, D] inputs (or dense [B, S, H, D] ones), counted on the
    dense view [B, S, H, D] when _uniform_lengths pins the lengths down. The view's keys and values are
    the ones really read (a paged cache's size is not), so its bytes are counted too."""
    dense = attn(spec, name)

    def f(a: Args, out_dims) -> R:
        q = a.shape(spec.q, "query", (3, 4))
        if len(q) == 4:
            return dense(a, out_dims)
        k = a.shape(spec.k, "key", (3, 4, 5))
        got = _uniform_lengths(a, vl, q[0], k[0], vl.paged or len(k) > 3, name)
        if isinstance(got, str):
            return unknown(f"{name}: variable-length batch: {got}", spec.reads, mask=attn_mask_kind(a, spec))
        b, sq, sk = got
        hk, dk, dv = _kv_geometry(a, spec.k, spec.v, name)
        dims = list(a.dims)
        dims[spec.q] = [b, sq, q[1], q[2]]
        dims[spec.k] = [b, sk, hk, dk]
        dims[spec.v] = [b, sk, hk, dv]
        if spec.go is not None:
            go = a.shape(spec.go, "grad_out", (3,))
            if go != (q[0], q[1], dv):
                raise Bad(f"{name}: grad_out {list(go)} does not match the output {[q[0], q[1], dv]}")
            dims[spec.go] = [b, sq, q[1], dv]
        view = a.with_dims(dims)
        r = dense(view, out_dims)
        r.args = view
        return r

    return f


# ---- aiter's CK flash attention ----


def _flag_then_window(a: Args, start: int) -> int | None:
    """Index of is_causal in aiter's attention ops: the first bool followed by two ints (the window
    sizes) from `start` on. The scalars before it differ between aiter releases (min_seqlen_q,
    logits_soft_cap, zero_tensors come and go), that order does not."""
    n = len(a.concrete) if a.concrete is not None else 0
    for i in range(start, n - 2):
        if isinstance(a.raw(i), bool) and is_int(a.raw(i + 1)) and is_int(a.raw(i + 2)):
            return i
    return None


def _aiter_attn(
    q: int,
    k: int,
    v: int,
    scan: int,
    reads: tuple[int, ...],
    name: str,
    go: int | None = None,
    vl: _Varlen | None = None,
    padded_batch: bool = False,
):
    """aiter flash attention: [B, S, H, D] (or packed [total, H, D]) inputs, causal aligned bottom-right
    (aiter's Python side passes only that mask). A bias or ALiBi slopes change no matmul and are ignored.

    padded_batch: mha_fwd releases with sink_size (an int after the window) also take cu_seqlens_q/kv
    (4 and 5 places on), which describe a padded batch whose lengths are not recorded.
    """

    def f(a: Args, out_dims) -> R:
        ci = _flag_then_window(a, scan)
        window = (ci + 1, ci + 2) if ci is not None else ()
        spec = AttnSpec("bshd", q, k, v, go=go, causal=ci, align="bottom_right", window=window, reads=reads)
        if padded_batch and ci is not None and is_int(a.raw(ci + 3)) and (a.is_tensor(ci + 6) or a.is_tensor(ci + 7)):
            return unknown(
                f"{name}: padded batch (cu_seqlens): per-sequence lengths are not recorded",
                reads,
                mask=attn_mask_kind(a, spec),
            )
        fn = _varlen_attn(spec, vl, name) if vl is not None else attn(spec, name)
        return fn(a, out_dims)

    return f


# aiter (ROCm/aiter aiter/ops/mha.py, csrc/include/torch/mha_fwd.h, mha_v3_fwd.h):
# mha_fwd(q, k, v, dropout_p, softmax_scale, is_causal, window_size_left, window_size_right, [sink_size,]
#         return_softmax_lse, return_dropout_randval, [cu_seqlens_q, cu_seqlens_kv,] out, bias, alibi_slopes, ...)
# fmha_v3_fwd(q, k, v, dropout_p, softmax_scale, is_causal, window_size_left, window_size_right,
#             return_softmax_lse, return_dropout_randval, how_v3_bf16_cvt, out, bias, alibi_slopes, gen)
#   q [b, sq, hq, d], k/v [b, sk, hk, d]
_reg_ns(
    ["aiter::mha_fwd", "aiter::fmha_v3_fwd"],
    _aiter_attn(0, 1, 2, 3, (0, 1, 2), "aiter mha_fwd", padded_batch=True),
    attention=True,
)
# mha_bwd(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, is_causal, window_size_left,
#         window_size_right, deterministic, dq, dk, dv, ...); fmha_v3_bwd: the same with is_v3_atomic_fp32,
#         how_v3_bf16_cvt before dq (mha_bwd.h, mha_v3_bwd.h)
_reg_ns(
    ["aiter::mha_bwd", "aiter::fmha_v3_bwd"],
    _aiter_attn(1, 2, 3, 6, (0, 1, 2, 3, 4, 5), "aiter mha_bwd", go=0),
    attention=True,
)
# mha_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, [min_seqlen_q,] dropout_p,
#     softmax_scale, [logits_soft_cap,] zero_tensors, is_causal, window_size_left, window_size_right, ...,
#     block_table, ...); fmha_v3_varlen_fwd: the same arguments up to the window (mha_varlen_fwd.h)
#   q [total_q, hq, d]; k/v [total_k, hk, d], or [blocks, block_size, hk, d] with a block_table
_reg_ns(
    ["aiter::mha_varlen_fwd", "aiter::fmha_v3_varlen_fwd"],
    _aiter_attn(0, 1, 2, 7, (0, 1, 2), "aiter mha_varlen_fwd", vl=_Varlen(3, 5, 6)),
    attention=True,
)
# mha_varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
#     dropout_p, softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right, deterministic,
#     dq, dk, dv, ...); fmha_v3_varlen_bwd: the same with is_v3_atomic_fp32, how_v3_bf16_cvt before dq
_reg_ns(
    ["aiter::mha_varlen_bwd", "aiter::fmha_v3_varlen_bwd"],
    _aiter_attn(1, 2, 3, 10, (0, 1, 2, 3, 4, 5), "aiter mha_varlen_bwd", go=0, vl=_Varlen(6, 8, 9)),
    attention=True,
)
# mha_batch_prefill(q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k, dropout_p,
#     softmax_scale, logits_soft_cap, zero_tensors, is_causal, window_size_left, window_size_right,
#     [sink_size,] return_softmax_lse, return_dropout_randval, out, ...) (mha_batch_prefill.h)
#   q [total_q, hq, d]; k/v a paged cache: [slots, hk, d] (page size 1) or the vectorised 5-D layout
_reg_ns(
    "aiter::mha_batch_prefill",
    _aiter_attn(0, 1, 2, 8, (0, 1, 2), "aiter mha_batch_prefill", vl=_Varlen(3, 6, 7, paged=True)),
    attention=True,
)


# ---- flash-attn 2.x ----
# Dao-AILab/flash-attention flash_attn/flash_attn_interface.py registers these with
# torch.library.custom_op as "flash_attn::..." (some releases "flashattn::..."); q/k/v [B, S, H, D],
# causal aligned bottom-right. Positions:
# _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
#     softcap, alibi_slopes, return_softmax)
# _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
#     window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state)
# _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
#     softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes, return_softmax,
#     block_table, leftpad_k, seqused_k)  -- k/v [blocks, block_size, Hk, D] with a block_table
# _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
#     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
#     softcap, alibi_slopes, deterministic, rng_state)
for _ns in ("flash_attn", "flashattn"):
    _reg_ns(
        f"{_ns}::_flash_attn_forward",
        attn(
            AttnSpec("bshd", 0, 1, 2, causal=5, align="bottom_right", window=(6, 7), reads=(0, 1, 2)),
            "_flash_attn_forward",
        ),
        attention=True,
    )
    _reg_ns(
        f"{_ns}::_flash_attn_backward",
        attn(
            AttnSpec("bshd", 1, 2, 3, go=0, causal=11, align="bottom_right", window=(12, 13), reads=(0, 1, 2, 3, 4, 5)),
            "_flash_attn_backward",
        ),
        attention=True,
    )
    _reg_ns(
        f"{_ns}::_flash_attn_varlen_forward",
        _varlen_attn(
            AttnSpec("bshd", 0, 1, 2, causal=9, align="bottom_right", window=(10, 11), reads=(0, 1, 2)),
            _Varlen(3, 5, 6, padded_k=(16, 17)),
            "_flash_attn_varlen_forward",
        ),
        attention=True,
    )
    _reg_ns(
        f"{_ns}::_flash_attn_varlen_backward",
        _varlen_attn(
            AttnSpec("bshd", 1, 2, 3, go=0, causal=15, align="bottom_right", window=(16, 17), reads=(0, 1, 2, 3, 4, 5)),
            _Varlen(9, 11, 12),
            "_flash_attn_varlen_backward",
        ),
        attention=True,
    )


# ---- vLLM ----

_VLLM_NO_STATS = "vLLM attention: the sequence lengths are in the step's annotation, which this op lacks"
_VLLM_PART = r"(\d{1,16})\(sq(\d{1,16})sk(\d{1,16})sqsq(\d{1,16})sqsk(\d{1,16})\)"
_VLLM_STEP = re.compile(rf"execute_\d{{1,16}}_context_{_VLLM_PART}_generation_{_VLLM_PART}")


def vllm_batch_stats(annotation: str) -> dict | None:
    """Σsq, Σsk, Σsq², Σsq·sk over a vLLM step's sequences, from the name of its user_annotation.

    vLLM's profiler names a step execute_<tokens>_context_<n>(sq…sk…sqsq…sqsk…)_generation_<n>(…): the four
    sums over its prefill (context) and its decode (generation) requests, sq a request's new queries and
    sk its keys, cached ones included (SGLang's roofline annotations have the same form). The two parts are
    summed. None when the name has another form or numbers no batch can have: each request has a query and
    its keys include its queries, so n <= Σsq <= Σsq² <= Σsq·sk, Σsq <= Σsk, Σsq² <= (Σsq)², Σsq·sk <= Σsq·Σsk.
    """
    if not isinstance(annotation, str) or len(annotation) > 400:
        return None
    m = _VLLM_STEP.fullmatch(annotation.strip())
    if m is None:
        return None
    g = [int(x) for x in m.groups()]
    out = {"sq": 0, "sk": 0, "sqsq": 0, "sqsk": 0}
    for n, sq, sk, sqsq, sqsk in (g[:5], g[5:]):
        if (n == 0) != (sq == 0) or not (n <= sq <= sqsq <= sqsk and sq <= sk and sqsq <= sq * sq and sqsk <= sq * sk):
            return None
        out["sq"] += sq
        out["sk"] += sk
        out["sqsq"] += sqsq
        out["sqsk"] += sqsk
    return out


def _vllm_attn(out: int | None):
    """A step's attention over its sequences, each sq new queries over sk keys (the cached and its own),
    causal aligned bottom-right: sq·sk − sq(sq−1)/2 kept pairs of the sq·sk. FLOPs 2·Hq·(Dqk+Dv)·Σsq·sk.
    The lengths are not arguments: context["seq_stats"] (vllm_batch_stats of the step's annotation)
    gives them. Bytes: the queries, the keys and values of all sk positions (in the key's dtype), the output.
    """

    def f(a: Args, out_dims) -> R:
        t, hq, dqk = a.shape(0, "query", (3,))
        has_out = out is not None and a.is_tensor(out)
        if out is not None and has_out:
            o = a.shape(out, "output", (3,))
            if o[:2] != (t, hq):
                raise Bad(f"vLLM attention: output {list(o)} does not fit query [{t}, {hq}, {dqk}]")
            dv = o[2]
        else:
            dv = a.shape(2, "value", (3,))[2]
        hk = a.shape(1, "key", (3,))[1] if a.is_tensor(1) else None
        if hk is not None and (hk == 0 or hq % hk != 0):
            raise Bad(f"vLLM attention: query heads {hq} not a multiple of key heads {hk}")
        stats = a.context.get("seq_stats") if a.context is not None else None
        if stats is None:
            return unknown(_VLLM_NO_STATS, (0,))
        vals: list[Any] = [stats.get(x) for x in ("sq", "sk", "sqsq", "sqsk")] if isinstance(stats, dict) else []
        if len(vals) != 4 or not all(is_int(x) and x >= 0 for x in vals):
            raise Bad(f"vLLM attention: malformed seq_stats {stats!r}")
        sq, sk, sqsq, sqsk = vals
        if sq != t:
            return unknown(f"vLLM attention: the step's annotation counts {sq} query tokens, the op {t}", (0,))
        kept = sqsk - (sqsq - sq) // 2
        if not sq <= sqsq <= sqsk:
            raise Bad(f"vLLM attention: inconsistent seq_stats {stats!r}")
        per_pair = 2 * (dqk + dv)
        r = R(
            hq * sqsk * per_pair,
            hq * kept * per_pair,
            mask="causal",
            reads=(0,),
            outs=[((t, hq, dv), a.type(out if has_out else 0))],
        )
        if hk is None:
            r.outs = None
        else:
            r.extra_reads = [((sk, hk, dqk), a.type(1)), ((sk, hk, dv), a.type(2))]
        return r

    return f


# vLLM (vllm/attention/layer.py, later vllm/model_executor/layers/attention/attention.py;
# direct_register_custom_op):
# unified_attention_with_output(query, key, value, output, layer_name, output_scale, output_block_scale,
#     kv_cache_dummy_dep) -> ();  unified_attention(query, key, value, layer_name) -> Tensor
#   query [T, Hq, D], key/value [T, Hkv, D] (this step's new tokens), output [T, Hq, Dv]
_reg_ns("vllm::unified_attention_with_output", _vllm_attn(3), attention=True)
_reg_ns("vllm::unified_attention", _vllm_attn(None), attention=True)


# ---- SageAttention 2 ----


def _sage(lay: int, name: str):
    """SageAttention: Q·Kᵀ in int8, P·V in fp16 or fp8. The value operand arrives quantised into a padded,
    transposed layout, so the count takes the key's geometry with the output's head dim. The kernels'
    causal alignment is not documented: with Sq != Sk a causal mask counts as 'unknown'."""

    def f(a: Args, out_dims) -> R:
        reads = (0, 1, 2, 4, 5)
        layouts: dict[int | None, str] = {0: "bshd", 1: "bhsd"}
        layout = layouts.get(a.c_int(lay))
        if layout is None:
            return unknown(f"{name}: tensor_layout not recorded", reads)
        q = a.shape(0, "query", (4,))
        k = a.shape(1, "key", (4,))
        o = a.shape(3, "output", (4,))
        s = 1 if layout == "bshd" else 2
        causal = lay + 1 if not (a.c_bool(lay + 1) and q[s] != k[s]) else None
        view = a.with_dims(list(a.dims) + [list(k[:-1]) + [o[-1]]])
        r = attn(AttnSpec(layout, 0, 1, len(a.dims), causal=causal, reads=reads), name)(view, None)
        r.outs = [(o, a.type(3))]
        return r

    return f


# thu-ml/SageAttention sageattention/sm80_compile.py, sm89_compile.py, sm90_compile.py (torch.library.custom_op):
# ...(query, key, value, output, query_scale, key_scale, [value_scale, [value_mean,]] tensor_layout, is_causal,
#     qk_quant_gran, sm_scale, return_lse); tensor_layout 0: [B, S, H, D], 1: [B, H, S, D]
for _n, _lay in (
    ("sageattention::qk_int8_sv_f16_accum_f16_attn", 6),
    ("sageattention::qk_int8_sv_f16_accum_f32_attn", 6),
    ("sageattention::qk_int8_sv_f16_accum_f16_attn_inst_buf", 6),
    ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", 7),
    ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 7),
    ("sageattention_sm89::qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf", 7),
    ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_fuse_v_mean_attn", 8),
    ("sageattention_sm90::qk_int8_sv_f8_accum_f32_attn_inst_buf", 6),
    ("sageattention_sm90::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 7),
):
    _reg_ns(_n, _sage(_lay, _n.split("::")[1]), attention=True)


# ---- xformers ----


def _fold_groups(fn: Formula, idxs: tuple[int, ...]) -> Formula:
    """xformers' grouped-query inputs [B, M, G, H, K] counted as [B, M, G·H, K]."""

    def f(a: Args, out_dims) -> R:
        dims = list(a.dims)
        for i in idxs:
            d = dims[i] if 0 <= i < len(dims) else None
            if isinstance(d, (list, tuple)) and len(d) == 5 and valid_shape(d):
                dims[i] = [d[0], d[1], d[2] * d[3], d[4]]
        if dims == list(a.dims):
            return fn(a, out_dims)
        view = a.with_dims(dims)
        r = fn(view, out_dims)
        r.args = view
        return r

    return f


def _newest_schema(fn: Formula, min_args: int, name: str) -> Formula:
    def f(a: Args, out_dims) -> R:
        if len(a.dims) < min_args:
            return unknown(f"{name}: schema of an older xformers release (argument positions not confirmed)", (0, 1, 2))
        return fn(a, out_dims)

    return f


# facebookresearch/xformers xformers/csrc/attention/attention.cpp, [B, M, H, K] (or [B, M, G, H, K]) inputs;
# custom_mask_type 0 none, 1 causal from the top left, 2 from the bottom right:
# efficient_attention_forward_cutlass(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
#     max_seqlen_k, dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
#     (the schema of aten::_efficient_attention_forward; older releases had 5- and 8-argument ones)
_reg_ns(
    "xformers::efficient_attention_forward_cutlass",
    _newest_schema(
        _fold_groups(
            attn(
                AttnSpec("bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(13,), varlen=(4, 5, 12), reads=(0, 1, 2, 3)),
                "xformers efficient_attention_forward_cutlass",
            ),
            (0, 1, 2),
        ),
        11,
        "xformers efficient_attention_forward_cutlass",
    ),
    attention=True,
)
# efficient_attention_forward_ck(query, key, value, attn_bias, seqstart_q, seqstart_k, max_seqlen_q, dropout_p,
#     compute_logsumexp, custom_mask_type, scale, seqlen_k, window_size[, block_tables, page_size])
_reg_ns(
    "xformers::efficient_attention_forward_ck",
    _fold_groups(
        attn(
            AttnSpec(
                "bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(12,), varlen=(4, 5, 11), paged=13, reads=(0, 1, 2, 3)
            ),
            "xformers efficient_attention_forward_ck",
        ),
        (0, 1, 2),
    ),
    attention=True,
)
# xformers/ops/fmha/flash.py (torch.library.custom_op; with PyTorch's flash kernels it calls
# aten::_flash_attention_forward/_backward, which are then the counted leaves); causal bottom-right:
# xformers_flash::flash_fwd(query, key, value, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
#     max_seqlen_k, p, softmax_scale, is_causal, window_left, window_right, return_softmax, block_tables)
# xformers_flash::flash_bwd(grads_share_storage, grad, query, key, value, out, lse, cu_seqlens_q,
#     cu_seqlens_k, max_seqlen_q, max_seqlen_k, p, softmax_scale, is_causal, window_left, window_right, rng_state)
#   [B, M, H, K], or packed [total, H, K] with cu_seqlens (a block-diagonal bias: variable lengths)
_reg_ns(
    "xformers_flash::flash_fwd",
    _varlen_attn(
        AttnSpec("bshd", 0, 1, 2, causal=10, align="bottom_right", window=(11, 12), reads=(0, 1, 2)),
        _Varlen(3, 6, 7, padded_k=(5,)),
        "xformers flash_fwd",
    ),
    attention=True,
)
_reg_ns(
    "xformers_flash::flash_bwd",
    _varlen_attn(
        AttnSpec("bshd", 2, 3, 4, go=1, causal=13, align="bottom_right", window=(14, 15), reads=(1, 2, 3, 4, 5, 6)),
        _Varlen(7, 9, 10),
        "xformers flash_bwd",
    ),
    primary=1,
    attention=True,
)
