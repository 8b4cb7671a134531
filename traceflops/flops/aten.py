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
from dataclasses import dataclass
from typing import Any, Callable

from traceflops.core.dtypes import dtype_of, itemsize

__all__ = [
    "MATMUL_OPS",
    "OP_FLOPS_MAX",
    "OUT_OF_RANGE",
    "WRAPPER_OPS",
    "OpFlops",
    "op_flops",
    "tensor_bytes",
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
    def __init__(self, dims: list, types: list | None, concrete: list | None):
        self.dims = dims
        self.types = types if isinstance(types, (list, tuple)) else None
        self.concrete = concrete if isinstance(concrete, (list, tuple)) else None

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
             out_dims: list[int] | None = None) -> OpFlops | None:
    """FLOPs of one profiler cpu_op event; None when `name` has no formula (not matmul-class).

    dims / types / concrete are the event's 'Input Dims', 'Input type' and 'Concrete Inputs'.
    out_dims, when known from elsewhere (e.g. the consumer of the result), is the output shape:
    it stands in for convolution stride/padding when Concrete Inputs are missing.
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
    a = _Args(list(dims), types_ok, concrete)
    try:
        r = entry.fn(a, list(out_dims) if out_dims is not None else None)
    except _Bad as e:
        return OpFlops(None, None, 0, mask_default, None, dtype, str(e))
    except Exception as e:  # malformed in a way the formula did not foresee: never raise
        return OpFlops(None, None, 0, mask_default, None, dtype, f"malformed inputs ({type(e).__name__}: {e})")
    try:
        nbytes = _bytes(a, r, out_dims)
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
    for shape, t in outs:
        b = tensor_bytes(list(shape), t)
        if b is None:
            return None
        total += b
    return total
