"""FLOP formulas of PyTorch's attention ops: SDPA and its math, flash, efficient, cuDNN and overrideable kernels.

Each formula is registered beside it in TABLE, which registry merges. Attention is counted as the full Sq×Sk
computation (FlopCounterMode's convention); `effective` keeps only the causal mask's (query, key) pairs. The
framework attention ops reuse attn / AttnSpec from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceflops.flops.aten.matmul import broadcast
from traceflops.flops.aten.shapes import Args, Bad, R, unknown, valid_shape
from traceflops.flops.aten.table import FormulaTable

TABLE = FormulaTable()  # this module's registrations, merged by registry
_reg = TABLE.aten


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------


def _clamped_sum(t: int, m: int) -> int:
    """sum_{x=0}^{t} clamp(x, 0, m) for integer t (0 when t < 0)."""
    if t < 0:
        return 0
    if t <= m:
        return t * (t + 1) // 2
    return m * (m + 1) // 2 + (t - m) * m


def causal_unmasked(sq: int, sk: int, align: str = "top_left") -> int:
    """Number of (query, key) pairs a causal mask keeps.

    top_left (torch's is_causal, tril(ones(Sq, Sk))): row i keeps min(i+1, Sk) keys.
    bottom_right (FlashAttention-2 kernels): row i keeps clamp(i + Sk - Sq + 1, 0, Sk) keys.
    """
    c = 1 if align == "top_left" else sk - sq + 1
    # sum_{i=0}^{sq-1} clamp(i + c, 0, sk)
    return _clamped_sum(c + sq - 1, sk) - _clamped_sum(c - 1, sk)


@dataclass(frozen=True)
class AttnSpec:
    layout: str  # 'bhsd' (SDPA ops), 'bshd' (flash/efficient kernels), 'any' (SDPA API)
    q: int
    k: int
    v: int
    go: int | None = None  # grad_out (backward)
    causal: int | None = None  # index of bool is_causal
    mask_type: int | None = None  # index of int custom_mask_type (efficient kernels)
    align: str = "top_left"
    masks: tuple[int, ...] = ()  # attn_mask / attn_bias tensor arguments
    window: tuple[int, ...] = ()  # sliding-window size arguments
    varlen: tuple[int, ...] = ()  # cu_seqlens arguments (efficient kernels)
    paged: int | None = None  # block_table (paged KV cache)
    reads: tuple[int, ...] = ()
    math: bool = False  # unfused math path: computes the full score matrix


def attn(spec: AttnSpec, name: str):
    def f(a: Args, out_dims) -> R:
        bwd = spec.go is not None
        mask = attn_mask_kind(a, spec)
        reads = spec.reads
        if spec.layout == "bshd":
            q = a.shape(spec.q, "query", (3, 4))
            if len(q) == 3:
                return unknown(
                    f"{name}: variable-length (packed) batch: per-sequence lengths (cum_seq values) are not recorded",
                    reads,
                    mask=mask,
                )
        if spec.varlen and any(a.is_tensor(i) and _nonempty(a.dims[i]) for i in spec.varlen):
            return unknown(
                f"{name}: variable-length batch: per-sequence lengths (cu_seqlens values) are not recorded",
                reads,
                mask=mask,
            )
        if spec.paged is not None and a.is_tensor(spec.paged):
            return unknown(f"{name}: paged KV cache (block_table): key length not recorded", reads, mask=mask)
        if spec.layout == "any":
            q = a.shape(spec.q, "query", min_ndim=2)
            k = a.shape(spec.k, "key", min_ndim=2)
            v = a.shape(spec.v, "value", min_ndim=2)
            sq, dq, sk, dk, skv, dv = q[-2], q[-1], k[-2], k[-1], v[-2], v[-1]
            if len(q) >= 3 and len(k) >= 3 and k[-3] != q[-3]:
                # GQA (enable_gqa): key/value heads are repeated up to the query heads
                if k[-3] == 0 or q[-3] % k[-3] != 0:
                    raise Bad(f"{name}: query heads {q[-3]} not a multiple of key heads {k[-3]}")
                k = k[:-3] + (q[-3],) + k[-2:]
            batch = broadcast(q[:-2], k[:-2], name)
            bh = math.prod(batch)
            out_shape = batch + (sq, dv)
        else:
            q = a.shape(spec.q, "query", (4,))
            k = a.shape(spec.k, "key", (4,))
            v = a.shape(spec.v, "value", (4,))
            if spec.layout == "bhsd":
                (b, hq, sq, dq), (bk, hk, sk, dk), (bv, hv, skv, dv) = q, k, v
            else:
                (b, sq, hq, dq), (bk, sk, hk, dk), (bv, skv, hv, dv) = q, k, v
            if not (b == bk == bv):
                raise Bad(f"{name}: batch sizes differ (q {list(q)}, k {list(k)}, v {list(v)})")
            if hk != hv:
                raise Bad(f"{name}: key/value heads differ (k {list(k)}, v {list(v)})")
            if hk == 0 or hq % hk != 0:
                raise Bad(f"{name}: query heads {hq} not a multiple of key/value heads {hk}")
            bh = b * hq  # GQA counted on the expanded heads, as FlopCounterMode does
            out_shape = (b, hq, sq, dv) if spec.layout == "bhsd" else (b, sq, hq, dv)
        if dq != dk:
            raise Bad(f"{name}: query/key head dims differ ({dq} vs {dk})")
        if sk != skv:
            raise Bad(f"{name}: key/value lengths differ ({sk} vs {skv})")
        if spec.go is not None:  # bwd
            go = a.shape(spec.go, "grad_out", min_ndim=2)
            if tuple(go) != tuple(out_shape):
                raise Bad(f"{name}: grad_out {list(go)} does not match the output {list(out_shape)}")
            per_pair = 2 * (3 * dq + 2 * dv)  # QK^T recompute, dO·V^T, P^T·dO, dS·K, dS^T·Q
            recompute_pp = 2 * dq
        else:
            per_pair = 2 * (dq + dv)  # Q·K^T, P·V
            recompute_pp = 0
        flops = bh * sq * sk * per_pair
        recompute = bh * sq * sk * recompute_pp
        if mask == "causal" and not spec.math:
            align = spec.align
            if spec.mask_type is not None and a.c_int(spec.mask_type) == 2:
                align = "bottom_right"
            effective = bh * causal_unmasked(sq, sk, align) * per_pair
        else:
            effective = flops
        if bwd:
            outs = [
                (tuple(q), a.type(spec.q)),
                (tuple(a.dims[spec.k]), a.type(spec.k)),
                (tuple(a.dims[spec.v]), a.type(spec.v)),
            ]
        else:
            outs = [(tuple(out_shape), a.type(spec.q))]
        r = R(flops, effective, recompute, mask, reads=reads, outs=outs)
        r.single_out = not bwd
        return r

    return f


def _nonempty(d) -> bool:
    return isinstance(d, (list, tuple)) and len(d) > 0 and valid_shape(d) and math.prod(d) > 0


def attn_mask_kind(a: Args, spec: AttnSpec) -> str:
    if any(a.is_tensor(i) for i in spec.masks):
        return "unknown"
    for i in spec.window:
        wv = a.c_int(i)
        if wv is not None and wv >= 0 and not (spec.mask_type is not None and wv == 0):
            return "unknown"
    if spec.mask_type is not None:
        mt = a.c_int(spec.mask_type)
        return {0: "full", 1: "causal", 2: "causal"}.get(mt, "unknown") if mt is not None else "unknown"
    if spec.causal is not None:
        c = a.c_bool(spec.causal)
        if c is None:
            return "unknown"
        return "causal" if c else "full"
    return "unknown"


# ---- registrations ----

# attention (positions of is_causal / masks per op signature, torch 2.13)
# scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, *, scale, enable_gqa)
_reg(
    "scaled_dot_product_attention",
    attn(AttnSpec("any", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3)), "scaled_dot_product_attention"),
    attention=True,
)
# _scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, *, scale,
# enable_gqa)
_reg(
    ["_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps"],
    attn(
        AttnSpec("any", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3, 6), math=True),
        "_scaled_dot_product_attention_math",
    ),
    attention=True,
)
# _scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
# FlashAttention-2 aligns a non-square causal mask bottom-right (SDPA never sends it one).
_reg(
    "_scaled_dot_product_flash_attention",
    attn(
        AttnSpec("bhsd", 0, 1, 2, causal=4, align="bottom_right", reads=(0, 1, 2)),
        "_scaled_dot_product_flash_attention",
    ),
    attention=True,
)
# _scaled_dot_product_flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q,
#     cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale)
_reg(
    "_scaled_dot_product_flash_attention_backward",
    attn(
        AttnSpec("bhsd", 1, 2, 3, go=0, causal=11, align="bottom_right", reads=(0, 1, 2, 3, 4, 5)),
        "_scaled_dot_product_flash_attention_backward",
    ),
    attention=True,
)
# _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
_reg(
    "_scaled_dot_product_flash_attention_for_cpu",
    attn(
        AttnSpec("bhsd", 0, 1, 2, causal=4, masks=(5,), reads=(0, 1, 2, 5)),
        "_scaled_dot_product_flash_attention_for_cpu",
    ),
    attention=True,
)
# _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
#     dropout_p, is_causal, *, attn_mask, scale)
_reg(
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    attn(
        AttnSpec("bhsd", 1, 2, 3, go=0, causal=7, masks=(8,), reads=(0, 1, 2, 3, 4, 5, 8)),
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
    attention=True,
)
# _scaled_dot_product_efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *,
# scale)
_reg(
    "_scaled_dot_product_efficient_attention",
    attn(
        AttnSpec("bhsd", 0, 1, 2, causal=6, masks=(3,), reads=(0, 1, 2, 3)), "_scaled_dot_product_efficient_attention"
    ),
    attention=True,
)
# _scaled_dot_product_efficient_attention_backward(grad_out_, query, key, value, attn_bias, out, logsumexp,
#     philox_seed, philox_offset, dropout_p, grad_input_mask, is_causal, *, scale)
_reg(
    "_scaled_dot_product_efficient_attention_backward",
    attn(
        AttnSpec("bhsd", 1, 2, 3, go=0, causal=11, masks=(4,), reads=(0, 1, 2, 3, 4, 5, 6)),
        "_scaled_dot_product_efficient_attention_backward",
    ),
    attention=True,
)
# _scaled_dot_product_cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p,
#     is_causal, return_debug_mask, *, scale)
_reg(
    "_scaled_dot_product_cudnn_attention",
    attn(AttnSpec("bhsd", 0, 1, 2, causal=6, masks=(3,), reads=(0, 1, 2, 3)), "_scaled_dot_product_cudnn_attention"),
    attention=True,
)
# _scaled_dot_product_cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed,
#     philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale)
_reg(
    "_scaled_dot_product_cudnn_attention_backward",
    attn(
        AttnSpec("bhsd", 1, 2, 3, go=0, causal=14, masks=(8,), reads=(0, 1, 2, 3, 4, 5, 8)),
        "_scaled_dot_product_cudnn_attention_backward",
    ),
    attention=True,
)
# _scaled_dot_product_fused_attention_overrideable(query, key, value, attn_bias, dropout_p, is_causal, ...)
_reg(
    "_scaled_dot_product_fused_attention_overrideable",
    attn(
        AttnSpec("bhsd", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3)),
        "_scaled_dot_product_fused_attention_overrideable",
    ),
    attention=True,
)
# ..._backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
#     cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
_reg(
    "_scaled_dot_product_fused_attention_overrideable_backward",
    attn(
        AttnSpec("bhsd", 1, 2, 3, go=0, causal=13, masks=(4,), reads=(0, 1, 2, 3, 4, 6, 7)),
        "_scaled_dot_product_fused_attention_overrideable_backward",
    ),
    attention=True,
)
# _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
#     return_debug_mask, *, scale, window_size_left, window_size_right, seqused_k, alibi_slopes,
#     block_table, num_splits)   -- q/k/v are [B, S, H, D] (or packed [total, H, D])
_reg(
    "_flash_attention_forward",
    attn(
        AttnSpec("bshd", 0, 1, 2, causal=8, align="bottom_right", window=(11, 12), paged=15, reads=(0, 1, 2)),
        "_flash_attention_forward",
    ),
    attention=True,
)
# _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
#     max_k, dropout_p, is_causal, rng_state, unused, *, scale, window_size_left, window_size_right)
_reg(
    "_flash_attention_backward",
    attn(
        AttnSpec("bshd", 1, 2, 3, go=0, causal=11, align="bottom_right", window=(15, 16), reads=(0, 1, 2, 3, 4, 5)),
        "_flash_attention_backward",
    ),
    attention=True,
)
# _efficient_attention_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
#     max_seqlen_k, dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
# custom_mask_type: 0 none, 1 causal from top-left, 2 causal from bottom-right
_reg(
    "_efficient_attention_forward",
    attn(
        AttnSpec("bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(13,), varlen=(4, 5), reads=(0, 1, 2, 3)),
        "_efficient_attention_forward",
    ),
    attention=True,
)
# _efficient_attention_backward(grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k,
#     max_seqlen_q, max_seqlen_k, logsumexp, dropout_p, philox_seed, philox_offset, custom_mask_type,
#     bias_requires_grad, *, scale, num_splits_key, window_size, shared_storage_dqdkdv)
_reg(
    "_efficient_attention_backward",
    attn(
        AttnSpec(
            "bshd", 1, 2, 3, go=0, mask_type=14, masks=(4,), window=(18,), varlen=(6, 7), reads=(0, 1, 2, 3, 4, 5, 10)
        ),
        "_efficient_attention_backward",
    ),
    attention=True,
)
