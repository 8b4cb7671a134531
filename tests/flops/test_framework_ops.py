"""FLOP formulas of framework (non-aten) ops in traceflops.flops.aten, against counts written out by hand.

The shapes are those the profiler records for these ops (the aiter, vLLM examples are from real
traces); every expected value is arithmetic on those shapes, never a value printed by the code.
Attention conventions: flops is the full Sq x Sk computation, 2·(Dqk + Dv) per (query, key) pair and
query head forward, 2·(3·Dqk + 2·Dv) backward (2·Dqk of it recompute); effective keeps the pairs a
causal mask keeps (bottom-right aligned for these kernels). No torch here.
"""

from __future__ import annotations

import random

import pytest

from traceflops.flops.aten import (
    MATMUL_OPS,
    WRAPPER_OPS,
    OpFlops,
    op_flops,
    vllm_batch_stats,
)
from traceflops.flops.aten import registry as aten

BF16 = "c10::BFloat16"
BF16_NUM = "15"  # c10::ScalarType::BFloat16, as Concrete Inputs records a dtype argument

NEW_OPS = [
    "aiter::gemm_a16w16", "aiter::gemm_a16w16_asm", "aiter::hipb_mm", "aiter::gemm_a8w8",
    "aiter::gemm_a8w8_bpreshuffle", "aiter::gemm_a8w8_blockscale", "aiter::gemm_a8w8_blockscale_bpreshuffle",
    "vllm::rocm_unquantized_gemm", "_C::cutlass_scaled_mm", "_C::cutlass_scaled_mm_azp", "aiter::mha_fwd",
    "aiter::fmha_v3_fwd", "aiter::mha_bwd", "aiter::fmha_v3_bwd", "aiter::mha_varlen_fwd",
    "aiter::fmha_v3_varlen_fwd", "aiter::mha_varlen_bwd", "aiter::fmha_v3_varlen_bwd",
    "aiter::mha_batch_prefill", "flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward",
    "flash_attn::_flash_attn_varlen_forward", "flash_attn::_flash_attn_varlen_backward",
    "flashattn::_flash_attn_forward", "vllm::unified_attention_with_output", "vllm::unified_attention",
    "sageattention::qk_int8_sv_f16_accum_f32_attn",
    "sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn",
    "sageattention_sm90::qk_int8_sv_f8_accum_f32_attn_inst_buf",
    "xformers::efficient_attention_forward_cutlass", "xformers::efficient_attention_forward_ck",
    "xformers_flash::flash_fwd", "xformers_flash::flash_bwd",
]


def test_registered_and_not_wrappers():
    assert set(NEW_OPS) <= MATMUL_OPS
    # their children have no formula in the usual case, so they are leaves, not wrappers
    assert not set(NEW_OPS) & WRAPPER_OPS
    with pytest.raises(ValueError):
        aten._reg_ns("aiter::gemm_a16w16", lambda a, o: None)   # a second formula is refused
    with pytest.raises(ValueError):
        aten._reg_ns("no_namespace_op", lambda a, o: None)
    assert "no_namespace_op" not in aten._REGISTRY and "aten::no_namespace_op" not in aten._REGISTRY


# --------------------------------------------------------------------------------------
# GEMMs
# --------------------------------------------------------------------------------------


def test_aiter_gemm_a16w16_real_shapes():
    # A [M, K] = [15360, 4096], B [N, K] = [6144, 4096], otype bf16
    dims = [[15360, 4096], [6144, 4096], [], [], [], [], []]
    types = [BF16, BF16, "", "Scalar", "", "", ""]
    r = op_flops("aiter::gemm_a16w16", dims, types, ["", "", "", BF16_NUM, "", "", ""])
    assert r.flops == 2 * 15360 * 6144 * 4096 == r.effective
    assert r.mask is None and r.dtype == "bf16" and r.reason is None
    assert r.bytes == (15360 * 4096 + 6144 * 4096 + 15360 * 6144) * 2
    # without Concrete Inputs the output dtype is A's: the same count
    assert op_flops("aiter::gemm_a16w16", dims, types, None).flops == 2 * 15360 * 6144 * 4096
    # a 3-D input is flattened to rows: [2, 7680, 4096] is the same GEMM
    r3 = op_flops("aiter::gemm_a16w16", [[2, 7680, 4096], [6144, 4096]] + [[]] * 5, types, None)
    assert r3.flops == 2 * (2 * 7680) * 6144 * 4096


