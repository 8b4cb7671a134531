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

This module must not import torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceflops.core.dtypes import dtype_of, itemsize

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


# One op's FLOPs above this (2.9e17: minutes of a whole accelerator's peak) are not a real op's: the shapes
# are corrupt or hostile, and summing such values would wrap the 64-bit counters.
OP_FLOPS_MAX = 1 << 58
OUT_OF_RANGE = "out of range"


@dataclass(frozen=True, slots=True)
class OpFlops:
    flops: int | None        # convention FLOPs (FlopCounterMode's: full attention whatever the mask); None = unknown
    effective: int | None    # FLOPs the kernel really does (masked attention skips the masked part)
    recompute: int           # part of `flops` that is in-kernel recompute (fused attention backward's QK^T)
    mask: str | None         # attention only: 'full' | 'causal' | 'unknown'
    bytes: int | None        # bytes of inputs read + outputs written, from dims and dtypes
    dtype: str | None        # normalized compute dtype ('fp32', 'bf16', 'fp16', 'fp8', 'fp64', 'int8', ...)
    reason: str | None       # why flops is None


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------


# c10::ScalarType enum value (how Concrete Inputs records a dtype argument) -> profiler type string
_SCALAR_TYPE_NUM: dict[int, str] = {
    0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int",
    5: "c10::Half", 6: "float", 7: "double", 8: "c10::complex<c10::Half>",
    9: "c10::complex<float>", 10: "c10::complex<double>", 11: "bool",
    12: "c10::qint8", 13: "c10::quint8", 14: "c10::qint32", 15: "c10::BFloat16",
    16: "c10::quint4x2", 17: "c10::quint2x4",
    23: "c10::Float8_e5m2", 24: "c10::Float8_e4m3fn", 25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz", 27: "short unsigned int", 28: "unsigned int",
    29: "long unsigned int", 44: "c10::Float8_e8m0fnu", 45: "c10::Float4_e2m1fn_x2",
}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _valid_shape(dims: Any) -> bool:
    return isinstance(dims, (list, tuple)) and all(_is_int(d) and d >= 0 for d in dims)


def tensor_bytes(dims, type_str) -> int | None:
    """Bytes of a dense tensor with these dims and this profiler type string; None if unknown."""
    size = itemsize(type_str)
    if size is None or not _valid_shape(dims):
        return None
    return math.prod(dims) * size


# --------------------------------------------------------------------------------------
# argument access
# --------------------------------------------------------------------------------------


class _Bad(Exception):
    """Inputs do not allow a count; the message is the reason."""


_BOOL_STR = {"true": True, "false": False}


def _parse_scalar(s: Any) -> Any:
    """Concrete input -> python value (int, float, bool, list, str) or None when empty."""
    if s is None:
        return None
    if isinstance(s, (bool, int, float)):
        return s
    if isinstance(s, (list, tuple)):
        return [_parse_scalar(x) for x in s]
    if not isinstance(s, str):
        return None
    t = s.strip()
    if t == "":
        return None
    if t.lower() in _BOOL_STR:
        return _BOOL_STR[t.lower()]
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        if inner == "":
            return []
        return [_parse_scalar(p) for p in inner.split(",")]
    if re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    try:
        return float(t)
    except ValueError:
        return t


class _Args:
    def __init__(self, dims: list, types: list | None, concrete: list | None, context: dict | None = None):
        self.dims = dims
        self.types = types if isinstance(types, (list, tuple)) else None
        self.concrete = concrete if isinstance(concrete, (list, tuple)) else None
        self.context = context if isinstance(context, dict) else None  # facts from outside the event

    def with_dims(self, dims: list) -> _Args:
        """The same arguments seen through other shapes (a dense view of a packed batch)."""
        return _Args(dims, self.types, self.concrete, self.context)

    def __len__(self) -> int:
        return len(self.dims)

    def type(self, i: int | None) -> str | None:
        if i is None or self.types is None or not (0 <= i < len(self.types)):
            return None
        t = self.types[i]
        return t if isinstance(t, str) else None

    def is_tensor(self, i: int | None) -> bool:
        """Whether argument i is a (defined) tensor."""
        if i is None or not (0 <= i < len(self.dims)):
            return False
        if self.types is not None:
            return dtype_of(self.type(i) or "") is not None
        d = self.dims[i]
        return isinstance(d, (list, tuple)) and len(d) > 0 and _valid_shape(d)

    def shape(self, i: int, what: str, ndims: tuple[int, ...] | None = None, min_ndim: int = 1) -> tuple[int, ...]:
        if not (0 <= i < len(self.dims)):
            raise _Bad(f"{what}: argument {i} not recorded (only {len(self.dims)} Input Dims)")
        d = self.dims[i]
        if not isinstance(d, (list, tuple)):
            raise _Bad(f"{what}: Input Dims[{i}] is not a list")
        if not all(_is_int(x) for x in d):
            raise _Bad(f"{what}: Input Dims[{i}] has non-int sizes")
        if any(x < 0 for x in d):
            raise _Bad(f"{what}: Input Dims[{i}] has negative sizes")
        if ndims is not None and len(d) not in ndims:
            want = " or ".join(str(n) for n in ndims)
            raise _Bad(f"{what}: expected {want}-D, got {len(d)}-D {list(d)}")
        if ndims is None and len(d) < min_ndim:
            raise _Bad(f"{what}: expected at least {min_ndim}-D, got {len(d)}-D {list(d)}")
        return tuple(d)

    def raw(self, i: int | None) -> Any:
        if i is None or self.concrete is None or not (0 <= i < len(self.concrete)):
            return None
        return _parse_scalar(self.concrete[i])

    def c_bool(self, i: int | None) -> bool | None:
        v = self.raw(i)
        if isinstance(v, bool):
            return v
        if _is_int(v) and v in (0, 1):
            return bool(v)
        return None

    def c_int(self, i: int | None) -> int | None:
        v = self.raw(i)
        return v if _is_int(v) else None

    def c_ints(self, i: int | None) -> list[int] | None:
        v = self.raw(i)
        if _is_int(v):
            return [v]
        if isinstance(v, list) and all(_is_int(x) for x in v):
            return v
        return None

    def c_bools(self, i: int | None) -> list[bool] | None:
        v = self.raw(i)
        if isinstance(v, list) and v and all(isinstance(x, bool) for x in v):
            return v
        return None

    def c_dtype(self, i: int | None) -> str | None:
        """A ScalarType argument (recorded as its enum number) -> profiler type string."""
        v = self.c_int(i)
        return _SCALAR_TYPE_NUM.get(v) if v is not None else None


@dataclass
class _R:
    """What a formula found; op_flops turns it into an OpFlops."""

    flops: int | None
    effective: int | None = None
    recompute: int = 0
    mask: str | None = None
    reason: str | None = None
    reads: tuple[int, ...] = ()                         # argument indices read (tensors only are counted)
    outs: list[tuple[tuple[int, ...], str | None]] | None = None  # outputs written; None = unknown
    single_out: bool = True                             # out_dims (if given) describes outs[0]
    args: _Args | None = None                           # the view the counts were made on, when not the event's
    extra_reads: list[tuple[tuple[int, ...], str | None]] = field(default_factory=list)  # read, not arguments


def _unknown(reason: str, reads=(), outs=None, mask=None) -> _R:
    return _R(None, None, 0, mask, reason, tuple(reads), outs)


def _out_type(a: _Args, default_idx: int, dtype_idx: int | None = None) -> str | None:
    t = a.c_dtype(dtype_idx)
    return t if t is not None else a.type(default_idx)


def _fp4_mult(a: _Args, i: int) -> int:
    """Packed fp4 stores two values per element along the contraction dim."""
    return 2 if dtype_of(a.type(i) or "") == "fp4" else 1


# --------------------------------------------------------------------------------------
# matmul family
# --------------------------------------------------------------------------------------


def _mm_mnk(a_shape, b_shape, what: str) -> tuple[int, int, int]:
    m, k = a_shape
    k2, n = b_shape
    if k != k2:
        raise _Bad(f"{what}: inner dimensions differ ({list(a_shape)} @ {list(b_shape)})")
    return m, n, k


def _mm_like(ia: int, ib: int, reads: tuple[int, ...], out_dtype_idx: int | None = None,
             kmult: bool = False, out_type: str | None = None):
    def f(a: _Args, out_dims) -> _R:
        sa = a.shape(ia, "mat1", (2,))
        sb = a.shape(ib, "mat2", (2,))
        m, n, k = _mm_mnk(sa, sb, "mm")
        k *= _fp4_mult(a, ia) if kmult else 1
        flops = 2 * m * n * k
        ot = out_type or _out_type(a, ia, out_dtype_idx)
        return _R(flops, reads=reads, outs=[((m, n), ot)])
    return f


def _f_mm(a: _Args, out_dims) -> _R:
    # mm(self, mat2) ; mm.out(self, mat2, out) ; mm.dtype(self, mat2, out_dtype)
    dt_idx = 2 if a.type(2) == "Scalar" else None
    r = _mm_like(0, 1, (0, 1), dt_idx)(a, out_dims)
    if a.is_tensor(2):  # the out= tensor decides the output dtype
        r.outs = [(r.outs[0][0], a.type(2))]
    return r


def _bmm_like(ia: int, ib: int, reads: tuple[int, ...]):
    def f(a: _Args, out_dims) -> _R:
        sa = a.shape(ia, "batch1", (3,))
        sb = a.shape(ib, "batch2", (3,))
        if sa[0] != sb[0]:
            raise _Bad(f"bmm: batch sizes differ ({list(sa)} @ {list(sb)})")
        m, n, k = _mm_mnk(sa[1:], sb[1:], "bmm")
        dt_idx = ib + 1 if a.type(ib + 1) == "Scalar" and ia == 0 else None
        return _R(2 * sa[0] * m * n * k, reads=reads, outs=[((sa[0], m, n), _out_type(a, ia, dt_idx))])
    return f


