"""FLOP formulas of PyTorch's matmul ops: mm, bmm, addmm, matmul, linear, einsum, scaled and grouped (MoE) mm.

Each formula is registered beside it in TABLE, which registry merges; 2·M·N·K per matmul as FlopCounterMode
counts, except packed fp4 operands of the scaled matmuls, whose contraction length is twice the recorded size.
"""

from __future__ import annotations

import math

from traceflops.flops.aten.shapes import (
    Args,
    Bad,
    R,
    fp4_mult,
    output_type,
    unknown,
    valid_shape,
)
from traceflops.flops.aten.table import FormulaTable

TABLE = FormulaTable()  # this module's registrations, merged by registry
_reg = TABLE.aten


# --------------------------------------------------------------------------------------
# matmul family
# --------------------------------------------------------------------------------------


def _mm_mnk(a_shape, b_shape, what: str) -> tuple[int, int, int]:
    m, k = a_shape
    k2, n = b_shape
    if k != k2:
        raise Bad(f"{what}: inner dimensions differ ({list(a_shape)} @ {list(b_shape)})")
    return m, n, k


def mm_like(
    ia: int,
    ib: int,
    reads: tuple[int, ...],
    out_dtype_idx: int | None = None,
    kmult: bool = False,
    out_type: str | None = None,
):
    def f(a: Args, out_dims) -> R:
        sa = a.shape(ia, "mat1", (2,))
        sb = a.shape(ib, "mat2", (2,))
        m, n, k = _mm_mnk(sa, sb, "mm")
        k *= fp4_mult(a, ia) if kmult else 1
        flops = 2 * m * n * k
        ot = out_type or output_type(a, ia, out_dtype_idx)
        return R(flops, reads=reads, outs=[((m, n), ot)])

    return f


def _f_mm(a: Args, out_dims) -> R:
    # mm(self, mat2) ; mm.out(self, mat2, out) ; mm.dtype(self, mat2, out_dtype)
    dt_idx = 2 if a.type(2) == "Scalar" else None
    r = mm_like(0, 1, (0, 1), dt_idx)(a, out_dims)
    if a.is_tensor(2):  # the out= tensor decides the output dtype
        r.outs = [(r.outs[0][0], a.type(2))]
    return r


def _bmm_like(ia: int, ib: int, reads: tuple[int, ...]):
    def f(a: Args, out_dims) -> R:
        sa = a.shape(ia, "batch1", (3,))
        sb = a.shape(ib, "batch2", (3,))
        if sa[0] != sb[0]:
            raise Bad(f"bmm: batch sizes differ ({list(sa)} @ {list(sb)})")
        m, n, k = _mm_mnk(sa[1:], sb[1:], "bmm")
        dt_idx = ib + 1 if a.type(ib + 1) == "Scalar" and ia == 0 else None
        return R(2 * sa[0] * m * n * k, reads=reads, outs=[((sa[0], m, n), output_type(a, ia, dt_idx))])

    return f


def broadcast(s1: tuple[int, ...], s2: tuple[int, ...], what: str) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(s1), len(s2)) + 1):
        x = s1[-i] if i <= len(s1) else 1
        y = s2[-i] if i <= len(s2) else 1
        if x != y and x != 1 and y != 1:
            raise Bad(f"{what}: batch dims do not broadcast ({list(s1)} vs {list(s2)})")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def _matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """torch.matmul semantics -> (flops, output shape)."""
    if len(sa) == 0 or len(sb) == 0:
        raise Bad("matmul: 0-D operand")
    if len(sa) == 1 and len(sb) == 1:
        if sa[0] != sb[0]:
            raise Bad(f"matmul: sizes differ ({list(sa)} @ {list(sb)})")
        return 2 * sa[0], ()
    if len(sb) == 1:  # (..., M, K) @ (K,)
        if sa[-1] != sb[0]:
            raise Bad(f"matmul: inner dimensions differ ({list(sa)} @ {list(sb)})")
        return 2 * math.prod(sa[:-1]) * sa[-1], tuple(sa[:-1])
    if len(sa) == 1:  # (K,) @ (..., K, N)
        if sa[0] != sb[-2]:
            raise Bad(f"matmul: inner dimensions differ ({list(sa)} @ {list(sb)})")
        return 2 * math.prod(sb[:-2]) * sb[-2] * sb[-1], tuple(sb[:-2]) + (sb[-1],)
    batch = broadcast(sa[:-2], sb[:-2], "matmul")
    m, n, k = _mm_mnk(sa[-2:], sb[-2:], "matmul")
    return 2 * math.prod(batch) * m * n * k, batch + (m, n)


def _f_matmul(a: Args, out_dims) -> R:
    sa = a.shape(0, "self", min_ndim=1)
    sb = a.shape(1, "other", min_ndim=1)
    flops, out = _matmul_shapes(sa, sb)
    return R(flops, reads=(0, 1), outs=[(out, a.type(0))])


def _f_linear(a: Args, out_dims) -> R:
    # linear(input, weight, bias=None): input (..., in), weight (out, in) or (in,)
    x = a.shape(0, "input", min_ndim=1)
    w = a.shape(1, "weight", (1, 2))
    if x[-1] != w[-1]:
        raise Bad(f"linear: in_features differ (input {list(x)}, weight {list(w)})")
    n_out = w[0] if len(w) == 2 else 1
    out = tuple(x[:-1]) + ((w[0],) if len(w) == 2 else ())
    return R(2 * math.prod(x[:-1]) * x[-1] * n_out, reads=(0, 1, 2), outs=[(out, a.type(0))])