def test_vllm_rocm_unquantized_gemm_real_shapes():
    # x [8192, 2880], weight [5120, 2880], bias [5120]: bias ignored
    r = op_flops("vllm::rocm_unquantized_gemm", [[8192, 2880], [5120, 2880], [5120]], [BF16] * 3, ["", "", ""])
    assert r.flops == 2 * 8192 * 5120 * 2880 == r.effective
    assert r.bytes == (8192 * 2880 + 5120 * 2880 + 5120 + 8192 * 5120) * 2


def test_aiter_int8_fp8_and_hipblaslt_gemms():
    fp8, f32 = "c10::Float8_e4m3fnuz", "float"
    # gemm_a8w8(XQ [64, 512], WQ [256, 512], x_scale [64, 1], w_scale [1, 256], bias, dtype, splitK)
    dims = [[64, 512], [256, 512], [64, 1], [1, 256], [], [], []]
    types = [fp8, fp8, f32, f32, "", "Scalar", "Scalar"]
    r = op_flops("aiter::gemm_a8w8", dims, types, ["", "", "", "", "", BF16_NUM, ""])
    assert r.flops == 2 * 64 * 256 * 512 and r.dtype == "fp8"
    assert r.bytes == 64 * 512 + 256 * 512 + (64 + 256) * 4 + 64 * 256 * 2
    # bpreshuffle: the weight's K padded to 640 for x's K of 512; the work is x's K
    r = op_flops("aiter::gemm_a8w8_bpreshuffle", [[64, 512], [256, 640], [64, 1], [1, 256], [], [], []], types, None)
    assert r.flops == 2 * 64 * 256 * 512
    # blockscale(XQ, WQ, x_scale, w_scale, dtype, isBpreshuffled)
    r = op_flops("aiter::gemm_a8w8_blockscale", [[64, 512], [256, 512], [64, 4], [2, 4], [], []],
                 [fp8, fp8, f32, f32, "Scalar", "Scalar"], ["", "", "", "", BF16_NUM, "False"])
    assert r.flops == 2 * 64 * 256 * 512
    # hipb_mm(mat1 [M, K], mat2 [K, N], solution_index, bias, out_dtype, ...)
    r = op_flops("aiter::hipb_mm", [[32, 1024], [1024, 3072], [], [], []], [BF16, BF16, "Scalar", "", ""], None)
    assert r.flops == 2 * 32 * 3072 * 1024
    # gemm_a16w16_asm(A [M, K], B [N, K], out [M, N] fp32, ...)
    r = op_flops("aiter::gemm_a16w16_asm", [[32, 1024], [3072, 1024], [32, 3072], []], [BF16, BF16, f32, ""], None)
    assert r.flops == 2 * 32 * 3072 * 1024
    assert r.bytes == (32 * 1024 + 3072 * 1024) * 2 + 32 * 3072 * 4


def test_vllm_cutlass_scaled_mm():
    # cutlass_scaled_mm(out [M, N], a [M, K], b [K, N], a_scales [M, 1], b_scales [1, N], bias)
    fp8 = "c10::Float8_e4m3fn"
    dims = [[16, 4096], [16, 2048], [2048, 4096], [16, 1], [1, 4096], []]
    types = [BF16, fp8, fp8, "float", "float", ""]
    r = op_flops("_C::cutlass_scaled_mm", dims, types, None)
    assert r.flops == 2 * 16 * 4096 * 2048 and r.dtype == "fp8"  # the first argument is the (bf16) output
    assert r.bytes == 16 * 2048 + 2048 * 4096 + (16 + 4096) * 4 + 16 * 4096 * 2


# --------------------------------------------------------------------------------------
# aiter attention
# --------------------------------------------------------------------------------------

BATCH_PREFILL_DIMS = [[15360, 32, 128], [835874, 8, 128], [835874, 8, 128], [16], [16], [15616],
                      [], [], [], [], [], [], [], [], [], [], [], [], []]
BATCH_PREFILL_TYPES = [BF16] * 3 + ["int"] * 3 + ["Scalar"] * 12 + [""]
BATCH_PREFILL_CONC = ["", "", "", "", "", "", "1024", "1024", "0.", "0.088388347648318447", "0.", "False",
                      "True", "-1", "-1", "0", "False", "False", ""]


