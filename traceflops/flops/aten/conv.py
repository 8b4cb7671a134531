"""FLOP formulas of PyTorch's convolution ops, forward and backward, with their many argument orders.

Each formula is registered beside it in TABLE, which registry merges. convolution_backward's grad_weight is
counted as the real work (FlopCounterMode counts `groups` times too much there for grouped convolutions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceflops.flops.aten.shapes import Args, Bad, R, unknown, valid_shape
from traceflops.flops.aten.table import FormulaTable

TABLE = FormulaTable()  # this module's registrations, merged by registry
_reg = TABLE.aten


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
    dilation: int | None = None  # None: the op has no dilation argument (dilation 1)
    transposed: bool | int = False  # bool, or the index of the `transposed` argument
    output_padding: int | None = None
    groups: int | None = None  # None: the op has no groups argument (groups 1)
    unbatched_ok: bool = False  # conv1d/2d/3d accept an input without batch dim
    depthwise: bool = False  # groups == in_channels


def _spatial_param(a: Args, idx: int | None, nsp: int, name: str, default: int | None) -> list[int] | None:
    """A stride/padding/... list broadcast to nsp dims; None when not recorded."""
    if idx is None:
        return [default] * nsp if default is not None else None
    v = a.c_ints(idx)
    if v is None:
        return None
    if len(v) == 1:
        v = v * nsp
    if len(v) != nsp:
        raise Bad(f"convolution: {name} {v} does not fit {nsp} spatial dims")
    return v


def _conv_out_spatial(sp, k, stride, padding, dilation) -> tuple[int, ...]:
    out = []
    for i, kk, s, p, d in zip(sp, k, stride, padding, dilation):
        if s < 1 or d < 1 or p < 0:
            raise Bad(f"convolution: invalid stride/padding/dilation {stride}/{padding}/{dilation}")
        o = (i + 2 * p - d * (kk - 1) - 1) // s + 1
        if o < 1:
            raise Bad("convolution: kernel larger than the padded input")
        out.append(o)
    return tuple(out)


def _convt_out_spatial(sp, k, stride, padding, dilation, output_padding) -> tuple[int, ...]:
    return tuple(
        (i - 1) * s - 2 * p + d * (kk - 1) + op + 1
        for i, kk, s, p, d, op in zip(sp, k, stride, padding, dilation, output_padding)
    )


def _conv_flops(n: int, conv_sp, w) -> int:
    # FlopCounterMode: prod(conv spatial) * prod(kernel) * N * w[0] * w[1] * 2, where conv
    # spatial is the output for a normal conv and the input for a transposed one.
    return 2 * n * math.prod(conv_sp) * math.prod(w[2:]) * w[0] * w[1]


def _conv_fwd(spec: _ConvSpec, name: str):
    def f(a: Args, out_dims) -> R:
        w = a.shape(spec.w, "weight", min_ndim=3)
        nsp = len(w) - 2
        x = a.shape(spec.x, "input", min_ndim=1)
        if len(x) == len(w):
            n, c, sp = x[0], x[1], x[2:]
        elif len(x) == len(w) - 1 and spec.unbatched_ok:
            n, c, sp = 1, x[0], x[1:]
        else:
            raise Bad(f"{name}: input {list(x)} does not fit weight {list(w)}")
        reads = (spec.x, spec.w) + ((spec.bias,) if spec.bias is not None else ())
        transposed = spec.transposed if isinstance(spec.transposed, bool) else a.c_bool(spec.transposed)
        if spec.depthwise:
            groups: int | None = c
        elif spec.groups is None:
            groups = 1
        else:
            groups = a.c_int(spec.groups)
        if groups is not None and groups < 1:
            raise Bad(f"{name}: groups {groups}")
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
            if not valid_shape(out_dims) or len(out_dims) != len(x):
                raise Bad(f"{name}: out_dims {out_dims} does not fit input {list(x)}")
            od = tuple(out_dims[-nsp:])
        have_geom = stride is not None and padding is not None and dilation is not None
        if transposed is None:
            if od is None:
                return unknown(f"{name}: transposed flag and stride unknown (no Concrete Inputs); pass out_dims", reads)
            # infer from channels: normal conv -> out C == w[0]; transposed -> in C == w[0]
            oc = out_dims[1] if len(x) == len(w) else out_dims[0]
            normal_ok = oc == w[0] and w[1] > 0 and c % w[1] == 0
            trans_ok = c == w[0] and w[1] > 0 and oc % w[1] == 0
            if normal_ok and trans_ok and math.prod(od) != math.prod(sp):
                return unknown(f"{name}: transposed flag unknown (no Concrete Inputs) and ambiguous from shapes", reads)
            if not (normal_ok or trans_ok):
                raise Bad(
                    f"{name}: channels of input {list(x)}, weight {list(w)}, "
                    f"output {list(out_dims)} do not fit a convolution"
                )
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
            return unknown(f"convolution {what} unknown (not in Concrete Inputs); pass out_dims", reads)
        return _conv_result(a, spec, n, w, sp, out_sp, False, groups, reads, out_dims, x)

    return f


def _conv_result(a: Args, spec: _ConvSpec, n, w, sp, out_sp, transposed, groups, reads, out_dims, x) -> R:
    c = x[1] if len(x) == len(w) else x[0]
    if transposed:
        if c != w[0]:
            raise Bad(f"transposed convolution: input channels {c} != weight.shape[0] {w[0]}")
    elif groups is not None and c != w[1] * groups:
        raise Bad(f"convolution: input channels {c} != weight.shape[1] {w[1]} * groups {groups}")
    flops = _conv_flops(n, sp if transposed else out_sp, w)
    oc = (w[1] * groups if groups is not None else None) if transposed else w[0]
    outs = None
    if out_sp is not None and oc is not None:
        lead = (n, oc) if len(x) == len(w) else (oc,)
        outs = [(lead + tuple(out_sp), a.type(spec.x))]
    return R(flops, reads=reads, outs=outs)


def _conv_fwd_cudnn(transpose: bool, name: str):
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32)
    # cudnn_convolution.deprecated(self, weight, bias, padding, stride, dilation, groups, ...)  (torch <= 1.7)
    # cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, groups, ...)
    # (and the same with a bias at index 2 in old torch)
    def f(a: Args, out_dims) -> R:
        t2 = a.type(2)
        # modern: an int list at index 2; deprecated: a (possibly undefined) bias tensor there
        shift = 0 if (t2 is None or t2 == "ScalarList" or a.c_ints(2) is not None) else 1
        bias = 2 if shift else None
        if transpose:
            spec = _ConvSpec(
                bias=bias,
                padding=2 + shift,
                output_padding=3 + shift,
                stride=4 + shift,
                dilation=5 + shift,
                groups=6 + shift,
                transposed=True,
            )
        else:
            spec = _ConvSpec(bias=bias, padding=2 + shift, stride=3 + shift, dilation=4 + shift, groups=5 + shift)
        return _conv_fwd(spec, name)(a, out_dims)

    return f


# ---- convolution backward ----


@dataclass(frozen=True)
class _ConvBwdSpec:
    go: int
    x: int | None  # None: input tensor not an argument (backward_input ops)
    w: int | None  # None: weight shape from Concrete Inputs[w_size] (backward_weight ops)
    transposed: bool | int
    mask: int | None  # index of output_mask (-1: last argument); None: implied by `grads`
    grads: tuple[bool, bool] = (True, True)  # (grad_input, grad_weight) when mask is None
    w_size: int | None = None
    x_size: int | None = None
    stride: int | None = None  # only needed by ops that must rebuild the input size
    padding: int | None = None
    dilation: int | None = None


def _conv_bwd(spec: _ConvBwdSpec, name: str):
    """grad_input = conv_transpose(grad_out, w) and grad_weight = conv(x, grad_out): each is the
    same number of multiply-adds as the forward conv, 2·N·prod(conv spatial)·prod(k)·w0·w1 with conv
    spatial = grad_out's (normal conv) or input's (transposed conv).

    FlopCounterMode counts grad_weight as 2·N·C_in·C_out·prod(k)·prod(spatial), which is `groups`
    times the real work for grouped convolutions; here the real work is counted (equal for groups=1).
    """

    def f(a: Args, out_dims) -> R:
        go = a.shape(spec.go, "grad_output", min_ndim=3)
        x = a.shape(spec.x, "input", (len(go),)) if spec.x is not None else None
        if spec.w is not None:
            w = a.shape(spec.w, "weight", (len(go),))
        else:
            ws = a.c_ints(spec.w_size)
            if ws is None and out_dims is not None and valid_shape(out_dims):
                ws = list(out_dims)
            if ws is None:
                return unknown(f"{name}: weight size unknown (no Concrete Inputs); pass out_dims", (spec.go, spec.x))
            if len(ws) != len(go) or not valid_shape(ws):
                raise Bad(f"{name}: weight size {ws} does not fit grad_output {list(go)}")
            w = tuple(ws)
        reads = tuple(i for i in (spec.go, spec.x, spec.w) if i is not None)
        transposed = spec.transposed if isinstance(spec.transposed, bool) else a.c_bool(spec.transposed)
        if spec.mask is not None:
            mask_idx = spec.mask if spec.mask >= 0 else len(a) - 1
            mask = a.c_bools(mask_idx)
            if mask is None or len(mask) < 2:
                return unknown(f"{name}: output_mask unknown (no Concrete Inputs)", reads)
        else:
            mask = list(spec.grads)
        if transposed is None:
            return unknown(f"{name}: transposed flag unknown (no Concrete Inputs)", reads)
        n = go[0]
        if x is not None and x[0] != n:
            raise Bad(f"{name}: batch of input {list(x)} != grad_output {list(go)}")
        # channel checks: normal conv: go C == w0 ; transposed: x C == w0
        if not transposed and go[1] != w[0]:
            raise Bad(f"{name}: grad_output channels {go[1]} != weight.shape[0] {w[0]}")
        if transposed and x is not None and x[1] != w[0]:
            raise Bad(f"{name}: input channels {x[1]} != weight.shape[0] {w[0]}")
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
                elif out_dims is not None and valid_shape(out_dims) and len(out_dims) == len(go):
                    sp = tuple(out_dims[2:])
                elif stride is not None and padding is not None and dilation is not None:
                    sp = _conv_out_spatial(go[2:], w[2:], stride, padding, dilation)
                else:
                    return unknown(f"{name}: input size unknown (no Concrete Inputs); pass out_dims", reads)
        else:
            sp = go[2:]
        base = _conv_flops(n, sp, w)
        flops = base * (int(bool(mask[0])) + int(bool(mask[1])))
        outs: list[tuple[tuple[int, ...], str | None]] | None
        outs = []
        if mask[0]:
            xshape = x
            if xshape is None:
                xs = a.c_ints(spec.x_size)
                if xs is not None and len(xs) == len(go):
                    xshape = tuple(xs)
                elif out_dims is not None and valid_shape(out_dims) and len(out_dims) == len(go):
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
        r = R(flops, reads=reads, outs=outs)
        r.single_out = False
        return r

    return f


# ---- registrations ----

# convolution forward (argument positions differ between ops: padding comes before stride in
# the cudnn/miopen/mkldnn kernels, after it in the dispatcher-level ops)
_CONV = _ConvSpec(stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8)
_reg(["convolution", "_convolution", "convolution_overrideable"], _conv_fwd(_CONV, "convolution"))
for _n in ("conv1d", "conv2d", "conv3d"):
    _reg(_n, _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6, unbatched_ok=True), _n))
for _n in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
    _reg(
        _n,
        _conv_fwd(
            _ConvSpec(stride=3, padding=4, output_padding=5, groups=6, dilation=7, transposed=True, unbatched_ok=True),
            _n,
        ),
    )
_reg("_convolution_mode", _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6), "_convolution_mode"))
_reg("cudnn_convolution", _conv_fwd_cudnn(False, "cudnn_convolution"))
_reg("cudnn_convolution_transpose", _conv_fwd_cudnn(True, "cudnn_convolution_transpose"))
_reg(
    ["cudnn_convolution_relu", "miopen_convolution_relu"],
    _conv_fwd(_ConvSpec(stride=3, padding=4, dilation=5, groups=6), "convolution_relu"),
)
_reg(
    ["cudnn_convolution_add_relu", "miopen_convolution_add_relu"],
    _conv_fwd(_ConvSpec(bias=4, stride=5, padding=6, dilation=7, groups=8), "convolution_add_relu"),
)
_reg(
    ["miopen_convolution", "miopen_depthwise_convolution", "mkldnn_convolution"],
    _conv_fwd(_ConvSpec(padding=3, stride=4, dilation=5, groups=6), "convolution"),
)
_reg(
    "miopen_convolution_transpose",
    _conv_fwd(
        _ConvSpec(padding=3, output_padding=4, stride=5, dilation=6, groups=7, transposed=True),
        "miopen_convolution_transpose",
    ),
)
# (self, weight, kernel_size, bias, stride, padding[, dilation])
_reg(
    ["_slow_conv2d_forward", "thnn_conv2d", "thnn_conv2d_forward", "slow_conv3d_forward", "slow_conv3d", "thnn_conv3d"],
    _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5), "slow_conv"),
)
_reg(
    ["slow_conv_dilated2d", "slow_conv_dilated3d"],
    _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5, dilation=6), "slow_conv_dilated"),
)
_reg(
    ["_conv_depthwise2d", "conv_depthwise3d", "thnn_conv_depthwise2d", "thnn_conv_depthwise2d_forward"],
    _conv_fwd(_ConvSpec(bias=3, stride=4, padding=5, dilation=6, depthwise=True), "conv_depthwise"),
)
_reg(
    ["slow_conv_transpose2d", "slow_conv_transpose3d"],
    _conv_fwd(
        _ConvSpec(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True), "slow_conv_transpose"
    ),
)
_reg("_nnpack_spatial_convolution", _conv_fwd(_ConvSpec(padding=3, stride=4), "_nnpack_spatial_convolution"))

# convolution backward
# convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
#                      output_padding, groups, output_mask)
_reg("convolution_backward", _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=7, mask=10), "convolution_backward"))
# convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
#                                   output_padding, groups, output_mask)
_reg(
    "convolution_backward_overrideable",
    _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=6, mask=9), "convolution_backward_overrideable"),
)
# 2021-era kernels: note `self` (the input) comes BEFORE grad_output here
# cudnn_convolution_backward(self, grad_output, weight, padding, stride, dilation, groups, benchmark,
#                            deterministic[, allow_tf32], output_mask)
_reg(
    ["cudnn_convolution_backward", "miopen_convolution_backward", "miopen_depthwise_convolution_backward"],
    _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=False, mask=-1), "cudnn_convolution_backward"),
)
_reg(
    ["cudnn_convolution_transpose_backward", "miopen_convolution_transpose_backward"],
    _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=True, mask=-1), "cudnn_convolution_transpose_backward"),
)
# mkldnn_convolution_backward(self, grad_output, weight, padding, stride, dilation, groups, output_mask)
_reg(
    "mkldnn_convolution_backward",
    _conv_bwd(_ConvBwdSpec(go=1, x=0, w=2, transposed=False, mask=-1), "mkldnn_convolution_backward"),
)
# _slow_conv2d_backward(grad_output, self, weight, kernel_size, stride, padding, output_mask) and the
# older thnn_conv2d_backward / slow_conv3d_backward(..., finput, fgrad_input, output_mask)
_reg(
    ["_slow_conv2d_backward", "thnn_conv2d_backward", "slow_conv3d_backward"],
    _conv_bwd(_ConvBwdSpec(go=0, x=1, w=2, transposed=False, mask=-1), "slow_conv_backward"),
)
# cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride, dilation, groups, ...)
_reg(
    [
        "cudnn_convolution_backward_input",
        "miopen_convolution_backward_input",
        "miopen_depthwise_convolution_backward_input",
    ],
    _conv_bwd(
        _ConvBwdSpec(go=1, x=None, w=2, transposed=False, mask=None, grads=(True, False), x_size=0),
        "convolution_backward_input",
    ),
)
# cudnn_convolution_backward_weight(weight_size, grad_output, self, padding, stride, dilation, groups, ...)
_reg(
    [
        "cudnn_convolution_backward_weight",
        "miopen_convolution_backward_weight",
        "miopen_depthwise_convolution_backward_weight",
    ],
    _conv_bwd(
        _ConvBwdSpec(go=1, x=2, w=None, transposed=False, mask=None, grads=(False, True), w_size=0),
        "convolution_backward_weight",
    ),
)
# cudnn_convolution_transpose_backward_input(grad_output, weight, padding, stride, dilation, groups, ...)
_reg(
    ["cudnn_convolution_transpose_backward_input", "miopen_convolution_transpose_backward_input"],
    _conv_bwd(
        _ConvBwdSpec(
            go=0, x=None, w=1, transposed=True, mask=None, grads=(True, False), padding=2, stride=3, dilation=4
        ),
        "convolution_transpose_backward_input",
    ),
)
# cudnn_convolution_transpose_backward_weight(weight_size, grad_output, self, padding, stride, dilation, groups, ...)
_reg(
    ["cudnn_convolution_transpose_backward_weight", "miopen_convolution_transpose_backward_weight"],
    _conv_bwd(
        _ConvBwdSpec(go=1, x=2, w=None, transposed=True, mask=None, grads=(False, True), w_size=0),
        "convolution_transpose_backward_weight",
    ),
)