def _f_einsum(a: Args, out_dims) -> R:
    # einsum(str equation, Tensor[] tensors, *, int[]? path): the profiler does not record the
    # equation string, so this normally cannot be counted; the leaf bmm/mm children are.
    eq = a.raw(0)
    if not isinstance(eq, str) or not eq:
        return unknown("einsum equation not recorded (count its bmm/mm children)")
    ops = a.dims[1] if len(a.dims) > 1 else None
    if not isinstance(ops, (list, tuple)) or not all(valid_shape(s) for s in ops):
        raise Bad("einsum: operand shapes not recorded")
    eq = eq.replace(" ", "")
    if "..." in eq:
        return unknown("einsum with ellipsis not supported")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise Bad("einsum: operand count does not match the equation")
    if not all(len(t) == len(s) for t, s in zip(terms, ops)):
        raise Bad("einsum: operand rank does not match the equation")
    if "->" not in eq:
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    size: dict[str, int] = {}
    for t, s in zip(terms, ops):
        for c, n in zip(t, s):
            if size.setdefault(c, n) != n and n != 1 and size[c] != 1:
                raise Bad(f"einsum: size of '{c}' differs between operands")
            size[c] = max(size[c], n)
    out = tuple(size[c] for c in rhs)
    if len(ops) == 1:
        return R(0, reads=(1,), outs=None)
    if len(ops) > 2:
        return unknown("einsum with more than 2 operands: contraction order not recorded")
    a_set, b_set, o_set = set(terms[0]), set(terms[1]), set(rhs)
    # torch sums away indices that occur in one operand only before the pairwise product
    keep = {c for c in a_set | b_set if c in o_set or (c in a_set and c in b_set)}
    contracted = (a_set & b_set) - o_set
    flops = 2 * math.prod(size[c] for c in keep) if contracted else 0
    return R(flops, reads=(), outs=[(out, None)])


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

    def f(a: Args, out_dims) -> R:
        sa = a.shape(0, "mat_a", (2, 3))
        sb = a.shape(1, "mat_b", (2, 3))
        g_offs = None
        if a.is_tensor(offs_idx):
            so = a.shape(offs_idx, "offs", (1,))
            g_offs = so[0]
        mult = fp4_mult(a, 0) if scaled else 1
        ot = output_type(a, 0, dtype_idx)
        if scaled and a.c_dtype(dtype_idx) is None:
            ot = "c10::BFloat16"  # scaled grouped mm defaults to bf16 output
        if len(sa) == 2 and len(sb) == 3:
            (m, k), (g, k2, n) = sa, sb
            if k != k2:
                raise Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            if g_offs is not None and g_offs != g:
                raise Bad(f"grouped mm: {g_offs} offsets for {g} groups")
            return R(2 * m * k * mult * n, reads=reads, outs=[((m, n), ot)])
        if len(sa) == 3 and len(sb) == 2:
            (g, m, k), (k2, n) = sa, sb
            if k != k2:
                raise Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            if g_offs is not None and g_offs != g:
                raise Bad(f"grouped mm: {g_offs} offsets for {g} groups")
            return R(2 * m * k * mult * n, reads=reads, outs=[((m, n), ot)])
        if len(sa) == 2 and len(sb) == 2:
            (m, k), (k2, n) = sa, sb
            if k != k2:
                raise Bad(f"grouped mm: K differs ({list(sa)} x {list(sb)})")
            outs: list[tuple[tuple[int, ...], str | None]] | None = (
                [((g_offs, m, n), ot)] if g_offs is not None else None
            )
            return R(2 * m * k * mult * n, reads=reads, outs=outs)
        (g, m, k), (g2, k2, n) = sa, sb
        if g != g2 or k != k2:
            raise Bad(f"grouped mm: shapes do not match ({list(sa)} x {list(sb)})")
        return R(2 * g * m * k * mult * n, reads=reads, outs=[((g, m, n), ot)])

    return f


# ---- registrations ----

# matmul
_reg("mm", _f_mm)
_reg("_int_mm", mm_like(0, 1, (0, 1), out_type="int"))
_reg(["addmm", "_addmm_activation"], mm_like(1, 2, (0, 1, 2), out_dtype_idx=None), primary=1)
_reg("bmm", _bmm_like(0, 1, (0, 1)))
_reg("baddbmm", _bmm_like(1, 2, (0, 1, 2)), primary=1)
_reg("matmul", _f_matmul)
_reg("linear", _f_linear)
_reg("einsum", _f_einsum, primary=1)
# _scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
_reg("_scaled_mm", mm_like(0, 1, (0, 1, 2, 3, 4, 5), out_dtype_idx=6, kmult=True))
# _scaled_mm_v2(self, mat2, scale_a[], recipe_a, swizzle_a, scale_b[], recipe_b, swizzle_b, bias, out_dtype, ...)
_reg("_scaled_mm_v2", mm_like(0, 1, (0, 1, 8), out_dtype_idx=9, kmult=True))
# _grouped_mm(self, mat2, offs, bias, out_dtype)
_reg("_grouped_mm", _grouped(2, 4, (0, 1, 2, 3), scaled=False))
# _scaled_grouped_mm(self, mat2, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
_reg("_scaled_grouped_mm", _grouped(4, 7, (0, 1, 2, 3, 4, 5), scaled=True))
# _scaled_grouped_mm_v2(self, mat2, scale_a[], recipe_a, swizzle_a, scale_b[], recipe_b, swizzle_b, offs, bias,
# out_dtype, ...)
_reg("_scaled_grouped_mm_v2", _grouped(8, 10, (0, 1, 8, 9), scaled=True))