def _broadcast(s1: tuple[int, ...], s2: tuple[int, ...], what: str) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(s1), len(s2)) + 1):
        x = s1[-i] if i <= len(s1) else 1
        y = s2[-i] if i <= len(s2) else 1
        if x != y and x != 1 and y != 1:
            raise _Bad(f"{what}: batch dims do not broadcast ({list(s1)} vs {list(s2)})")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def _matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """torch.matmul semantics -> (flops, output shape)."""
    if len(sa) == 0 or len(sb) == 0:
        raise _Bad("matmul: 0-D operand")
    if len(sa) == 1 and len(sb) == 1:
        if sa[0] != sb[0]:
            raise _Bad(f"matmul: sizes differ ({list(sa)} @ {list(sb)})")
        return 2 * sa[0], ()
    if len(sb) == 1:  # (..., M, K) @ (K,)
        if sa[-1] != sb[0]:
            raise _Bad(f"matmul: inner dimensions differ ({list(sa)} @ {list(sb)})")
        return 2 * math.prod(sa[:-1]) * sa[-1], tuple(sa[:-1])
    if len(sa) == 1:  # (K,) @ (..., K, N)
        if sa[0] != sb[-2]:
            raise _Bad(f"matmul: inner dimensions differ ({list(sa)} @ {list(sb)})")
        return 2 * math.prod(sb[:-2]) * sb[-2] * sb[-1], tuple(sb[:-2]) + (sb[-1],)
    batch = _broadcast(sa[:-2], sb[:-2], "matmul")
    m, n, k = _mm_mnk(sa[-2:], sb[-2:], "matmul")
    return 2 * math.prod(batch) * m * n * k, batch + (m, n)


def _f_matmul(a: _Args, out_dims) -> _R:
    sa = a.shape(0, "self", min_ndim=1)
    sb = a.shape(1, "other", min_ndim=1)
    flops, out = _matmul_shapes(sa, sb)
    return _R(flops, reads=(0, 1), outs=[(out, a.type(0))])


def _f_linear(a: _Args, out_dims) -> _R:
    # linear(input, weight, bias=None): input (..., in), weight (out, in) or (in,)
    x = a.shape(0, "input", min_ndim=1)
    w = a.shape(1, "weight", (1, 2))
    if x[-1] != w[-1]:
        raise _Bad(f"linear: in_features differ (input {list(x)}, weight {list(w)})")
    n_out = w[0] if len(w) == 2 else 1
    out = tuple(x[:-1]) + ((w[0],) if len(w) == 2 else ())
    return _R(2 * math.prod(x[:-1]) * x[-1] * n_out, reads=(0, 1, 2), outs=[(out, a.type(0))])


def _f_einsum(a: _Args, out_dims) -> _R:
    # einsum(str equation, Tensor[] tensors, *, int[]? path): the profiler does not record the
    # equation string, so this normally cannot be counted; the leaf bmm/mm children are.
    eq = a.raw(0)
    if not isinstance(eq, str) or not eq:
        return _unknown("einsum equation not recorded (count its bmm/mm children)")
    ops = a.dims[1] if len(a.dims) > 1 else None
    if not isinstance(ops, (list, tuple)) or not all(_valid_shape(s) for s in ops):
        raise _Bad("einsum: operand shapes not recorded")
    eq = eq.replace(" ", "")
    if "..." in eq:
        return _unknown("einsum with ellipsis not supported")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise _Bad("einsum: operand count does not match the equation")
    if not all(len(t) == len(s) for t, s in zip(terms, ops)):
        raise _Bad("einsum: operand rank does not match the equation")
    if "->" not in eq:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    size: dict[str, int] = {}
    for t, s in zip(terms, ops):
        for c, n in zip(t, s):
            if size.setdefault(c, n) != n and n != 1 and size[c] != 1:
                raise _Bad(f"einsum: size of '{c}' differs between operands")
            size[c] = max(size[c], n)
    out = tuple(size[c] for c in rhs)
    if len(ops) == 1:
        return _R(0, reads=(1,), outs=None)
    if len(ops) > 2:
        return _unknown("einsum with more than 2 operands: contraction order not recorded")
    a_set, b_set, o_set = set(terms[0]), set(terms[1]), set(rhs)
    # torch sums away indices that occur in one operand only before the pairwise product
    keep = {c for c in a_set | b_set if c in o_set or (c in a_set and c in b_set)}
    contracted = (a_set & b_set) - o_set
    flops = 2 * math.prod(size[c] for c in keep) if contracted else 0
    return _R(flops, reads=(), outs=[(out, None)])


# --------------------------------------------------------------------------------------
# grouped mm (MoE)
# --------------------------------------------------------------------------------------


def _grouped(offs_idx: int, dtype_idx: int | None, reads: tuple[int, ...], scaled: bool):
    """_grouped_mm(self, mat2, offs, ...): four layouts (offs = cumulative group ends):

    2D x 3D: (M_total, K) x (G, K, N), offs splits M     -> (M_total, N)   2·M_total·K·N
    3D x 2D: (G, M, K) x (K, N_total), offs splits N     -> (M, N_total)   2·M·K·N_total
    2D x 2D: (M, K_total) x (K_total, N), offs splits K  -> (G, M, N)      2·M·N·K_total
    3D x 3D: (G, M, K) x (G, K, N), no offs              -> (G, M, N)      2·G·M·N·K
    Offset values are never recorded; the count assumes the groups cover the whole split
    dimension (rows beyond offs[-1] are left unwritten by the kernel, so this is an upper bound).
    """
    def f(a: _Args, out_dims) -> _R:
        sa = a.shape(0, "mat_a", (2, 3))
        sb = a.shape(1, "mat_b", (2, 3))
        g_offs = None
        if a.is_tensor(offs_idx):
            so = a.shape(offs_idx, "offs", (1,))
            g_offs = so[0]
        mult = _fp4_mult(a, 0) if scaled else 1
        ot = _out_type(a, 0, dtype_idx)
        if scaled and a.c_dtype(dtype_idx) is None:
            ot = "c10::BFloat16"  # scaled grouped mm defaults to bf16 output
        if len(sa) == 2 and len(sb) == 3:
            (m, k), (g, k2, n) = sa, sb
            if k != k2:
                raise _Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            if g_offs is not None and g_offs != g:
                raise _Bad(f"grouped mm: {g_offs} offsets for {g} groups")
            return _R(2 * m * k * mult * n, reads=reads, outs=[((m, n), ot)])
        if len(sa) == 3 and len(sb) == 2:
            (g, m, k), (k2, n) = sa, sb
            if k != k2:
                raise _Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            if g_offs is not None and g_offs != g:
                raise _Bad(f"grouped mm: {g_offs} offsets for {g} groups")
            return _R(2 * m * k * mult * n, reads=reads, outs=[((m, n), ot)])
        if len(sa) == 2 and len(sb) == 2:
            (m, k), (k2, n) = sa, sb
            if k != k2:
                raise _Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            outs = [((g_offs, m, n), ot)] if g_offs is not None else None
            return _R(2 * m * k * mult * n, reads=reads, outs=outs)
        (g, m, k), (g2, k2, n) = sa, sb
        if g != g2 or k != k2:
            raise _Bad(f"grouped mm: shapes do not match ({list(sa)} x {list(sb)})")
        return _R(2 * g * m * k * mult * n, reads=reads, outs=[((g, m, n), ot)])
    return f


# --------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ConvSpec:
    x: int = 0
    w: int = 1
    bias: int | None = 2
    stride: int | None = None
    padding: int | None = None
    dilation: int | None = None          # None: the op has no dilation argument (dilation 1)
    transposed: bool | int = False       # bool, or the index of the `transposed` argument
    output_padding: int | None = None
    groups: int | None = None            # None: the op has no groups argument (groups 1)
    unbatched_ok: bool = False           # conv1d/2d/3d accept an input without batch dim
    depthwise: bool = False              # groups == in_channels


def _spatial_param(a: _Args, idx: int | None, nsp: int, name: str, default: int | None) -> list[int] | None:
    """A stride/padding/... list broadcast to nsp dims; None when not recorded."""
    if idx is None:
        return [default] * nsp if default is not None else None
    v = a.c_ints(idx)
    if v is None:
        return None
    if len(v) == 1:
        v = v * nsp
    if len(v) != nsp:
        raise _Bad(f"convolution: {name} {v} does not fit {nsp} spatial dims")
    return v


def _conv_out_spatial(sp, k, stride, padding, dilation) -> tuple[int, ...]:
    out = []
    for i, kk, s, p, d in zip(sp, k, stride, padding, dilation):
        if s < 1 or d < 1 or p < 0:
            raise _Bad(f"convolution: invalid stride/padding/dilation {stride}/{padding}/{dilation}")
        o = (i + 2 * p - d * (kk - 1) - 1) // s + 1
        if o < 1:
            raise _Bad("convolution: kernel larger than the padded input")
        out.append(o)
    return tuple(out)


def _convt_out_spatial(sp, k, stride, padding, dilation, output_padding) -> tuple[int, ...]:
    return tuple((i - 1) * s - 2 * p + d * (kk - 1) + op + 1
                 for i, kk, s, p, d, op in zip(sp, k, stride, padding, dilation, output_padding))


def _conv_flops(n: int, conv_sp, w) -> int:
    # FlopCounterMode: prod(conv spatial) * prod(kernel) * N * w[0] * w[1] * 2, where conv
    # spatial is the output for a normal conv and the input for a transposed one.
    return 2 * n * math.prod(conv_sp) * math.prod(w[2:]) * w[0] * w[1]