def test_aiter_mha_batch_prefill_real_example():
    # cu_seqlens_q [16]: B = 15 sequences; 15360 = 15·1024 queries and max_seqlen_q = 1024, so every
    # sequence has 1024 queries; keys include them (sk >= sq) and max_seqlen_k = 1024, so sk = 1024 too.
    # Hq = 32 (GQA over 8 kv heads, counted on the 32), d = 128.
    r = op_flops("aiter::mha_batch_prefill", BATCH_PREFILL_DIMS, BATCH_PREFILL_TYPES, BATCH_PREFILL_CONC)
    assert r.flops == 15 * 32 * 1024 * 1024 * 2 * (128 + 128) == 257_698_037_760
    # causal, sq == sk: row i keeps i+1 keys, 1024·1025/2 pairs per sequence and head
    assert r.effective == 15 * 32 * (1024 * 1025 // 2) * 2 * (128 + 128) == 128_974_848_000
    assert r.mask == "causal" and r.recompute == 0 and r.dtype == "bf16"
    # bytes: q and out [15360, 32, 128], the keys/values really read (15·1024 per kv head), not the cache
    assert r.bytes == (2 * 15360 * 32 * 128 + 2 * 15 * 1024 * 8 * 128) * 2


def test_aiter_mha_batch_prefill_lengths_not_pinned():
    # 15000 queries in 15 sequences of at most 1024: the lengths differ and are not recorded
    dims = [list(d) for d in BATCH_PREFILL_DIMS]
    dims[0] = [15000, 32, 128]
    r = op_flops("aiter::mha_batch_prefill", dims, BATCH_PREFILL_TYPES, BATCH_PREFILL_CONC)
    assert r.flops is None and "per-sequence lengths are not recorded" in r.reason and r.mask == "causal"
    # uniform queries, but keys up to 4096 (a prefix in the cache): key lengths unknown
    conc = list(BATCH_PREFILL_CONC)
    conc[7] = "4096"
    r = op_flops("aiter::mha_batch_prefill", BATCH_PREFILL_DIMS, BATCH_PREFILL_TYPES, conc)
    assert r.flops is None and "key lengths are not recorded" in r.reason
    # no Concrete Inputs: neither the max lengths nor the mask
    r = op_flops("aiter::mha_batch_prefill", BATCH_PREFILL_DIMS, BATCH_PREFILL_TYPES, None)
    assert r.flops is None and "not recorded" in r.reason and r.mask == "unknown"


def test_aiter_mha_fwd_both_schemas():
    # q [2, 512, 16, 64], k/v [2, 512, 4, 64]; the newer schema has sink_size and cu_seqlens
    dims_new = [[2, 512, 16, 64], [2, 512, 4, 64], [2, 512, 4, 64]] + [[]] * 17
    conc_new = ["", "", "", "0.", "0.125", "True", "-1", "-1", "0", "False", "False"] + [""] * 9
    dims_old = [[2, 512, 16, 64], [2, 512, 4, 64], [2, 512, 4, 64]] + [[]] * 11
    conc_old = ["", "", "", "0.", "0.125", "True", "-1", "-1", "False", "False"] + [""] * 4
    full = 2 * 16 * 512 * 512 * 2 * (64 + 64)
    causal = 2 * 16 * (512 * 513 // 2) * 2 * (64 + 64)
    for name in ("aiter::mha_fwd", "aiter::fmha_v3_fwd"):
        for dims, conc in ((dims_new, conc_new), (dims_old, conc_old)):
            r = op_flops(name, dims, [BF16] * 3 + ["Scalar"] * (len(dims) - 3), conc)
            assert (r.flops, r.effective, r.mask) == (full, causal, "causal"), (name, len(dims))
    # not causal
    conc = list(conc_old)
    conc[5] = "False"
    r = op_flops("aiter::mha_fwd", dims_old, None, conc)
    assert (r.flops, r.effective, r.mask) == (full, full, "full")
    # a sliding window: the kept share is not derived
    conc[6] = "128"
    r = op_flops("aiter::mha_fwd", dims_old, None, conc)
    assert (r.flops, r.effective, r.mask) == (full, full, "unknown")
    # the newer schema's cu_seqlens_q/kv describe a padded batch
    dims = [list(d) for d in dims_new]
    dims[11], dims[12] = [3], [3]
    types = [BF16] * 3 + ["Scalar"] * 8 + ["int", "int"] + [""] * 7
    r = op_flops("aiter::mha_fwd", dims, types, conc_new)
    assert r.flops is None and "padded batch" in r.reason


def test_aiter_mha_bwd():
    # dout, q, out [1, 256, 8, 128]; k/v [1, 384, 2, 128]; causal bottom-right, sk - sq = 128:
    # row i keeps i + 129 keys: sum over i < 256 = 256·129 + 255·256/2 = 33024 + 32640 = 65664
    q, kv = [1, 256, 8, 128], [1, 384, 2, 128]
    dims = [q, q, kv, kv, q, [1, 8, 256]] + [[]] * 14
    conc = [""] * 6 + ["0.", "0.088", "True", "-1", "-1", "False"] + [""] * 8
    per_pair = 2 * (3 * 128 + 2 * 128)
    for name in ("aiter::mha_bwd", "aiter::fmha_v3_bwd"):
        r = op_flops(name, dims, [BF16] * 5 + ["float"] + [""] * 14, conc)
        assert r.flops == 8 * 256 * 384 * per_pair
        assert r.recompute == 8 * 256 * 384 * 2 * 128
        assert r.effective == 8 * (256 * 129 + 255 * 256 // 2) * per_pair
        assert r.mask == "causal"


def test_aiter_mha_varlen_fwd_and_bwd():
    # 3 sequences of 4 queries over 6 contiguous keys each: total_q 12 = 3·4, total_k 18 = 3·6.
    # causal bottom-right, row i keeps i + 3 keys: 3 + 4 + 5 + 6 = 18 pairs per sequence and head
    q, kv = [12, 4, 32], [18, 2, 32]
    dims = [q, kv, kv, [4], [4]] + [[]] * 23
    conc_new = [""] * 5 + ["4", "6", "0", "0.", "0.17", "0.", "False", "True", "-1", "-1", "0", "False", "False"] + [""] * 10
    conc_old = [""] * 5 + ["4", "6", "0.", "0.17", "False", "True", "-1", "-1", "False", "False"] + [""] * 13
    for name in ("aiter::mha_varlen_fwd", "aiter::fmha_v3_varlen_fwd"):
        for conc in (conc_new, conc_old):
            r = op_flops(name, dims, None, conc)
            assert r.flops == 3 * 4 * 4 * 6 * 2 * (32 + 32)
            assert r.effective == 3 * 4 * 18 * 2 * (32 + 32) and r.mask == "causal"
    # 18 keys but at most 8 per sequence: key lengths differ
    conc = list(conc_old)
    conc[6] = "8"
    r = op_flops("aiter::mha_varlen_fwd", dims, None, conc)
    assert r.flops is None and "key lengths are not recorded" in r.reason
    # backward: dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout, scale, zero_tensors, causal, ...
    dims = [q, q, kv, kv, q, [4, 12], [4], [4]] + [[]] * 15
    conc = [""] * 8 + ["4", "6", "0.", "0.17", "False", "True", "-1", "-1", "False"] + [""] * 6
    per_pair = 2 * (3 * 32 + 2 * 32)
    r = op_flops("aiter::mha_varlen_bwd", dims, None, conc)
    assert (r.flops, r.effective) == (3 * 4 * 4 * 6 * per_pair, 3 * 4 * 18 * per_pair)
    assert r.recompute == 3 * 4 * 4 * 6 * 2 * 32


# --------------------------------------------------------------------------------------
# flash-attn
# --------------------------------------------------------------------------------------


def test_flash_attn_forward_backward():
    # q [2, 100, 6, 64], k/v [2, 300, 2, 64]: GQA counted on the 6 query heads
    q, kv = [2, 100, 6, 64], [2, 300, 2, 64]
    conc = ["", "", "", "0.", "0.125", "True", "-1", "-1", "0.", "", "False"]
    # bottom-right: row i keeps i + 201 keys, 100·201 + 99·100/2 = 20100 + 4950 = 25050 pairs
    for name in ("flash_attn::_flash_attn_forward", "flashattn::_flash_attn_forward"):
        r = op_flops(name, [q, kv, kv] + [[]] * 8, [BF16] * 3 + ["Scalar"] * 8, conc)
        assert r.flops == 2 * 6 * 100 * 300 * 2 * (64 + 64)
        assert r.effective == 2 * 6 * 25050 * 2 * (64 + 64) and r.mask == "causal"
    conc_b = [""] * 9 + ["0.", "0.125", "True", "-1", "-1", "0.", "", "False", ""]
    dims_b = [q, q, kv, kv, q, [2, 6, 100], q, kv, kv] + [[]] * 9
    r = op_flops("flash_attn::_flash_attn_backward", dims_b, [BF16] * 5 + ["float"] + [BF16] * 3 + [""] * 9, conc_b)
    per_pair = 2 * (3 * 64 + 2 * 64)
    assert r.flops == 2 * 6 * 100 * 300 * per_pair and r.effective == 2 * 6 * 25050 * per_pair
    assert r.recompute == 2 * 6 * 100 * 300 * 2 * 64


def test_flash_attn_varlen():
    # 4 sequences of 8 queries and 8 keys, packed: q [32, 4, 64], k/v [32, 4, 64]
    t = [32, 4, 64]
    conc = ["", "", "", "", "", "8", "8", "0.", "0.125", "True", "-1", "-1", "0.", "", "False", "", "", ""]
    r = op_flops("flash_attn::_flash_attn_varlen_forward", [t, t, t, [5], [5]] + [[]] * 13, None, conc)
    assert r.flops == 4 * 4 * 8 * 8 * 2 * (64 + 64)
    assert r.effective == 4 * 4 * (8 * 9 // 2) * 2 * (64 + 64)
    # paged keys [blocks, block_size, Hk, D] with a block_table: only max_k == max_q pins the keys down
    paged = [100, 16, 4, 64]
    dims = [t, paged, paged, [5], [5]] + [[]] * 10 + [[4, 7]] + [[]] * 2
    assert op_flops("flash_attn::_flash_attn_varlen_forward", dims, None, conc).flops == 4 * 4 * 8 * 8 * 2 * 128
    conc_long = list(conc)
    conc_long[6] = "40"
    r = op_flops("flash_attn::_flash_attn_varlen_forward", dims, None, conc_long)
    assert r.flops is None and "key lengths are not recorded" in r.reason
    # seqused_k: the contiguous-key rule no longer applies
    dims = [t, [160, 4, 64], [160, 4, 64], [5], [5]] + [[]] * 12 + [[4]]
    r = op_flops("flash_attn::_flash_attn_varlen_forward", dims, None, conc_long)
    assert r.flops is None
    # backward(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, dropout, scale, causal, wl, wr, ...)
    dims = [t, t, t, t, t, [4, 32], t, t, t, [5], [5]] + [[]] * 11
    conc = [""] * 11 + ["8", "8", "0.", "0.125", "True", "-1", "-1", "0.", "", "False", ""]
    r = op_flops("flash_attn::_flash_attn_varlen_backward", dims, None, conc)
    per_pair = 2 * (3 * 64 + 2 * 64)
    assert (r.flops, r.effective) == (4 * 4 * 8 * 8 * per_pair, 4 * 4 * 36 * per_pair)


# --------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------

VLLM_STEP = "execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)"
VLLM_DIMS = [[8192, 64, 64], [8192, 8, 64], [8192, 8, 64], [8192, 64, 64], [], [], [], [0]]
VLLM_TYPES = [BF16] * 4 + ["", "", "", BF16]


def test_vllm_batch_stats():
    assert vllm_batch_stats(VLLM_STEP) == {"sq": 8155 + 37, "sk": 8430 + 34489,
                                           "sqsq": 7475785 + 37, "sqsk": 7671310 + 34489}
    # vLLM's native names carry no key lengths
    assert vllm_batch_stats("execute_context_2(100)_generation_8(8)") is None
    assert vllm_batch_stats("ProfilerStep#3") is None and vllm_batch_stats(None) is None
    # numbers no batch can have: Σsq² < Σsq, Σsq·sk > Σsq·Σsk, requests without queries, absurd lengths
    assert vllm_batch_stats("execute_9_context_1(sq9sk9sqsq8sqsk81)_generation_0(sq0sk0sqsq0sqsk0)") is None
    assert vllm_batch_stats("execute_9_context_1(sq9sk9sqsq81sqsk82)_generation_0(sq0sk0sqsq0sqsk0)") is None
    assert vllm_batch_stats("execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_3(sq0sk0sqsq0sqsk0)") is None
    assert vllm_batch_stats("execute_1_context_1(sq1sk1sqsq1sqsk1)_generation_0(sq0sk0sqsq0sqsk0)" + "0" * 400) is None
    assert vllm_batch_stats("execute_1_context_1(sq1sk99999999999999999sqsq1sqsk1)_generation_0(sq0sk0sqsq0sqsk0)") is None


def test_vllm_unified_attention_real_example():
    # Hq 64, d 64 (query and value); Σsq·sk = 7671310 + 34489, Σsq² = 7475785 + 37, Σsq = 8155 + 37 = 8192 = T
    stats = {"sq": 8155 + 37, "sk": 8430 + 34489, "sqsq": 7475785 + 37, "sqsk": 7671310 + 34489}
    r = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None,
                 context={"seq_stats": stats})
    assert r.flops == 2 * 64 * (64 + 64) * (7671310 + 34489) == 126_251_810_816
    # kept pairs Σ(sq·sk − sq(sq−1)/2) = Σsq·sk − (Σsq² − Σsq)/2
    kept = (7671310 + 34489) - ((7475785 + 37) - (8155 + 37)) // 2
    assert kept == 7705799 - 3733815 == 3971984
    assert r.effective == 2 * 64 * (64 + 64) * kept == 65_076_985_856
    assert r.mask == "causal" and r.dtype == "bf16"
    # bytes: q and out [8192, 64, 64], keys and values of Σsk positions on 8 kv heads
    assert r.bytes == (2 * 8192 * 64 * 64 + 2 * (8430 + 34489) * 8 * 64) * 2
    # the parser's output is what the caller passes
    r2 = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None,
                  context={"seq_stats": vllm_batch_stats(VLLM_STEP)})
    assert (r2.flops, r2.effective) == (r.flops, r.effective)
    # unified_attention(query, key, value, layer_name): the value gives Dv
    r3 = op_flops("vllm::unified_attention", VLLM_DIMS[:3] + [[]], [BF16] * 3 + [""], None,
                  context={"seq_stats": stats})
    assert (r3.flops, r3.effective) == (r.flops, r.effective)


def test_vllm_unified_attention_without_lengths():
    r = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None)
    assert r.flops is None and r.effective is None
    assert r.reason == "vLLM attention: the sequence lengths are in the step's annotation, which this op lacks"
    r = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None, context={"other": 1})
    assert r.flops is None and "annotation" in r.reason
    # the annotation's tokens are not this op's (padded batch, another step)
    stats = {"sq": 8000, "sk": 9000, "sqsq": 8000, "sqsk": 9000}
    r = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None, context={"seq_stats": stats})
    assert r.flops is None and "8000" in r.reason and "8192" in r.reason
    for bad in ({"sq": 8192}, {"sq": 8192, "sk": -1, "sqsq": 8192, "sqsk": 8192}, "x",
                {"sq": 8192, "sk": 9000, "sqsq": 8000, "sqsk": 9000}):
        r = op_flops("vllm::unified_attention_with_output", VLLM_DIMS, VLLM_TYPES, None, context={"seq_stats": bad})
        assert r.flops is None and r.reason


