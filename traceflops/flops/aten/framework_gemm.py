"""FLOP formulas of framework GEMM ops registered with torch.library: aiter and vLLM GEMMs, vLLM's fused MoE.

The profiler records these under their own namespace with their schema's arguments, so each gets its own
formula, registered beside it in TABLE (which registry merges) with the schema it reads.
"""

from __future__ import annotations

import math
from typing import Any

from traceflops.flops.aten.matmul import mm_like
from traceflops.flops.aten.shapes import Args, Bad, R, is_int, unknown, valid_shape
from traceflops.flops.aten.table import FormulaTable

TABLE = FormulaTable()  # this module's registrations, merged by registry
_reg_ns = TABLE.ns


# --------------------------------------------------------------------------------------
# framework (non-aten) ops: aiter, vLLM, flash-attn, SageAttention, xformers
# --------------------------------------------------------------------------------------
# These projects register their kernels with torch.library, so the profiler records them under
# their namespace with their schema's arguments; each registration below names the schema it reads.
# Only leaf formulas count: a wrapper whose child op has a formula (aiter::gemm_a16w16 falling back
# to aten::linear) is counted through the child, one that launches its kernels itself through its own.


# ---- GEMMs ----


def _nk_gemm(
    ix: int,
    iw: int,
    reads: tuple[int, ...],
    out_dtype_idx: int | None = None,
    out_idx: int | None = None,
    default_out: str | None = None,
    padded_k: bool = False,
):
    """x [..., K] times a weight stored [N, K] (as F.linear): 2·M·N·K, M the product of x's leading dims.

    padded_k: a preshuffled weight may carry K padded up (aiter's bpreshuffle GEMMs); x's K is the work.
    """

    def f(a: Args, out_dims) -> R:
        x = a.shape(ix, "input", min_ndim=1)
        n, kw = a.shape(iw, "weight", (2,))
        k = x[-1]
        if kw != k and not (padded_k and kw > k):
            raise Bad(f"gemm: input {list(x)} and weight [{n}, {kw}] (N x K) differ in K")
        if out_idx is not None and a.is_tensor(out_idx):
            ot = a.type(out_idx)
        else:
            ot = a.c_dtype(out_dtype_idx) or default_out or a.type(ix)
        return R(2 * math.prod(x[:-1]) * n * k, reads=reads, outs=[(tuple(x[:-1]) + (n,), ot)])

    return f


def _out_first_mm(reads: tuple[int, ...]):
    """(out [M, N], a [M, K], b [K, N], ...): the output tensor is the first argument."""
    inner = mm_like(1, 2, reads)

    def f(a: Args, out_dims) -> R:
        r = inner(a, out_dims)
        r.outs = [(r.outs[0][0], a.type(0))]
        return r

    return f


# aiter (ROCm/aiter aiter/tuned_gemm.py): gemm_a16w16(A, B, bias, otype, scale_a, scale_b, scale_c)
#   A [..., K], B [N, K]; it runs hipBLASLt, an asm or skinny kernel, or falls back to F.linear.
_reg_ns("aiter::gemm_a16w16", _nk_gemm(0, 1, (0, 1, 2), out_dtype_idx=3))
# aiter (aiter/ops/gemm_op_a16w16.py, csrc gemm_a16w16_asm.h): gemm_a16w16_asm(A [M, K], B [N, K], out [M, N], ...)
_reg_ns("aiter::gemm_a16w16_asm", _nk_gemm(0, 1, (0, 1), out_idx=2))
# aiter (aiter/ops/gradlib.py): hipb_mm(mat1 [M, K], mat2 [K, N], solution_index, bias, out_dtype, scaleA,
#   scaleB, scaleOut, bpreshuffle)  -- tuned_gemm passes the weight transposed, [K, N]
_reg_ns("aiter::hipb_mm", mm_like(0, 1, (0, 1, 3), out_dtype_idx=4))
# aiter (aiter/ops/gemm_op_a8w8.py), XQ [M, K] and WQ [N, K] in int8/fp8, output bf16 unless `dtype` says:
# gemm_a8w8(XQ, WQ, x_scale, w_scale, bias, dtype, splitK)
# gemm_a8w8_bpreshuffle(XQ, WQ, x_scale, w_scale, bias, dtype, check)  -- WQ's K may be padded up
# gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype, isBpreshuffled)
# gemm_a8w8_blockscale_bpreshuffle(XQ, WQ, x_scale, w_scale, dtype)
_reg_ns("aiter::gemm_a8w8", _nk_gemm(0, 1, (0, 1, 2, 3, 4), out_dtype_idx=5, default_out="c10::BFloat16"))
_reg_ns(
    "aiter::gemm_a8w8_bpreshuffle",
    _nk_gemm(0, 1, (0, 1, 2, 3, 4), out_dtype_idx=5, default_out="c10::BFloat16", padded_k=True),
)
_reg_ns(
    ["aiter::gemm_a8w8_blockscale", "aiter::gemm_a8w8_blockscale_bpreshuffle"],
    _nk_gemm(0, 1, (0, 1, 2, 3), out_dtype_idx=4, default_out="c10::BFloat16"),
)
# vLLM (vllm/model_executor/layers/utils.py, direct_register_custom_op):
# rocm_unquantized_gemm(x [..., K], weight [N, K], bias [N]): skinny wvSplitK/LLMM1 kernels or F.linear
_reg_ns("vllm::rocm_unquantized_gemm", _nk_gemm(0, 1, (0, 1, 2)))
# vLLM (csrc/torch_bindings.cpp): cutlass_scaled_mm(Tensor! out, Tensor a, Tensor b, Tensor a_scales,
#   Tensor b_scales, Tensor? bias); cutlass_scaled_mm_azp(out, a, b, a_scales, b_scales, azp_adj, azp, bias)
#   a [M, K], b [K, N] (column-major), out [M, N]; a's dtype is the compute dtype
_reg_ns("_C::cutlass_scaled_mm", _out_first_mm((1, 2, 3, 4, 5)), primary=1)
_reg_ns("_C::cutlass_scaled_mm_azp", _out_first_mm((1, 2, 3, 4, 5, 6, 7)), primary=1)