def _conv_fwd(spec: _ConvSpec, name: str):
    def f(a: _Args, out_dims) -> _R:
        w = a.shape(spec.w, "weight", min_ndim=3)
        nsp = len(w) - 2
        x = a.shape(spec.x, "input", min_ndim=1)
        if len(x) == len(w):
            n, c, sp = x[0], x[1], x[2:]
        elif len(x) == len(w) - 1 and spec.unbatched_ok:
            n, c, sp = 1, x[0], x[1:]
        else:
            raise _Bad(f"{name}: input {list(x)} does not fit weight {list(w)}")
        reads = (spec.x, spec.w) + ((spec.bias,) if spec.bias is not None else ())
        transposed = spec.transposed if isinstance(spec.transposed, bool) else a.c_bool(spec.transposed)
        if spec.depthwise:
            groups: int | None = c
        elif spec.groups is None:
            groups = 1
        else:
            groups = a.c_int(spec.groups)
        if groups is not None and groups < 1:
            raise _Bad(f"{name}: groups {groups}")
        k = w[2:]
        stride = _spatial_param(a, spec.stride, nsp, "stride", None)
        # a string padding ('same'/'valid', conv*.padding overloads) is not recorded
        padding = _spatial_param(a, spec.padding, nsp, "padding", None)
        dilation = _spatial_param(a, spec.dilation, nsp, "dilation", 1)
        out_pad = _spatial_param(a, spec.output_padding, nsp, "output_padding", 0)
        same = False
        if spec.padding is not None and padding is None:
            pv = a.raw(spec.padding)
            if pv == "valid":
                padding = [0] * nsp
            elif pv == "same":  # out == in; torch only allows it with stride 1
                same = True
        od = None
        if out_dims is not None:
            if not _valid_shape(out_dims) or len(out_dims) != len(x):
                raise _Bad(f"{name}: out_dims {out_dims} does not fit input {list(x)}")
            od = tuple(out_dims[-nsp:])
        have_geom = stride is not None and padding is not None and dilation is not None
        if transposed is None:
            if od is None:
                return _unknown(f"{name}: transposed flag and stride unknown (no Concrete Inputs); "
                                "pass out_dims", reads)
            # infer from channels: normal conv -> out C == w[0]; transposed -> in C == w[0]
            oc = out_dims[1] if len(x) == len(w) else out_dims[0]
            normal_ok = oc == w[0] and w[1] > 0 and c % w[1] == 0
            trans_ok = c == w[0] and w[1] > 0 and oc % w[1] == 0
            if normal_ok and trans_ok and math.prod(od) != math.prod(sp):
                return _unknown(f"{name}: transposed flag unknown (no Concrete Inputs) and "
                                "ambiguous from shapes", reads)
            if not (normal_ok or trans_ok):
                raise _Bad(f"{name}: channels of input {list(x)}, weight {list(w)}, "
                           f"output {list(out_dims)} do not fit a convolution")
            transposed = not normal_ok
        if transposed:
            out_sp = None
            if have_geom and out_pad is not None:
                out_sp = _convt_out_spatial(sp, k, stride, padding, dilation, out_pad)
            elif od is not None:
                out_sp = od
            return _conv_result(a, spec, n, w, sp, out_sp, True, groups, reads, out_dims, x)
        if have_geom:
            out_sp = _conv_out_spatial(sp, k, stride, padding, dilation)
        elif same:
            out_sp = tuple(sp)
        elif od is not None:
            out_sp = od
        else:
            what = "stride" if stride is None else ("padding" if padding is None else "dilation")
            return _unknown(f"convolution {what} unknown (not in Concrete Inputs); pass out_dims", reads)
        return _conv_result(a, spec, n, w, sp, out_sp, False, groups, reads, out_dims, x)
    return f


def _conv_result(a: _Args, spec: _ConvSpec, n, w, sp, out_sp, transposed, groups, reads, out_dims, x) -> _R:
    c = x[1] if len(x) == len(w) else x[0]
    if transposed:
        if c != w[0]:
            raise _Bad(f"transposed convolution: input channels {c} != weight.shape[0] {w[0]}")
    elif groups is not None and c != w[1] * groups:
        raise _Bad(f"convolution: input channels {c} != weight.shape[1] {w[1]} * groups {groups}")
    flops = _conv_flops(n, sp if transposed else out_sp, w)
    oc = (w[1] * groups if groups is not None else None) if transposed else w[0]
    outs = None
    if out_sp is not None and oc is not None:
        lead = (n, oc) if len(x) == len(w) else (oc,)
        outs = [(lead + tuple(out_sp), a.type(spec.x))]
    return _R(flops, reads=reads, outs=outs)


def _conv_fwd_cudnn(transpose: bool, name: str):
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32)
    # cudnn_convolution.deprecated(self, weight, bias, padding, stride, dilation, groups, ...)  (torch <= 1.7)
    # cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, groups, ...)
    # (and the same with a bias at index 2 in old torch)
    def f(a: _Args, out_dims) -> _R:
        t2 = a.type(2)
        # modern: an int list at index 2; deprecated: a (possibly undefined) bias tensor there
        shift = 0 if (t2 is None or t2 == "ScalarList" or a.c_ints(2) is not None) else 1
        bias = 2 if shift else None
        if transpose:
            spec = _ConvSpec(bias=bias, padding=2 + shift, output_padding=3 + shift, stride=4 + shift,
                             dilation=5 + shift, groups=6 + shift, transposed=True)
        else:
            spec = _ConvSpec(bias=bias, padding=2 + shift, stride=3 + shift, dilation=4 + shift,
                             groups=5 + shift)
        return _conv_fwd(spec, name)(a, out_dims)
    return f


# ---- convolution backward ----


@dataclass(frozen=True)
class _ConvBwdSpec:
    go: int
    x: int | None                 # None: input tensor not an argument (backward_input ops)
    w: int | None                 # None: weight shape from Concrete Inputs[w_size] (backward_weight ops)
    transposed: bool | int
    mask: int | None              # index of output_mask (-1: last argument); None: implied by `grads`
    grads: tuple[bool, bool] = (True, True)   # (grad_input, grad_weight) when mask is None
    w_size: int | None = None
    x_size: int | None = None
    stride: int | None = None     # only needed by ops that must rebuild the input size
    padding: int | None = None
    dilation: int | None = None


def _conv_bwd(spec: _ConvBwdSpec, name: str):
    """grad_input = conv_transpose(grad_out, w) and grad_weight = conv(x, grad_out): each is the
    same number of multiply-adds as the forward conv, 2·N·prod(conv spatial)·prod(k)·w0·w1 with conv
    spatial = grad_out's (normal conv) or input's (transposed conv).

    FlopCounterMode counts grad_weight as 2·N·C_in·C_out·prod(k)·prod(spatial), which is `groups`
    times the real work for grouped convolutions; here the real work is counted (equal for groups=1).
    """
    def f(a: _Args, out_dims) -> _R:
        go = a.shape(spec.go, "grad_output", min_ndim=3)
        x = a.shape(spec.x, "input", (len(go),)) if spec.x is not None else None
        if spec.w is not None:
            w = a.shape(spec.w, "weight", (len(go),))
        else:
            ws = a.c_ints(spec.w_size)
            if ws is None and out_dims is not None and _valid_shape(out_dims):
                ws = list(out_dims)
            if ws is None:
                return _unknown(f"{name}: weight size unknown (no Concrete Inputs); pass out_dims",
                                (spec.go, spec.x))
            if len(ws) != len(go) or not _valid_shape(ws):
                raise _Bad(f"{name}: weight size {ws} does not fit grad_output {list(go)}")
            w = tuple(ws)
        reads = tuple(i for i in (spec.go, spec.x, spec.w) if i is not None)
        transposed = spec.transposed if isinstance(spec.transposed, bool) else a.c_bool(spec.transposed)
        if spec.mask is not None:
            mask_idx = spec.mask if spec.mask >= 0 else len(a) - 1
            mask = a.c_bools(mask_idx)
            if mask is None or len(mask) < 2:
                return _unknown(f"{name}: output_mask unknown (no Concrete Inputs)", reads)
        else:
            mask = list(spec.grads)
        if transposed is None:
            return _unknown(f"{name}: transposed flag unknown (no Concrete Inputs)", reads)
        n = go[0]
        if x is not None and x[0] != n:
            raise _Bad(f"{name}: batch of input {list(x)} != grad_output {list(go)}")
        # channel checks: normal conv: go C == w0 ; transposed: x C == w0
        if not transposed and go[1] != w[0]:
            raise _Bad(f"{name}: grad_output channels {go[1]} != weight.shape[0] {w[0]}")
        if transposed and x is not None and x[1] != w[0]:
            raise _Bad(f"{name}: input channels {x[1]} != weight.shape[0] {w[0]}")
        nsp = len(go) - 2
        if transposed:
            if x is not None:
                sp = x[2:]
            else:
                stride = _spatial_param(a, spec.stride, nsp, "stride", None)
                padding = _spatial_param(a, spec.padding, nsp, "padding", None)
                dilation = _spatial_param(a, spec.dilation, nsp, "dilation", 1)
                xs = a.c_ints(spec.x_size)
                if xs is not None and len(xs) == len(go):
                    sp = tuple(xs[2:])
                elif out_dims is not None and _valid_shape(out_dims) and len(out_dims) == len(go):
                    sp = tuple(out_dims[2:])
                elif stride is not None and padding is not None and dilation is not None:
                    sp = _conv_out_spatial(go[2:], w[2:], stride, padding, dilation)
                else:
                    return _unknown(f"{name}: input size unknown (no Concrete Inputs); pass out_dims", reads)
        else:
            sp = go[2:]
        base = _conv_flops(n, sp, w)
        flops = base * (int(bool(mask[0])) + int(bool(mask[1])))
        outs: list | None = []
        if mask[0]:
            xshape = x
            if xshape is None:
                xs = a.c_ints(spec.x_size)
                if xs is not None and len(xs) == len(go):
                    xshape = tuple(xs)
                elif out_dims is not None and _valid_shape(out_dims) and len(out_dims) == len(go):
                    xshape = tuple(out_dims)
                elif transposed:
                    xshape = (n, w[0]) + tuple(sp)
            if xshape is None:
                outs = None
            else:
                outs.append((tuple(xshape), a.type(spec.x) if spec.x is not None else a.type(spec.go)))
        if outs is not None and mask[1]:
            outs.append((tuple(w), a.type(spec.w) if spec.w is not None else a.type(spec.go)))
        if outs is not None and len(mask) > 2 and mask[2]:
            outs.append(((go[1],), a.type(spec.go)))
        r = _R(flops, reads=reads, outs=outs)
        r.single_out = False
        return r
    return f


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
class _AttnSpec:
    layout: str                       # 'bhsd' (SDPA ops), 'bshd' (flash/efficient kernels), 'any' (SDPA API)
    q: int
    k: int
    v: int
    go: int | None = None             # grad_out (backward)
    causal: int | None = None         # index of bool is_causal
    mask_type: int | None = None      # index of int custom_mask_type (efficient kernels)
    align: str = "top_left"
    masks: tuple[int, ...] = ()       # attn_mask / attn_bias tensor arguments
    window: tuple[int, ...] = ()      # sliding-window size arguments
    varlen: tuple[int, ...] = ()      # cu_seqlens arguments (efficient kernels)
    paged: int | None = None          # block_table (paged KV cache)
    reads: tuple[int, ...] = ()
    math: bool = False                # unfused math path: computes the full score matrix