# --------------------------------------------------------------------------------------
# SageAttention, xformers
# --------------------------------------------------------------------------------------


def test_sageattention():
    i8 = "signed char"
    # NHD (tensor_layout 0): q/k int8 [2, 128, 8, 64], v quantised and padded (not read for the count),
    # output [2, 128, 8, 64]; is_causal 1 with sq == sk
    q = [2, 128, 8, 64]
    dims = [q, q, [2, 8, 64, 192], q, [2, 8, 2], [2, 8, 2], [2, 8, 64], [], [], [], [], []]
    types = [i8, i8, "c10::Float8_e4m3fn", BF16, "float", "float", "float"] + ["Scalar"] * 5
    conc = [""] * 7 + ["0", "1", "2", "0.125", "0"]
    r = op_flops("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", dims, types, conc)
    assert r.flops == 2 * 8 * 128 * 128 * 2 * (64 + 64)
    assert r.effective == 2 * 8 * (128 * 129 // 2) * 2 * (64 + 64) and r.mask == "causal"
    # HND (tensor_layout 1), no value scale: q [1, 4, 32, 64], k [1, 4, 96, 64], not causal
    qh, kh = [1, 4, 32, 64], [1, 4, 96, 64]
    dims = [qh, kh, kh, qh, [1, 4, 1], [1, 4, 1], [], [], [], [], []]
    conc = [""] * 6 + ["1", "0", "2", "0.125", "0"]
    r = op_flops("sageattention::qk_int8_sv_f16_accum_f32_attn", dims, None, conc)
    assert (r.flops, r.effective, r.mask) == (4 * 32 * 96 * 2 * 128, 4 * 32 * 96 * 2 * 128, "full")
    # causal with sq != sk: the kernels' alignment is not documented
    conc[7] = "1"
    r = op_flops("sageattention::qk_int8_sv_f16_accum_f32_attn", dims, None, conc)
    assert (r.flops, r.effective, r.mask) == (4 * 32 * 96 * 2 * 128, 4 * 32 * 96 * 2 * 128, "unknown")
    r = op_flops("sageattention::qk_int8_sv_f16_accum_f32_attn", dims, None, None)
    assert r.flops is None and "tensor_layout" in r.reason


def test_xformers():
    # efficient_attention_forward_cutlass, newest schema: [B, M, H, K] = [2, 64, 4, 32], custom_mask_type 2
    q = [2, 64, 4, 32]
    dims = [q, q, q] + [[]] * 11
    conc = [""] * 8 + ["0.", "2", "False", "", "", ""]
    r = op_flops("xformers::efficient_attention_forward_cutlass", dims, None, conc)
    assert r.flops == 2 * 4 * 64 * 64 * 2 * (32 + 32)
    assert r.effective == 2 * 4 * (64 * 65 // 2) * 2 * (32 + 32) and r.mask == "causal"
    r = op_flops("xformers::efficient_attention_forward_cutlass", [q, q, q, [], [], [], [], []], None, None)
    assert r.flops is None and "older" in r.reason
    # efficient_attention_forward_ck with grouped heads [B, M, G, H, K] = [1, 48, 2, 3, 16]: 6 heads
    g = [1, 48, 2, 3, 16]
    conc = [""] * 7 + ["0.", "False", "0", "", "", ""]
    r = op_flops("xformers::efficient_attention_forward_ck", [g, g, g] + [[]] * 10, None, conc)
    assert (r.flops, r.mask) == (1 * 6 * 48 * 48 * 2 * (16 + 16), "full")
    # flash_fwd on a packed batch: 2 sequences of 16 (xformers packs [2, 16, H, K] to [32, H, K])
    t = [32, 4, 64]
    conc = [""] * 6 + ["16", "16", "0.", "0.125", "True", "-1", "-1", "False", ""]
    r = op_flops("xformers_flash::flash_fwd", [t, t, t, [3], [3], []] + [[]] * 9, None, conc)
    assert (r.flops, r.effective) == (2 * 4 * 16 * 16 * 2 * 128, 2 * 4 * (16 * 17 // 2) * 2 * 128)
    # flash_bwd(grads_share_storage, grad, query, key, value, out, lse, cu_q, cu_k, max_q, max_k, p, scale, causal, ...)
    conc = [""] * 9 + ["16", "16", "0.", "0.125", "True", "-1", "-1", ""]
    r = op_flops("xformers_flash::flash_bwd", [[], t, t, t, t, t, [4, 32], [3], [3]] + [[]] * 8,
                 ["Scalar"] + [BF16] * 5 + ["float", "int", "int"] + [""] * 8, conc)
    per_pair = 2 * (3 * 64 + 2 * 64)
    assert (r.flops, r.effective, r.dtype) == (2 * 4 * 16 * 16 * per_pair, 2 * 4 * 136 * per_pair, "bf16")


# --------------------------------------------------------------------------------------
# malformed inputs: a reason, never an exception
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,dims,conc",
    [
        ("aiter::gemm_a16w16", [[15360, 4096], [6144, 4000]], None),           # K differs
        ("aiter::gemm_a16w16", [[15360, 4096]], None),                         # weight missing
        ("vllm::rocm_unquantized_gemm", [[8192, 2880], [5120, 2880, 1]], None),
        ("aiter::hipb_mm", [[32, 1024], [3072, 1024]], None),                  # mat2 not [K, N]
        ("_C::cutlass_scaled_mm", [[16, 4096], [16, 2048]], None),
        ("aiter::gemm_a8w8", [[64, 512], [256, 256]], None),
        ("aiter::mha_batch_prefill", [[15360, 32, 128], [835874, 8, 128], [835874, 6, 128], [16], [16], [15616]],
         BATCH_PREFILL_CONC),                                                  # k/v heads differ
        ("aiter::mha_batch_prefill", [[15360, 32, 128], [835874, 8, 128], [835874, 8, 128], [1], [1], [5]],
         BATCH_PREFILL_CONC),                                                  # no sequence
        ("aiter::mha_batch_prefill", [[15360, 32, 128], [835874, 8, 96], [835874, 8, 96], [16], [16], [15616]],
         BATCH_PREFILL_CONC),                                                  # head dims differ
        ("aiter::mha_fwd", [[2, 512, 16, 64], [2, 512, 5, 64], [2, 512, 5, 64]], None),   # 16 heads over 5
        ("aiter::mha_bwd", [[1, 9, 8, 128], [1, 256, 8, 128], [1, 256, 8, 128], [1, 256, 8, 128]], None),
        ("flash_attn::_flash_attn_forward", [[2, 100, 6], [2, 300, 2, 64], [2, 300, 2, 64]], None),
        ("flash_attn::_flash_attn_varlen_backward", [[30, 4, 64], [32, 4, 64], [32, 4, 64], [32, 4, 64]]
         + [[]] * 5 + [[5], [5]], [""] * 11 + ["8", "8"]),                      # grad_out does not fit
        ("vllm::unified_attention_with_output", [[8192, 64]], None),
        ("vllm::unified_attention_with_output", [[8192, 64, 64], [8192, 7, 64], [8192, 7, 64], [8192, 64, 64]], None),
        ("sageattention::qk_int8_sv_f16_accum_f32_attn", [[2, 128, 8, 64], [2, 128, 8]], [""] * 6 + ["0", "1"]),
        ("xformers::efficient_attention_forward_ck", [[2, 64, 4, 32], [2, 64, 3, 32], [2, 64, 3, 32]], None),
        ("xformers_flash::flash_fwd", [[32, 4, 64], [32, 4, 64]], None),
        ("aiter::mha_fwd", None, None),
    ],
)
def test_malformed(name, dims, conc):
    r = op_flops(name, dims, None, conc, context={"seq_stats": {"sq": 8192, "sk": 8192, "sqsq": 8192, "sqsk": 8192}})
    assert isinstance(r, OpFlops)
    assert r.flops is None and r.effective is None and r.reason


def test_fuzz_new_ops_never_raise():
    rng = random.Random(1)
    junk = [None, [], [[]], [[-1]], [["a"]], [[3, 5], None], [[True, 2]], [[2**40, 3, 4]], [[15360, 32, 128]] * 8,
            BATCH_PREFILL_DIMS, VLLM_DIMS, [[2, 512, 16, 64]] * 20, [[32, 4, 64]] * 3 + [[5]] * 3 + [[]] * 14,
            [[1, 48, 2, 3, 16]] * 3, [[100, 16, 4, 64]] * 4]
    cjunk = [None, [], [""] * 20, ["True"] * 20, ["-1"] * 20, BATCH_PREFILL_CONC, ["8"] * 20, [1, [2], None]]
    ctx = [None, {}, {"seq_stats": None}, {"seq_stats": {"sq": 8192, "sk": 1, "sqsq": 1, "sqsk": 1}},
           {"seq_stats": [1, 2]}, "x"]
    for name in NEW_OPS:
        for _ in range(60):
            r = op_flops(name, rng.choice(junk), rng.choice([None, [BF16] * 20, ["Scalar"] * 20]), rng.choice(cjunk),
                         out_dims=rng.choice([None, [2, 4], "x"]), context=rng.choice(ctx))
            assert isinstance(r, OpFlops)
            assert (r.flops is None) == (r.reason is not None)
