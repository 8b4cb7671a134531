"""Matmul-class FLOP formulas for PyTorch profiler (Kineto JSON) ``cpu_op`` events.

Everything here works from what a Kineto trace records for an op:

* ``Input Dims``      -- one entry per argument: a list of ints for a tensor, ``[]`` for
  scalars / ``None``, a list of lists for a ``Tensor[]`` argument;
* ``Input type``      -- e.g. ``'float'``, ``'c10::BFloat16'``, ``'Scalar'``, ``'ScalarList'``, ``''``;
* ``Concrete Inputs`` -- string values of non-tensor arguments, e.g. ``'[2, 2]'``, ``'True'``,
  ``'0.'``, ``'15'`` (a ScalarType is recorded as its enum number); missing in older traces.

The conventions follow ``torch.utils.flop_counter.FlopCounterMode`` (2·M·N·K per matmul,
bias adds ignored, attention counted as the full Sq×Sk computation whatever the mask), with
these deliberate differences, each noted where it is implemented:

* convolution_backward's grad_weight is counted as the real work (the same as the forward conv).
  FlopCounterMode counts ``groups`` times too much there for grouped convolutions.
* ``_flash_attention_*`` / ``_efficient_attention_*`` get their inputs as [B, S, H, D];
  FlopCounterMode reads those shapes as [B, H, S, D], which gives wrong counts for dense inputs.
  Here they are read in the right layout.
* packed fp4 (``Float4_e2m1fn_x2``) operands of the scaled matmuls hold two values per element,
  so the contraction length is counted as twice the recorded size.

Framework ops that their projects register with torch.library (aiter, vLLM, flash-attn, SageAttention,
xformers) are counted the same way, from their own schemas (their section names each one). Packed
variable-length attention is counted only when the recorded sizes pin every sequence's lengths down;
vLLM's attention takes the lengths from the step's annotation, passed in as ``context``.

Causal ``effective`` FLOPs use the exact share of kept (query, key) pairs: torch's top-left mask
``tril(ones(Sq, Sk))`` for SDPA-level ops, the CPU flash kernel, cuDNN and efficient attention with
custom_mask_type 1; bottom-right for FlashAttention-2 kernels and custom_mask_type 2 (the two agree
when Sq == Sk, the only causal case SDPA sends to flash).  The unfused math path computes the
whole score matrix, so its effective FLOPs equal its FLOPs.

No module of this package may import torch.

Layout (each module registers its formulas beside them in a FormulaTable; registry merges the tables):

* ``shapes``              -- reading recorded arguments (Args), results (R), dtypes, byte sizes, bounds;
* ``table``               -- the per-module registration table;
* ``matmul``              -- mm / bmm / addmm / matmul / linear / einsum / scaled and grouped mm;
* ``conv``                -- convolution forward and backward;
* ``attention``           -- SDPA and the flash / efficient / cuDNN / overrideable attention kernels;
* ``framework_gemm``      -- aiter and vLLM GEMMs, vLLM's fused MoE;
* ``framework_attention`` -- aiter CK, flash-attn 2, vLLM, SageAttention and xformers attention;
* ``registry``            -- the name -> formula lookup and op_flops.

This package exposes what outside code uses.
"""

from __future__ import annotations

from traceflops.flops.aten.framework_attention import vllm_batch_stats
from traceflops.flops.aten.framework_gemm import MOE_OPS
from traceflops.flops.aten.registry import MATMUL_OPS, WRAPPER_OPS, OpFlops, op_flops
from traceflops.flops.aten.shapes import OP_FLOPS_MAX, OUT_OF_RANGE, tensor_bytes

__all__ = [
    "MATMUL_OPS",
    "MOE_OPS",
    "OP_FLOPS_MAX",
    "OUT_OF_RANGE",
    "WRAPPER_OPS",
    "OpFlops",
    "op_flops",
    "tensor_bytes",
    "vllm_batch_stats",
]