def _attn(spec: _AttnSpec, name: str):
    def f(a: _Args, out_dims) -> _R:
        bwd = spec.go is not None
        mask = _attn_mask_kind(a, spec)
        reads = spec.reads
        if spec.layout == "bshd":
            q = a.shape(spec.q, "query", (3, 4))
            if len(q) == 3:
                return _unknown(f"{name}: variable-length (packed) batch: per-sequence lengths "
                                "(cum_seq values) are not recorded", reads, mask=mask)
        if spec.varlen and any(a.is_tensor(i) and _nonempty(a.dims[i]) for i in spec.varlen):
            return _unknown(f"{name}: variable-length batch: per-sequence lengths (cu_seqlens "
                            "values) are not recorded", reads, mask=mask)
        if spec.paged is not None and a.is_tensor(spec.paged):
            return _unknown(f"{name}: paged KV cache (block_table): key length not recorded",
                            reads, mask=mask)
        if spec.layout == "any":
            q = a.shape(spec.q, "query", min_ndim=2)
            k = a.shape(spec.k, "key", min_ndim=2)
            v = a.shape(spec.v, "value", min_ndim=2)
            sq, dq, sk, dk, skv, dv = q[-2], q[-1], k[-2], k[-1], v[-2], v[-1]
            if len(q) >= 3 and len(k) >= 3 and k[-3] != q[-3]:
                # GQA (enable_gqa): key/value heads are repeated up to the query heads
                if k[-3] == 0 or q[-3] % k[-3] != 0:
                    raise _Bad(f"{name}: query heads {q[-3]} not a multiple of key heads {k[-3]}")
                k = k[:-3] + (q[-3],) + k[-2:]
            batch = _broadcast(q[:-2], k[:-2], name)
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
                raise _Bad(f"{name}: batch sizes differ (q {list(q)}, k {list(k)}, v {list(v)})")
            if hk != hv:
                raise _Bad(f"{name}: key/value heads differ (k {list(k)}, v {list(v)})")
            if hk == 0 or hq % hk != 0:
                raise _Bad(f"{name}: query heads {hq} not a multiple of key/value heads {hk}")
            bh = b * hq  # GQA counted on the expanded heads, as FlopCounterMode does
            out_shape = (b, hq, sq, dv) if spec.layout == "bhsd" else (b, sq, hq, dv)
        if dq != dk:
            raise _Bad(f"{name}: query/key head dims differ ({dq} vs {dk})")
        if sk != skv:
            raise _Bad(f"{name}: key/value lengths differ ({sk} vs {skv})")
        if bwd:
            go = a.shape(spec.go, "grad_out", min_ndim=2)
            if tuple(go) != tuple(out_shape):
                raise _Bad(f"{name}: grad_out {list(go)} does not match the output {list(out_shape)}")
            per_pair = 2 * (3 * dq + 2 * dv)   # QK^T recompute, dO·V^T, P^T·dO, dS·K, dS^T·Q
            recompute_pp = 2 * dq
        else:
            per_pair = 2 * (dq + dv)           # Q·K^T, P·V
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
            outs = [(tuple(q), a.type(spec.q)), (tuple(a.dims[spec.k]), a.type(spec.k)),
                    (tuple(a.dims[spec.v]), a.type(spec.v))]
        else:
            outs = [(tuple(out_shape), a.type(spec.q))]
        r = _R(flops, effective, recompute, mask, reads=reads, outs=outs)
        r.single_out = not bwd
        return r
    return f


def _nonempty(d) -> bool:
    return isinstance(d, (list, tuple)) and len(d) > 0 and _valid_shape(d) and math.prod(d) > 0


def _attn_mask_kind(a: _Args, spec: _AttnSpec) -> str:
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


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------

_Formula = Callable[[_Args, Any], _R]


@dataclass(frozen=True)
class _Entry:
    fn: _Formula
    primary: int = 0          # argument whose dtype is the compute dtype
    attention: bool = False


_REGISTRY: dict[str, _Entry] = {}


def _reg(names, fn: _Formula, primary: int = 0, attention: bool = False) -> None:
    """Register a formula; a second formula for one op is refused (a silent override would change its count)."""
    for n in ([names] if isinstance(names, str) else names):
        if "aten::" + n in _REGISTRY:
            raise ValueError(f"aten::{n} already has a FLOP formula")
        _REGISTRY["aten::" + n] = _Entry(fn, primary, attention)


# matmul
_reg("mm", _f_mm)
_reg("_int_mm", _mm_like(0, 1, (0, 1), out_type="int"))
_reg(["addmm", "_addmm_activation"], _mm_like(1, 2, (0, 1, 2), out_dtype_idx=None), primary=1)
_reg("bmm", _bmm_like(0, 1, (0, 1)))
_reg("baddbmm", _bmm_like(1, 2, (0, 1, 2)), primary=1)
_reg("matmul", _f_matmul)
_reg("linear", _f_linear)
_reg("einsum", _f_einsum, primary=1)
# _scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
_reg("_scaled_mm", _mm_like(0, 1, (0, 1, 2, 3, 4, 5), out_dtype_idx=6, kmult=True))
# _scaled_mm_v2(self, mat2, scale_a[], recipe_a, swizzle_a, scale_b[], recipe_b, swizzle_b, bias, out_dtype, ...)
_reg("_scaled_mm_v2", _mm_like(0, 1, (0, 1, 8), out_dtype_idx=9, kmult=True))
# _grouped_mm(self, mat2, offs, bias, out_dtype)
_reg("_grouped_mm", _grouped(2, 4, (0, 1, 2, 3), scaled=False))
# _scaled_grouped_mm(self, mat2, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
_reg("_scaled_grouped_mm", _grouped(4, 7, (0, 1, 2, 3, 4, 5), scaled=True))
# _scaled_grouped_mm_v2(self, mat2, scale_a[], recipe_a, swizzle_a, scale_b[], recipe_b, swizzle_b, offs, bias, out_dtype, ...)
_reg("_scaled_grouped_mm_v2", _grouped(8, 10, (0, 1, 8, 9), scaled=True))

# convolution forward (argument positions differ between ops: padding comes before stride in
# the cudnn/miopen/mkldnn kernels, after it in the dispatcher-level ops)
_CONV = _ConvSpec(stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8)
_reg(["convolution", "_convolution", "convolution_overrideable"], _conv_fwd(_CONV, "convolution"))
for _n in ("conv1d", "conv2d", "conv3d"):
    _reg(_n, _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6, unbatched_ok=True), _n))
for _n in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
    _reg(_n, _conv_fwd(_ConvSpec(stride=3, padding=4, output_padding=5, groups=6, dilation=7,
                                 transposed=True, unbatched_ok=True), _n))
_reg("_convolution_mode", _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6), "_convolution_mode"))
_reg("cudnn_convolution", _conv_fwd_cudnn(False, "cudnn_convolution"))
_reg("cudnn_convolution_transpose", _conv_fwd_cudnn(True, "cudnn_convolution_transpose"))
_reg(["cudnn_convolution_relu", "miopen_convolution_relu"],
     _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6), "convolution_relu"))
_reg(["cudnn_convolution_add_relu", "miopen_convolution_add_relu"],
     _conv_fwd(_ConvSpec(bias=4, stride=5, padding=6, dilation=7, groups=8), "convolution_add_relu"))
_reg(["miopen_convolution", "miopen_depthwise_convolution", "mkldnn_convolution"],
     _conv_fwd(_ConvSpec(padding=3, stride=4, dilation=5, groups=6), "convolution"))
_reg("miopen_convolution_transpose",
     _conv_fwd(_ConvSpec(padding=3, output_padding=4, stride=5, dilation=6, groups=7, transposed=True),
               "miopen_convolution_transpose"))
