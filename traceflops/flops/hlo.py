"""FLOPs of XLA HLO matmul-class instructions from their shapes: dots, convolutions, Transformer Engine fused attention.

Plain numbers in, plain numbers out: the xplane parser reads the shapes and
dimension numbers from the HLO and hands them here. Conventions follow
`FlopCounterMode` (2 FLOPs per multiply-add; attention counted dense whatever
its mask, the mask reported beside the count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HloFlops:
    flops: int  # all FLOPs the instruction executes
    recompute: int = 0  # of which an in-kernel recompute (a fused attention backward's Q·Kᵀ)
    mask: str | None = None  # attention mask: 'none' | 'causal'; None for dots and convolutions


def dot(out_dims: Sequence[int], lhs_dims: Sequence[int], lhs_contracting: Sequence[int]) -> int:
    """2 · (output elements) · (contracted size). IndexError when the dimension numbers do not fit the operand."""
    return 2 * math.prod(out_dims) * math.prod(lhs_dims[c] for c in lhs_contracting)


def convolution(
    target: str,
    out_dims: Sequence[int],
    a_dims: Sequence[int],
    b_dims: Sequence[int],
    kernel_input_feature: int,
    kernel_spatial: Sequence[int],
) -> int:
    """2 · (forward output elements) · (kernel input features per group × window).

    cuDNN rewrites (`target`) keep the forward convolution's dimension numbers:
    BackwardInput(d_out, kernel) -> d_in; BackwardFilter(input, d_out) -> d_kernel.
    IndexError when the dimension numbers do not fit the kernel.
    """
    if "BackwardInput" in target:
        fwd_out, kernel = a_dims, b_dims
    elif "BackwardFilter" in target:
        fwd_out, kernel = b_dims, out_dims
    else:
        fwd_out, kernel = out_dims, b_dims
    window = kernel[kernel_input_feature] * math.prod(kernel[s] for s in kernel_spatial)
    return 2 * math.prod(fwd_out) * window


# NVTE_Mask_Type: 0 none, 1 padding, 2 causal, 3 padding+causal, 4/5 causal bottom-right (+padding)
_TE_CAUSAL = frozenset({"2", "3", "4", "5"})


def te_attention(cfg: dict[str, str], backward: bool, out_dims: Sequence[int] | None) -> HloFlops | None:
    """A Transformer Engine fused-attention call, as FlopCounterMode counts SDPA (dense).

    Forward 2·B·H·Sq·Sk·(Dqk + Dv) (= 4·B·H·Sq·Sk·D); backward
    2·B·H·Sq·Sk·(3·Dqk + 2·Dv) (2.5× forward), of which the Q·Kᵀ recompute
    2·B·H·Sq·Sk·Dqk. H is the query heads (GQA on the expanded heads). Sizes
    from the call's backend config (`input_batch`, `attn_heads`,
    `q_max_seqlen`, `kv_max_seqlen`, `qk_head_dim`, `v_head_dim`), checked
    against the attention output's shape [B, Sq, H, Dv] (the forward's first
    result, the backward's operand 6); None when they do not fit.
    """
    try:
        b, h = int(cfg["input_batch"]), int(cfg["attn_heads"])
        sq, sk = int(cfg["q_max_seqlen"]), int(cfg["kv_max_seqlen"])
        dq, dv = int(cfg["qk_head_dim"]), int(cfg["v_head_dim"])
    except (KeyError, ValueError):
        return None
    if out_dims is None or list(out_dims) != [b, sq, h, dv]:
        return None
    mask = "causal" if cfg.get("mask_type", "0") in _TE_CAUSAL else "none"
    pairs = b * h * sq * sk
    if backward:
        return HloFlops(pairs * 2 * (3 * dq + 2 * dv), pairs * 2 * dq, mask)
    return HloFlops(pairs * 2 * (dq + dv), 0, mask)
