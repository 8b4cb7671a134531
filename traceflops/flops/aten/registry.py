"""The lookup from an op name to its FLOP formula, and op_flops, which turns a formula's result into an OpFlops.

It merges every formula module's table into one registry (refusing a second formula for one op), so callers
need one entry point and the public op sets (MATMUL_OPS, WRAPPER_OPS) are computed over all families at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traceflops.core.dtypes import dtype_of
from traceflops.flops.aten import (
    attention,
    conv,
    framework_attention,
    framework_gemm,
    matmul,
)
from traceflops.flops.aten.shapes import (
    OP_FLOPS_MAX,
    OUT_OF_RANGE,
    Args,
    Bad,
    R,
    tensor_bytes,
    valid_shape,
)
from traceflops.flops.aten.table import Entry, Formula


@dataclass(frozen=True, slots=True)
class OpFlops:
    flops: int | None  # convention FLOPs (FlopCounterMode's: full attention whatever the mask); None = unknown
    effective: int | None  # FLOPs the kernel really does (masked attention skips the masked part)
    recompute: int  # part of `flops` that is in-kernel recompute (fused attention backward's QK^T)
    mask: str | None  # attention only: 'full' | 'causal' | 'unknown'
    bytes: int | None  # bytes of inputs read + outputs written, from dims and dtypes
    dtype: str | None  # normalized compute dtype ('fp32', 'bf16', 'fp16', 'fp8', 'fp64', 'int8', ...)
    reason: str | None  # why flops is None


_REGISTRY: dict[str, Entry] = {}


def _reg(names, fn: Formula, primary: int = 0, attention: bool = False) -> None:
    """Register a formula; a second formula for one op is refused (a silent override would change its count)."""
    for n in [names] if isinstance(names, str) else names:
        if "aten::" + n in _REGISTRY:
            raise ValueError(f"aten::{n} already has a FLOP formula")
        _REGISTRY["aten::" + n] = Entry(fn, primary, attention)


def _reg_ns(names, fn: Formula, primary: int = 0, attention: bool = False) -> None:
    """Register a formula under fully qualified names ("aiter::mha_fwd"); a second one is refused."""
    for n in [names] if isinstance(names, str) else names:
        if "::" not in n:
            raise ValueError(f"{n}: a framework op is registered with its namespace")
        if n in _REGISTRY:
            raise ValueError(f"{n} already has a FLOP formula")
        _REGISTRY[n] = Entry(fn, primary, attention)


# Every formula module's table, in the order the op families were registered in before the split.
for _table in (matmul.TABLE, conv.TABLE, attention.TABLE, framework_gemm.TABLE, framework_attention.TABLE):
    for _qualified, _names, _fn, _primary, _attention in _table.rows:
        (_reg_ns if _qualified else _reg)(_names, _fn, _primary, _attention)

MATMUL_OPS: frozenset[str] = frozenset(_REGISTRY)

WRAPPER_OPS: frozenset[str] = frozenset(
    "aten::" + n
    for n in (
        "matmul",
        "linear",
        "einsum",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "_convolution",
        "_convolution_mode",
        "convolution_overrideable",
        "thnn_conv2d",
        "slow_conv3d",
        "cudnn_convolution_backward",
        "cudnn_convolution_transpose_backward",
        "miopen_convolution_backward",
        "miopen_convolution_transpose_backward",
        "miopen_depthwise_convolution_backward",
        "scaled_dot_product_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_attention_math_for_mps",
        # CUDA SDPA ops call the kernels _flash_attention_* / _efficient_attention_*
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
    )
)
assert WRAPPER_OPS <= MATMUL_OPS


def _norm_name(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    n = name.strip()
    if "::" not in n:
        n = "aten::" + n
    return n


def op_flops(
    name: str,
    dims: list | None,
    types: list | None,
    concrete: list | None,
    out_dims: list[int] | None = None,
    *,
    context: dict | None = None,
) -> OpFlops | None:
    """FLOPs of one profiler cpu_op event; None when `name` has no formula (not matmul-class).

    dims / types / concrete are the event's 'Input Dims', 'Input type' and 'Concrete Inputs'.
    out_dims, when known from elsewhere (e.g. the consumer of the result), is the output shape:
    it stands in for convolution stride/padding when Concrete Inputs are missing.
    context holds facts recorded outside the event; formulas that need none ignore it. Its one key
    now: "seq_stats", the step's sequence lengths (vllm_batch_stats of the enclosing annotation),
    which vLLM's attention ops need.
    """
    key = _norm_name(name)
    entry = _REGISTRY.get(key) if key else None
    if entry is None:
        return None
    mask_default = "unknown" if entry.attention else None
    types_ok = types if isinstance(types, (list, tuple)) else None
    dtype = None
    if types_ok is not None and 0 <= entry.primary < len(types_ok):
        dtype = dtype_of(types_ok[entry.primary]) if isinstance(types_ok[entry.primary], str) else None
    if not isinstance(dims, (list, tuple)):
        return OpFlops(None, None, 0, mask_default, None, dtype, "no Input Dims")
    if out_dims is not None and not valid_shape(out_dims):
        out_dims = None
    a = Args(list(dims), types_ok, concrete, context)
    try:
        r = entry.fn(a, list(out_dims) if out_dims is not None else None)
    except Bad as e:
        return OpFlops(None, None, 0, mask_default, None, dtype, str(e))
    except Exception as e:
        return OpFlops(None, None, 0, mask_default, None, dtype, f"malformed inputs ({type(e).__name__}: {e})")
    try:
        nbytes = _bytes(r.args if r.args is not None else a, r, out_dims)
    except Exception:
        nbytes = None
    mask = r.mask if entry.attention else None
    if entry.attention and mask is None:
        mask = "unknown"
    if nbytes is not None and not 0 <= nbytes <= OP_FLOPS_MAX:
        nbytes = None
    if r.flops is None:
        return OpFlops(None, None, 0, mask, nbytes, dtype, r.reason or "unknown")
    eff = r.effective if r.effective is not None else r.flops
    if not all(0 <= int(x) <= OP_FLOPS_MAX for x in (r.flops, eff, r.recompute)):
        return OpFlops(
            None, None, 0, mask, nbytes, dtype, f"{OUT_OF_RANGE}: its shapes imply {float(r.flops):.3g} FLOPs"
        )
    return OpFlops(int(r.flops), int(eff), int(r.recompute), mask, nbytes, dtype, None)


def _bytes(a: Args, r: R, out_dims) -> int | None:
    if a.types is None:
        return None
    outs = r.outs
    if out_dims is not None and r.single_out:
        ot = outs[0][1] if outs else None
        if ot is None and r.reads:
            ot = a.type(r.reads[0])
        outs = [(tuple(out_dims), ot)]
    if outs is None:
        return None
    total = 0
    for i in r.reads:
        if a.is_tensor(i):
            b = tensor_bytes(a.dims[i], a.type(i))
            if b is None:
                return None
            total += b
    for shape, t in list(outs) + list(r.extra_reads):
        b = tensor_bytes(list(shape), t)
        if b is None:
            return None
        total += b
    return total