# (self, weight, kernel_size, bias, stride, padding[, dilation])
_reg(["_slow_conv2d_forward", "thnn_conv2d", "thnn_conv2d_forward", "slow_conv3d_forward",
      "slow_conv3d", "thnn_conv3d"],
     _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5), "slow_conv"))
_reg(["slow_conv_dilated2d", "slow_conv_dilated3d"],
     _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5, dilation=6), "slow_conv_dilated"))
_reg(["_conv_depthwise2d", "conv_depthwise3d", "thnn_conv_depthwise2d", "thnn_conv_depthwise2d_forward"],
     _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5, dilation=6, depthwise=True), "conv_depthwise"))
_reg(["slow_conv_transpose2d", "slow_conv_transpose3d"],
     _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True),
               "slow_conv_transpose"))
_reg("_nnpack_spatial_convolution", _conv_fwd(_ConvSpec(padding=3, stride=4), "_nnpack_spatial_convolution"))

# convolution backward
# convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
#                      output_padding, groups, output_mask)
_reg("convolution_backward", _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=7, mask=10),
                                       "convolution_backward"))
# convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
#                                   output_padding, groups, output_mask)
_reg("convolution_backward_overrideable",
     _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=6, mask=9), "convolution_backward_overrideable"))
# 2021-era kernels: note `self` (the input) comes BEFORE grad_output here
# cudnn_convolution_backward(self, grad_output, weight, padding, stride, dilation, groups, benchmark,
#                            deterministic[, allow_tf32], output_mask)
_reg(["cudnn_convolution_backward", "miopen_convolution_backward", "miopen_depthwise_convolution_backward"],
     _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=False, mask=-1), "cudnn_convolution_backward"))
_reg(["cudnn_convolution_transpose_backward", "miopen_convolution_transpose_backward"],
     _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=True, mask=-1),
               "cudnn_convolution_transpose_backward"))
# mkldnn_convolution_backward(self, grad_output, weight, padding, stride, dilation, groups, output_mask)
_reg("mkldnn_convolution_backward",
     _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=False, mask=-1), "mkldnn_convolution_backward"))
# _slow_conv2d_backward(grad_output, self, weight, kernel_size, stride, padding, output_mask) and the
# older thnn_conv2d_backward / slow_conv3d_backward(..., finput, fgrad_input, output_mask)
_reg(["_slow_conv2d_backward", "thnn_conv2d_backward", "slow_conv3d_backward"],
     _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=False, mask=-1), "slow_conv_backward"))
# cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride, dilation, groups, ...)
_reg(["cudnn_convolution_backward_input", "miopen_convolution_backward_input",
      "miopen_depthwise_convolution_backward_input"],
     _conv_bwd(_ConvBwdSpec(go=1, x=None, w=2, transposed=False, mask=None, grads=(True, False), x_size=0), "convolution_backward_input"))
# cudnn_convolution_backward_weight(weight_size, grad_output, self, padding, stride, dilation, groups, ...)
_reg(["cudnn_convolution_backward_weight", "miopen_convolution_backward_weight",
      "miopen_depthwise_convolution_backward_weight"],
     _conv_bwd(_ConvBwdSpec(go=1, x=2, w=None, transposed=False, mask=None, grads=(False, True), w_size=0), "convolution_backward_weight"))
# cudnn_convolution_transpose_backward_input(grad_output, weight, padding, stride, dilation, groups, ...)
_reg(["cudnn_convolution_transpose_backward_input", "miopen_convolution_transpose_backward_input"],
     _conv_bwd(_ConvBwdSpec(go=0, x=None, w=1, transposed=True, mask=None, grads=(True, False),
                            padding=2, stride=3, dilation=4), "convolution_transpose_backward_input"))
# cudnn_convolution_transpose_backward_weight(weight_size, grad_output, self, padding, stride, dilation, groups, ...)
_reg(["cudnn_convolution_transpose_backward_weight", "miopen_convolution_transpose_backward_weight"],
     _conv_bwd(_ConvBwdSpec(go=1, x=2, w=None, transposed=True, mask=None, grads=(False, True), w_size=0), "convolution_transpose_backward_weight"))

# attention (positions of is_causal / masks per op signature, torch 2.13)
# scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, *, scale, enable_gqa)
_reg("scaled_dot_product_attention",
     _attn(_AttnSpec("any", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3)), "scaled_dot_product_attention"),
     attention=True)
# _scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, *, scale, enable_gqa)
_reg(["_scaled_dot_product_attention_math", "_scaled_dot_product_attention_math_for_mps"],
     _attn(_AttnSpec("any", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3, 6), math=True),
           "_scaled_dot_product_attention_math"), attention=True)
# _scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
# FlashAttention-2 aligns a non-square causal mask bottom-right (SDPA never sends it one).
_reg("_scaled_dot_product_flash_attention",
     _attn(_AttnSpec("bhsd", 0, 1, 2, causal=4, align="bottom_right", reads=(0, 1, 2)),
           "_scaled_dot_product_flash_attention"), attention=True)
# _scaled_dot_product_flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q,
#     cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale)
_reg("_scaled_dot_product_flash_attention_backward",
     _attn(_AttnSpec("bhsd", 1, 2, 3, go=0, causal=11, align="bottom_right", reads=(0, 1, 2, 3, 4, 5)),
           "_scaled_dot_product_flash_attention_backward"), attention=True)
# _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
_reg("_scaled_dot_product_flash_attention_for_cpu",
     _attn(_AttnSpec("bhsd", 0, 1, 2, causal=4, masks=(5,), reads=(0, 1, 2, 5)),
           "_scaled_dot_product_flash_attention_for_cpu"), attention=True)
# _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
#     dropout_p, is_causal, *, attn_mask, scale)
_reg("_scaled_dot_product_flash_attention_for_cpu_backward",
     _attn(_AttnSpec("bhsd", 1, 2, 3, go=0, causal=7, masks=(8,), reads=(0, 1, 2, 3, 4, 5, 8)),
           "_scaled_dot_product_flash_attention_for_cpu_backward"), attention=True)
# _scaled_dot_product_efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale)
_reg("_scaled_dot_product_efficient_attention",
     _attn(_AttnSpec("bhsd", 0, 1, 2, causal=6, masks=(3,), reads=(0, 1, 2, 3)),
           "_scaled_dot_product_efficient_attention"), attention=True)
# _scaled_dot_product_efficient_attention_backward(grad_out_, query, key, value, attn_bias, out, logsumexp,
#     philox_seed, philox_offset, dropout_p, grad_input_mask, is_causal, *, scale)
_reg("_scaled_dot_product_efficient_attention_backward",
     _attn(_AttnSpec("bhsd", 1, 2, 3, go=0, causal=11, masks=(4,), reads=(0, 1, 2, 3, 4, 5, 6)),
           "_scaled_dot_product_efficient_attention_backward"), attention=True)
# _scaled_dot_product_cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p,
#     is_causal, return_debug_mask, *, scale)
_reg("_scaled_dot_product_cudnn_attention",
     _attn(_AttnSpec("bhsd", 0, 1, 2, causal=6, masks=(3,), reads=(0, 1, 2, 3)),
           "_scaled_dot_product_cudnn_attention"), attention=True)
# _scaled_dot_product_cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed,
#     philox_offset, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale)
_reg("_scaled_dot_product_cudnn_attention_backward",
     _attn(_AttnSpec("bhsd", 1, 2, 3, go=0, causal=14, masks=(8,), reads=(0, 1, 2, 3, 4, 5, 8)),
           "_scaled_dot_product_cudnn_attention_backward"), attention=True)
# _scaled_dot_product_fused_attention_overrideable(query, key, value, attn_bias, dropout_p, is_causal, ...)
_reg("_scaled_dot_product_fused_attention_overrideable",
     _attn(_AttnSpec("bhsd", 0, 1, 2, causal=5, masks=(3,), reads=(0, 1, 2, 3)),
           "_scaled_dot_product_fused_attention_overrideable"), attention=True)
# ..._backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
#     cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
_reg("_scaled_dot_product_fused_attention_overrideable_backward",
     _attn(_AttnSpec("bhsd", 1, 2, 3, go=0, causal=13, masks=(4,), reads=(0, 1, 2, 3, 4, 6, 7)),
           "_scaled_dot_product_fused_attention_overrideable_backward"), attention=True)
# _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
#     return_debug_mask, *, scale, window_size_left, window_size_right, seqused_k, alibi_slopes,
#     block_table, num_splits)   -- q/k/v are [B, S, H, D] (or packed [total, H, D])
_reg("_flash_attention_forward",
     _attn(_AttnSpec("bshd", 0, 1, 2, causal=8, align="bottom_right", window=(11, 12), paged=15,
                     reads=(0, 1, 2)), "_flash_attention_forward"), attention=True)
# _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
#     max_k, dropout_p, is_causal, rng_state, unused, *, scale, window_size_left, window_size_right)
_reg("_flash_attention_backward",
     _attn(_AttnSpec("bshd", 1, 2, 3, go=0, causal=11, align="bottom_right", window=(15, 16),
                     reads=(0, 1, 2, 3, 4, 5)), "_flash_attention_backward"), attention=True)
# _efficient_attention_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
#     max_seqlen_k, dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
# custom_mask_type: 0 none, 1 causal from top-left, 2 causal from bottom-right
_reg("_efficient_attention_forward",
     _attn(_AttnSpec("bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(13,), varlen=(4, 5),
                     reads=(0, 1, 2, 3)), "_efficient_attention_forward"), attention=True)