# ---- fused MoE ----

_MOE_NO_WEIGHTS = (
    "fused MoE: the expert weights are not arguments of the op, and none of the ops it ran showed "
    "them with the top-k (re-profile with record_shapes=True)"
)
_PACKED = {"unsigned char", "c10::Float4_e2m1fn_x2"}  # MXFP4 experts: two 4-bit values per byte along K


def _expert_dims(w: Any, hidden: int, k_side: bool) -> tuple[int, int] | None:
    """(K, N) of one expert weight [E, a, b] given as [dims, type, strides]: the side equal to the hidden size is K of
    the up projection (k_side) or N of the down projection. A packed 4-bit weight doubles its contiguous side."""
    if not (isinstance(w, (list, tuple)) and len(w) == 3 and valid_shape(w[0]) and len(w[0]) == 3):
        return None
    dims, typ, strides = list(w[0][1:]), w[1], w[2]
    if typ in _PACKED:
        inner = 1 if isinstance(strides, (list, tuple)) and len(strides) == 3 and strides[1] == 1 else 2
        dims[inner - 1] *= 2
    a, b = dims
    if k_side:
        return (a, b) if a == hidden else (b, a) if b == hidden else None
    return (a, b) if b == hidden else (b, a) if a == hidden else None


def _fused_moe(a: Args, out_dims) -> R:
    """A fused mixture of experts: each of T tokens runs its top-k experts, an up (gate and up) projection [H -> N1]
    and a down projection [K2 -> H]: 2·T·k·(H·N1 + K2·H). Only the hidden states [T, H] and the router logits [T, E]
    are arguments: context["moe"] = {"topk": k, "weights": [w13, w2]}, each [dims [E, ., .], type, strides], the
    expert weights and k seen in the ops the MoE ran. The down projection must take the up projection's output
    (K2 = N1, or N1/2 after a gated activation), so weights of another layer are never combined."""
    t, h = a.shape(0, "hidden_states", (2,))
    e = a.shape(1, "router_logits", (2,))[1]
    moe = a.context.get("moe") if a.context is not None else None
    if not isinstance(moe, dict):
        return unknown(_MOE_NO_WEIGHTS, (0, 1))
    k, ws = moe.get("topk"), moe.get("weights")
    if not (is_int(k) and 1 <= k <= e and isinstance(ws, (list, tuple)) and len(ws) == 2):
        raise Bad(f"fused MoE: malformed evidence {moe!r}")
    if any(
        not (isinstance(w, (list, tuple)) and w and isinstance(w[0], (list, tuple)) and w[0][:1] == [e]) for w in ws
    ):
        raise Bad(f"fused MoE: expert weights {[w[0] for w in ws]} are not of the router's {e} experts")
    up, down = _expert_dims(ws[0], h, True), _expert_dims(ws[1], h, False)
    if up is None or down is None:
        raise Bad(f"fused MoE: expert weights {[w[0] for w in ws]} do not fit the hidden size {h}")
    (_, n1), (k2, _) = up, down
    if k2 not in (n1, n1 // 2):
        raise Bad(f"fused MoE: the down projection's K {k2} does not take the up projection's N {n1}")
    return R(2 * t * k * (h * n1 + k2 * h), reads=(0, 1), outs=[((t, h), a.type(0))])


# vLLM (vllm/model_executor/layers/fused_moe/layer.py; direct_register_custom_op):
# moe_forward(hidden_states [T, H], router_logits [T, E], layer_name) -> Tensor;
# moe_forward_shared(hidden_states, router_logits, layer_name) -> (Tensor, Tensor)
_reg_ns(["vllm::moe_forward", "vllm::moe_forward_shared"], _fused_moe)
MOE_OPS: frozenset[str] = frozenset({"vllm::moe_forward", "vllm::moe_forward_shared"})