# _efficient_attention_backward(grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k,
#     max_seqlen_q, max_seqlen_k, logsumexp, dropout_p, philox_seed, philox_offset, custom_mask_type,
#     bias_requires_grad, *, scale, num_splits_key, window_size, shared_storage_dqdkdv)
_reg("_efficient_attention_backward",
     _attn(_AttnSpec("bshd", 1, 2, 3, go=0, mask_type=14, masks=(4,), window=(18,), varlen=(6, 7),
                     reads=(0, 1, 2, 3, 4, 5, 10)), "_efficient_attention_backward"), attention=True)


# --------------------------------------------------------------------------------------
# framework (non-aten) ops: aiter, vLLM, flash-attn, SageAttention, xformers
# --------------------------------------------------------------------------------------
# These projects register their kernels with torch.library, so the profiler records them under
# their namespace with their schema's arguments; each registration below names the schema it reads.
# Only leaf formulas count: a wrapper whose child op has a formula (aiter::gemm_a16w16 falling back
# to aten::linear) is counted through the child, one that launches its kernels itself through its own.


def _reg_ns(names, fn: _Formula, primary: int = 0, attention: bool = False) -> None:
    """Register a formula under fully qualified names ("aiter::mha_fwd"); a second one is refused."""
    for n in ([names] if isinstance(names, str) else names):
        if "::" not in n:
            raise ValueError(f"{n}: a framework op is registered with its namespace")
        if n in _REGISTRY:
            raise ValueError(f"{n} already has a FLOP formula")
        _REGISTRY[n] = _Entry(fn, primary, attention)


# ---- GEMMs ----


def _nk_gemm(ix: int, iw: int, reads: tuple[int, ...], out_dtype_idx: int | None = None,
             out_idx: int | None = None, default_out: str | None = None, padded_k: bool = False):
    """x [..., K] times a weight stored [N, K] (as F.linear): 2·M·N·K, M the product of x's leading dims.

    padded_k: a preshuffled weight may carry K padded up (aiter's bpreshuffle GEMMs); x's K is the work.
    """
    def f(a: _Args, out_dims) -> _R:
        x = a.shape(ix, "input", min_ndim=1)
        n, kw = a.shape(iw, "weight", (2,))
        k = x[-1]
        if kw != k and not (padded_k and kw > k):
            raise _Bad(f"gemm: input {list(x)} and weight [{n}, {kw}] (N x K) differ in K")
        if out_idx is not None and a.is_tensor(out_idx):
            ot = a.type(out_idx)
        else:
            ot = a.c_dtype(out_dtype_idx) or default_out or a.type(ix)
        return _R(2 * math.prod(x[:-1]) * n * k, reads=reads, outs=[(tuple(x[:-1]) + (n,), ot)])
    return f


def _out_first_mm(reads: tuple[int, ...]):
    """(out [M, N], a [M, K], b [K, N], ...): the output tensor is the first argument."""
    inner = _mm_like(1, 2, reads)

    def f(a: _Args, out_dims) -> _R:
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
_reg_ns("aiter::hipb_mm", _mm_like(0, 1, (0, 1, 3), out_dtype_idx=4))
# aiter (aiter/ops/gemm_op_a8w8.py), XQ [M, K] and WQ [N, K] in int8/fp8, output bf16 unless `dtype` says:
# gemm_a8w8(XQ, WQ, x_scale, w_scale, bias, dtype, splitK)
# gemm_a8w8_bpreshuffle(XQ, WQ, x_scale, w_scale, bias, dtype, check)  -- WQ's K may be padded up
# gemm_a8w8_blockscale(XQ, WQ, x_scale, w_scale, dtype, isBpreshuffled)
# gemm_a8w8_blockscale_bpreshuffle(XQ, WQ, x_scale, w_scale, dtype)
_reg_ns("aiter::gemm_a8w8", _nk_gemm(0, 1, (0, 1, 2, 3, 4), out_dtype_idx=5, default_out="c10::BFloat16"))
_reg_ns("aiter::gemm_a8w8_bpreshuffle",
        _nk_gemm(0, 1, (0, 1, 2, 3, 4), out_dtype_idx=5, default_out="c10::BFloat16", padded_k=True))
_reg_ns(["aiter::gemm_a8w8_blockscale", "aiter::gemm_a8w8_blockscale_bpreshuffle"],
        _nk_gemm(0, 1, (0, 1, 2, 3), out_dtype_idx=4, default_out="c10::BFloat16"))
# vLLM (vllm/model_executor/layers/utils.py, direct_register_custom_op):
# rocm_unquantized_gemm(x [..., K], weight [N, K], bias [N]): skinny wvSplitK/LLMM1 kernels or F.linear
_reg_ns("vllm::rocm_unquantized_gemm", _nk_gemm(0, 1, (0, 1, 2)))
# vLLM (csrc/torch_bindings.cpp): cutlass_scaled_mm(Tensor! out, Tensor a, Tensor b, Tensor a_scales,
#   Tensor b_scales, Tensor? bias); cutlass_scaled_mm_azp(out, a, b, a_scales, b_scales, azp_adj, azp, bias)
#   a [M, K], b [K, N] (column-major), out [M, N]; a's dtype is the compute dtype
_reg_ns("_C::cutlass_scaled_mm", _out_first_mm((1, 2, 3, 4, 5)), primary=1)
_reg_ns("_C::cutlass_scaled_mm_azp", _out_first_mm((1, 2, 3, 4, 5, 6, 7)), primary=1)


# ---- attention over packed (variable-length) batches ----


@dataclass(frozen=True)
class _Varlen:
    """Where a packed ([total, H, D]) attention op keeps its batch description."""
    cu_q: int                          # cu_seqlens_q, [B+1]
    max_q: int                         # max_seqlen_q
    max_k: int                         # max_seqlen_k
    paged: bool = False                # keys always in a paged cache (else: when k is 4-D or 5-D)
    padded_k: tuple[int, ...] = ()     # seqused_k / leftpad_k: keys not contiguous per sequence


def _uniform_lengths(a: _Args, vl: _Varlen, total_q: int, k0: int, paged: bool,
                     name: str) -> tuple[int, int, int] | str:
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
        raise _Bad(f"{name}: cu_seqlens_q of size {n1} describes no sequence")
    if mq is None or mk is None:
        return "per-sequence lengths are not recorded (nor max_seqlen: no Concrete Inputs)"
    if mq < 1 or mk < 1 or total_q != b * mq:
        return f"per-sequence lengths are not recorded ({total_q} queries in {b} sequences of at most {mq})"
    contiguous = not paged and not any(a.is_tensor(i) for i in vl.padded_k)
    if contiguous and k0 == b * mk:
        return b, mq, mk
    if mk == mq and not (contiguous and k0 < b * mk):
        return b, mq, mk
    return (f"per-sequence key lengths are not recorded ({b} sequences of {mq} queries, "
            f"at most {mk} keys)")


def _kv_geometry(a: _Args, ik: int, iv: int, name: str) -> tuple[int, int, int]:
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
        raise _Bad(f"{name}: key/value heads differ (k {list(k)}, v {list(v)})")
    return hk, dk, dv


def _varlen_attn(spec: _AttnSpec, vl: _Varlen, name: str):
    """An attention op taking packed [total, H, D] inputs (or dense [B, S, H, D] ones), counted on the
    dense view [B, S, H, D] when _uniform_lengths pins the lengths down. The view's keys and values are
    the ones really read (a paged cache's size is not), so its bytes are counted too."""
    dense = _attn(spec, name)

    def f(a: _Args, out_dims) -> _R:
        q = a.shape(spec.q, "query", (3, 4))
        if len(q) == 4:
            return dense(a, out_dims)
        k = a.shape(spec.k, "key", (3, 4, 5))
        got = _uniform_lengths(a, vl, q[0], k[0], vl.paged or len(k) > 3, name)
        if isinstance(got, str):
            return _unknown(f"{name}: variable-length batch: {got}", spec.reads, mask=_attn_mask_kind(a, spec))
        b, sq, sk = got
        hk, dk, dv = _kv_geometry(a, spec.k, spec.v, name)
        dims = list(a.dims)
        dims[spec.q] = [b, sq, q[1], q[2]]
        dims[spec.k] = [b, sk, hk, dk]
        dims[spec.v] = [b, sk, hk, dv]
        if spec.go is not None:
            go = a.shape(spec.go, "grad_out", (3,))
            if go != (q[0], q[1], dv):
                raise _Bad(f"{name}: grad_out {list(go)} does not match the output {[q[0], q[1], dv]}")
            dims[spec.go] = [b, sq, q[1], dv]
        view = a.with_dims(dims)
        r = dense(view, out_dims)
        r.args = view
        return r
    return f


# ---- aiter's CK flash attention ----


def _flag_then_window(a: _Args, start: int) -> int | None:
    """Index of is_causal in aiter's attention ops: the first bool followed by two ints (the window
    sizes) from `start` on. The scalars before it differ between aiter releases (min_seqlen_q,
    logits_soft_cap, zero_tensors come and go), that order does not."""
    n = len(a.concrete) if a.concrete is not None else 0
    for i in range(start, n - 2):
        if isinstance(a.raw(i), bool) and _is_int(a.raw(i + 1)) and _is_int(a.raw(i + 2)):
            return i
    return None


def _aiter_attn(q: int, k: int, v: int, scan: int, reads: tuple[int, ...], name: str,
                go: int | None = None, vl: _Varlen | None = None, padded_batch: bool = False):
    """aiter flash attention: [B, S, H, D] (or packed [total, H, D]) inputs, causal aligned bottom-right
    (aiter's Python side passes only that mask). A bias or ALiBi slopes change no matmul and are ignored.

    padded_batch: mha_fwd releases with sink_size (an int after the window) also take cu_seqlens_q/kv
    (4 and 5 places on), which describe a padded batch whose lengths are not recorded.
    """
    def f(a: _Args, out_dims) -> _R:
        ci = _flag_then_window(a, scan)
        window = (ci + 1, ci + 2) if ci is not None else ()
        spec = _AttnSpec("bshd", q, k, v, go=go, causal=ci, align="bottom_right", window=window, reads=reads)
        if (padded_batch and ci is not None and _is_int(a.raw(ci + 3))
                and (a.is_tensor(ci + 6) or a.is_tensor(ci + 7))):
            return _unknown(f"{name}: padded batch (cu_seqlens): per-sequence lengths are not recorded",
                            reads, mask=_attn_mask_kind(a, spec))
        fn = _varlen_attn(spec, vl, name) if vl is not None else _attn(spec, name)
        return fn(a, out_dims)
    return f


# aiter (ROCm/aiter aiter/ops/mha.py, csrc/include/torch/mha_fwd.h, mha_v3_fwd.h):
# mha_fwd(q, k, v, dropout_p, softmax_scale, is_causal, window_size_left, window_size_right, [sink_size,]
#         return_softmax_lse, return_dropout_randval, [cu_seqlens_q, cu_seqlens_kv,] out, bias, alibi_slopes, ...)
# fmha_v3_fwd(q, k, v, dropout_p, softmax_scale, is_causal, window_size_left, window_size_right,
#             return_softmax_lse, return_dropout_randval, how_v3_bf16_cvt, out, bias, alibi_slopes, gen)
#   q [b, sq, hq, d], k/v [b, sk, hk, d]
_reg_ns(["aiter::mha_fwd", "aiter::fmha_v3_fwd"],
        _aiter_attn(0, 1, 2, 3, (0, 1, 2), "aiter mha_fwd", padded_batch=True), attention=True)
# mha_bwd(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, is_causal, window_size_left,
#         window_size_right, deterministic, dq, dk, dv, ...); fmha_v3_bwd: the same with is_v3_atomic_fp32,
#         how_v3_bf16_cvt before dq (mha_bwd.h, mha_v3_bwd.h)
_reg_ns(["aiter::mha_bwd", "aiter::fmha_v3_bwd"],
        _aiter_attn(1, 2, 3, 6, (0, 1, 2, 3, 4, 5), "aiter mha_bwd", go=0), attention=True)
# mha_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, [min_seqlen_q,] dropout_p,
#     softmax_scale, [logits_soft_cap,] zero_tensors, is_causal, window_size_left, window_size_right, ...,
#     block_table, ...); fmha_v3_varlen_fwd: the same arguments up to the window (mha_varlen_fwd.h)
#   q [total_q, hq, d]; k/v [total_k, hk, d], or [blocks, block_size, hk, d] with a block_table
_reg_ns(["aiter::mha_varlen_fwd", "aiter::fmha_v3_varlen_fwd"],
        _aiter_attn(0, 1, 2, 7, (0, 1, 2), "aiter mha_varlen_fwd", vl=_Varlen(3, 5, 6)), attention=True)
# mha_varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
#     dropout_p, softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right, deterministic,
#     dq, dk, dv, ...); fmha_v3_varlen_bwd: the same with is_v3_atomic_fp32, how_v3_bf16_cvt before dq
_reg_ns(["aiter::mha_varlen_bwd", "aiter::fmha_v3_varlen_bwd"],
        _aiter_attn(1, 2, 3, 10, (0, 1, 2, 3, 4, 5), "aiter mha_varlen_bwd", go=0, vl=_Varlen(6, 8, 9)),
        attention=True)
# mha_batch_prefill(q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k, dropout_p,
#     softmax_scale, logits_soft_cap, zero_tensors, is_causal, window_size_left, window_size_right,
#     [sink_size,] return_softmax_lse, return_dropout_randval, out, ...) (mha_batch_prefill.h)
#   q [total_q, hq, d]; k/v a paged cache: [slots, hk, d] (page size 1) or the vectorised 5-D layout
_reg_ns("aiter::mha_batch_prefill",
        _aiter_attn(0, 1, 2, 8, (0, 1, 2), "aiter mha_batch_prefill", vl=_Varlen(3, 6, 7, paged=True)),
        attention=True)


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
    _reg_ns(f"{_ns}::_flash_attn_forward",
            _attn(_AttnSpec("bshd", 0, 1, 2, causal=5, align="bottom_right", window=(6, 7), reads=(0, 1, 2)),
                  "_flash_attn_forward"), attention=True)
    _reg_ns(f"{_ns}::_flash_attn_backward",
            _attn(_AttnSpec("bshd", 1, 2, 3, go=0, causal=11, align="bottom_right", window=(12, 13),
                            reads=(0, 1, 2, 3, 4, 5)), "_flash_attn_backward"), attention=True)
    _reg_ns(f"{_ns}::_flash_attn_varlen_forward",
            _varlen_attn(_AttnSpec("bshd", 0, 1, 2, causal=9, align="bottom_right", window=(10, 11),
                                   reads=(0, 1, 2)), _Varlen(3, 5, 6, padded_k=(16, 17)),
                         "_flash_attn_varlen_forward"), attention=True)
    _reg_ns(f"{_ns}::_flash_attn_varlen_backward",
            _varlen_attn(_AttnSpec("bshd", 1, 2, 3, go=0, causal=15, align="bottom_right", window=(16, 17),
                                   reads=(0, 1, 2, 3, 4, 5)), _Varlen(9, 11, 12), "_flash_attn_varlen_backward"),
            attention=True)


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
        if (n == 0) != (sq == 0) or not (n <= sq <= sqsq <= sqsk and sq <= sk
                                         and sqsq <= sq * sq and sqsk <= sq * sk):
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
    def f(a: _Args, out_dims) -> _R:
        t, hq, dqk = a.shape(0, "query", (3,))
        has_out = out is not None and a.is_tensor(out)
        if has_out:
            o = a.shape(out, "output", (3,))
            if o[:2] != (t, hq):
                raise _Bad(f"vLLM attention: output {list(o)} does not fit query [{t}, {hq}, {dqk}]")
            dv = o[2]
        else:
            dv = a.shape(2, "value", (3,))[2]
        hk = a.shape(1, "key", (3,))[1] if a.is_tensor(1) else None
        if hk is not None and (hk == 0 or hq % hk != 0):
            raise _Bad(f"vLLM attention: query heads {hq} not a multiple of key heads {hk}")
        stats = a.context.get("seq_stats") if a.context is not None else None
        if stats is None:
            return _unknown(_VLLM_NO_STATS, (0,))
        vals = [stats.get(x) for x in ("sq", "sk", "sqsq", "sqsk")] if isinstance(stats, dict) else []
        if len(vals) != 4 or not all(_is_int(x) and x >= 0 for x in vals):
            raise _Bad(f"vLLM attention: malformed seq_stats {stats!r}")
        sq, sk, sqsq, sqsk = vals
        if sq != t:
            return _unknown(f"vLLM attention: the step's annotation counts {sq} query tokens, the op {t}", (0,))
        kept = sqsk - (sqsq - sq) // 2
        if not sq <= sqsq <= sqsk:
            raise _Bad(f"vLLM attention: inconsistent seq_stats {stats!r}")
        per_pair = 2 * (dqk + dv)
        r = _R(hq * sqsk * per_pair, hq * kept * per_pair, mask="causal", reads=(0,),
               outs=[((t, hq, dv), a.type(out if has_out else 0))])
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


# ---- fused MoE ----

_MOE_NO_WEIGHTS = ("fused MoE: the expert weights are not arguments of the op, and none of the ops it ran showed "
                   "them with the top-k (re-profile with record_shapes=True)")
_PACKED = {"unsigned char", "c10::Float4_e2m1fn_x2"}  # MXFP4 experts: two 4-bit values per byte along K


def _expert_dims(w: Any, hidden: int, k_side: bool) -> tuple[int, int] | None:
    """(K, N) of one expert weight [E, a, b] given as [dims, type, strides]: the side equal to the hidden size is K of
    the up projection (k_side) or N of the down projection. A packed 4-bit weight doubles its contiguous side."""
    if not (isinstance(w, (list, tuple)) and len(w) == 3 and _valid_shape(w[0]) and len(w[0]) == 3):
        return None
    dims, typ, strides = list(w[0][1:]), w[1], w[2]
    if typ in _PACKED:
        inner = 1 if isinstance(strides, (list, tuple)) and len(strides) == 3 and strides[1] == 1 else 2
        dims[inner - 1] *= 2
    a, b = dims
    if k_side:
        return (a, b) if a == hidden else (b, a) if b == hidden else None
    return (a, b) if b == hidden else (b, a) if a == hidden else None


def _fused_moe(a: _Args, out_dims) -> _R:
    """A fused mixture of experts: each of T tokens runs its top-k experts, an up (gate and up) projection [H -> N1]
    and a down projection [K2 -> H]: 2·T·k·(H·N1 + K2·H). Only the hidden states [T, H] and the router logits [T, E]
    are arguments: context["moe"] = {"topk": k, "weights": [w13, w2]}, each [dims [E, ., .], type, strides], the
    expert weights and k seen in the ops the MoE ran. The down projection must take the up projection's output
    (K2 = N1, or N1/2 after a gated activation), so weights of another layer are never combined."""
    t, h = a.shape(0, "hidden_states", (2,))
    e = a.shape(1, "router_logits", (2,))[1]
    moe = a.context.get("moe") if a.context is not None else None
    if not isinstance(moe, dict):
        return _unknown(_MOE_NO_WEIGHTS, (0, 1))
    k, ws = moe.get("topk"), moe.get("weights")
    if not (_is_int(k) and 1 <= k <= e and isinstance(ws, (list, tuple)) and len(ws) == 2):
        raise _Bad(f"fused MoE: malformed evidence {moe!r}")
    if any(not (isinstance(w, (list, tuple)) and w and isinstance(w[0], (list, tuple)) and w[0][:1] == [e]) for w in ws):
        raise _Bad(f"fused MoE: expert weights {[w[0] for w in ws]} are not of the router's {e} experts")
    up, down = _expert_dims(ws[0], h, True), _expert_dims(ws[1], h, False)
    if up is None or down is None:
        raise _Bad(f"fused MoE: expert weights {[w[0] for w in ws]} do not fit the hidden size {h}")
    (_, n1), (k2, _) = up, down
    if k2 not in (n1, n1 // 2):
        raise _Bad(f"fused MoE: the down projection's K {k2} does not take the up projection's N {n1}")
    return _R(2 * t * k * (h * n1 + k2 * h), reads=(0, 1), outs=[((t, h), a.type(0))])


# vLLM (vllm/model_executor/layers/fused_moe/layer.py; direct_register_custom_op):
# moe_forward(hidden_states [T, H], router_logits [T, E], layer_name) -> Tensor;
# moe_forward_shared(hidden_states, router_logits, layer_name) -> (Tensor, Tensor)
_reg_ns(["vllm::moe_forward", "vllm::moe_forward_shared"], _fused_moe)
MOE_OPS: frozenset[str] = frozenset({"vllm::moe_forward", "vllm::moe_forward_shared"})


# ---- SageAttention 2 ----


def _sage(lay: int, name: str):
    """SageAttention: Q·Kᵀ in int8, P·V in fp16 or fp8. The value operand arrives quantised into a padded,
    transposed layout, so the count takes the key's geometry with the output's head dim. The kernels'
    causal alignment is not documented: with Sq != Sk a causal mask counts as 'unknown'."""
    def f(a: _Args, out_dims) -> _R:
        reads = (0, 1, 2, 4, 5)
        layout = {0: "bshd", 1: "bhsd"}.get(a.c_int(lay))
        if layout is None:
            return _unknown(f"{name}: tensor_layout not recorded", reads)
        q = a.shape(0, "query", (4,))
        k = a.shape(1, "key", (4,))
        o = a.shape(3, "output", (4,))
        s = 1 if layout == "bshd" else 2
        causal = lay + 1 if not (a.c_bool(lay + 1) and q[s] != k[s]) else None
        view = a.with_dims(list(a.dims) + [list(k[:-1]) + [o[-1]]])
        r = _attn(_AttnSpec(layout, 0, 1, len(a.dims), causal=causal, reads=reads), name)(view, None)
        r.outs = [(o, a.type(3))]
        return r
    return f


# thu-ml/SageAttention sageattention/sm80_compile.py, sm89_compile.py, sm90_compile.py (torch.library.custom_op):
# ...(query, key, value, output, query_scale, key_scale, [value_scale, [value_mean,]] tensor_layout, is_causal,
#     qk_quant_gran, sm_scale, return_lse); tensor_layout 0: [B, S, H, D], 1: [B, H, S, D]
for _n, _lay in (("sageattention::qk_int8_sv_f16_accum_f16_attn", 6),
                 ("sageattention::qk_int8_sv_f16_accum_f32_attn", 6),
                 ("sageattention::qk_int8_sv_f16_accum_f16_attn_inst_buf", 6),
                 ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", 7),
                 ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 7),
                 ("sageattention_sm89::qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf", 7),
                 ("sageattention_sm89::qk_int8_sv_f8_accum_f32_fuse_v_scale_fuse_v_mean_attn", 8),
                 ("sageattention_sm90::qk_int8_sv_f8_accum_f32_attn_inst_buf", 6),
                 ("sageattention_sm90::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 7)):
    _reg_ns(_n, _sage(_lay, _n.split("::")[1]), attention=True)


# ---- xformers ----


def _fold_groups(fn: _Formula, idxs: tuple[int, ...]) -> _Formula:
    """xformers' grouped-query inputs [B, M, G, H, K] counted as [B, M, G·H, K]."""
    def f(a: _Args, out_dims) -> _R:
        dims = list(a.dims)
        for i in idxs:
            d = dims[i] if 0 <= i < len(dims) else None
            if isinstance(d, (list, tuple)) and len(d) == 5 and _valid_shape(d):
                dims[i] = [d[0], d[1], d[2] * d[3], d[4]]
        if dims == list(a.dims):
            return fn(a, out_dims)
        view = a.with_dims(dims)
        r = fn(view, out_dims)
        r.args = view
        return r
    return f


def _newest_schema(fn: _Formula, min_args: int, name: str) -> _Formula:
    def f(a: _Args, out_dims) -> _R:
        if len(a.dims) < min_args:
            return _unknown(f"{name}: schema of an older xformers release (argument positions not confirmed)",
                            (0, 1, 2))
        return fn(a, out_dims)
    return f


# facebookresearch/xformers xformers/csrc/attention/attention.cpp, [B, M, H, K] (or [B, M, G, H, K]) inputs;
# custom_mask_type 0 none, 1 causal from the top left, 2 from the bottom right:
# efficient_attention_forward_cutlass(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
#     max_seqlen_k, dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
#     (the schema of aten::_efficient_attention_forward; older releases had 5- and 8-argument ones)
_reg_ns("xformers::efficient_attention_forward_cutlass", _newest_schema(_fold_groups(
    _attn(_AttnSpec("bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(13,), varlen=(4, 5, 12),
                    reads=(0, 1, 2, 3)), "xformers efficient_attention_forward_cutlass"), (0, 1, 2)),
    11, "xformers efficient_attention_forward_cutlass"), attention=True)
# efficient_attention_forward_ck(query, key, value, attn_bias, seqstart_q, seqstart_k, max_seqlen_q, dropout_p,
#     compute_logsumexp, custom_mask_type, scale, seqlen_k, window_size[, block_tables, page_size])
_reg_ns("xformers::efficient_attention_forward_ck", _fold_groups(
    _attn(_AttnSpec("bshd", 0, 1, 2, mask_type=9, masks=(3,), window=(12,), varlen=(4, 5, 11), paged=13,
                    reads=(0, 1, 2, 3)), "xformers efficient_attention_forward_ck"), (0, 1, 2)), attention=True)
# xformers/ops/fmha/flash.py (torch.library.custom_op; with PyTorch's flash kernels it calls
# aten::_flash_attention_forward/_backward, which are then the counted leaves); causal bottom-right:
# xformers_flash::flash_fwd(query, key, value, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
#     max_seqlen_k, p, softmax_scale, is_causal, window_left, window_right, return_softmax, block_tables)
# xformers_flash::flash_bwd(grads_share_storage, grad, query, key, value, out, lse, cu_seqlens_q,
#     cu_seqlens_k, max_seqlen_q, max_seqlen_k, p, softmax_scale, is_causal, window_left, window_right, rng_state)
#   [B, M, H, K], or packed [total, H, K] with cu_seqlens (a block-diagonal bias: variable lengths)
_reg_ns("xformers_flash::flash_fwd",
        _varlen_attn(_AttnSpec("bshd", 0, 1, 2, causal=10, align="bottom_right", window=(11, 12),
                               reads=(0, 1, 2)), _Varlen(3, 6, 7, padded_k=(5,)), "xformers flash_fwd"),
        attention=True)
_reg_ns("xformers_flash::flash_bwd",
        _varlen_attn(_AttnSpec("bshd", 2, 3, 4, go=1, causal=13, align="bottom_right", window=(14, 15),
                               reads=(1, 2, 3, 4, 5, 6)), _Varlen(7, 9, 10), "xformers flash_bwd"),
        primary=1, attention=True)


MATMUL_OPS: frozenset[str] = frozenset(_REGISTRY)

WRAPPER_OPS: frozenset[str] = frozenset("aten::" + n for n in (
    "matmul", "linear", "einsum",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "_convolution_mode", "convolution_overrideable",
    "thnn_conv2d", "slow_conv3d",
    "cudnn_convolution_backward", "cudnn_convolution_transpose_backward",
    "miopen_convolution_backward", "miopen_convolution_transpose_backward",
    "miopen_depthwise_convolution_backward",
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_attention_math_for_mps",
    # CUDA SDPA ops call the kernels _flash_attention_* / _efficient_attention_*
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
))
assert WRAPPER_OPS <= MATMUL_OPS


def _norm_name(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    n = name.strip()
    if "::" not in n:
        n = "aten::" + n
    return n


def op_flops(name: str, dims: list | None, types: list | None, concrete: list | None,
             out_dims: list[int] | None = None, *, context: dict | None = None) -> OpFlops | None:
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
    if out_dims is not None and not _valid_shape(out_dims):
        out_dims = None
    a = _Args(list(dims), types_ok, concrete, context)
    try:
        r = entry.fn(a, list(out_dims) if out_dims is not None else None)
    except _Bad as e:
        return OpFlops(None, None, 0, mask_default, None, dtype, str(e))
    except Exception as e:  # noqa: BLE001  malformed in a way the formula did not foresee: never raise
        return OpFlops(None, None, 0, mask_default, None, dtype, f"malformed inputs ({type(e).__name__}: {e})")
    try:
        nbytes = _bytes(r.args if r.args is not None else a, r, out_dims)
    except Exception:  # noqa: BLE001  bytes are best effort
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
        return OpFlops(None, None, 0, mask, nbytes, dtype, f"{OUT_OF_RANGE}: its shapes imply {float(r.flops):.3g} FLOPs")
    return OpFlops(int(r.flops), int(eff), int(r.recompute), mask, nbytes, dtype, None)


def _bytes(a: _Args, r: _R, out_dims) -> int | None:
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
