"""Tests for traceflops.flops.aten whose truth is torch itself.

Each op runs on small non-square CPU (or meta) tensors under torch.profiler with
record_shapes=True, the trace is exported as Kineto JSON and read back, and the recorded
Input Dims / Input type / Concrete Inputs of the event are fed to op_flops.  The result is
compared with torch.utils.flop_counter.FlopCounterMode over the same call.  Where
FlopCounterMode has no formula (CPU flash attention, grouped mm, causal effective FLOPs, ...) the
expected value is written out independently in the test, with its derivation.  The formulas'
hand-computed cases, which need no torch, are in test_aten_hand.py.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="the FLOP formulas' torch truth needs torch (pip install torch==2.13.0)")

import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, flop_registry  # noqa: E402

from traceflops.core.dtypes import dtype_of  # noqa: E402
from traceflops.flops.aten import (  # noqa: E402
    MATMUL_OPS,
    WRAPPER_OPS,
    OpFlops,
    op_flops,
    tensor_bytes,
)

aten = torch.ops.aten


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def record(fn) -> list[dict]:
    """Run fn under the profiler, export the Kineto JSON, return its cpu_op events in time order."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.remove(path)
    evs = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return evs


def fields(ev):
    a = ev["args"]
    return a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs")


def of(ev, **kw) -> OpFlops:
    r = op_flops(ev["name"], *fields(ev), **kw)
    assert r is not None, ev["name"]
    return r


def only(evs, name):
    got = [e for e in evs if e["name"] == name]
    assert len(got) == 1, (name, [e["name"] for e in evs])
    return got[0]


def fc(fn) -> int:
    with FlopCounterMode(display=False) as c:
        fn()
    return c.get_total_flops()


def innermost_total(evs) -> int:
    """What a caller counts: every event with a formula that has no formula event nested inside."""
    fe = [e for e in evs if e["name"] in MATMUL_OPS]
    total = 0
    for e in fe:
        lo, hi = e["ts"], e["ts"] + e.get("dur", 0)
        nested = any(
            f is not e and f.get("tid") == e.get("tid") and lo <= f["ts"] and f["ts"] + f.get("dur", 0) <= hi
            for f in fe
        )
        if not nested:
            r = of(e)
            assert r.flops is not None, (e["name"], r.reason)
            total += r.flops
    return total


def rnd(*s, dtype=torch.float32, grad=False):
    return torch.randn(*s, dtype=dtype, requires_grad=grad)


# --------------------------------------------------------------------------------------
# dtypes and bytes
# --------------------------------------------------------------------------------------


def test_type_table_matches_profiler():
    # the profiler's own spelling of every dtype, and tensor_bytes == nbytes
    dts = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
           torch.float8_e4m3fn, torch.float8_e5m2]
    ts = [torch.zeros(3, 5, dtype=d) for d in dts]
    evs = [e for e in record(lambda: [aten.alias(t) for t in ts]) if e["name"] == "aten::alias"]
    assert len(evs) == len(ts)
    for t, e in zip(ts, evs):
        dims, types, _ = fields(e)
        assert dtype_of(types[0]) is not None, types[0]
        assert tensor_bytes(dims[0], types[0]) == t.nbytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mm_bytes(dtype):
    a, b = rnd(3, 5, dtype=dtype), rnd(5, 7, dtype=dtype)
    evs = record(lambda: torch.mm(a, b))
    r = of(only(evs, "aten::mm"))
    assert r.bytes == a.nbytes + b.nbytes + (a @ b).nbytes
    assert r.bytes == (15 + 35 + 21) * dtype.itemsize
    assert r.dtype == {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


# --------------------------------------------------------------------------------------
# matmul family
# --------------------------------------------------------------------------------------

MM_CASES = {
    "mm": ("aten::mm", lambda: torch.mm(rnd(3, 5), rnd(5, 7))),
    "addmm": ("aten::addmm", lambda: torch.addmm(rnd(7), rnd(3, 5), rnd(5, 7), beta=0.5, alpha=2.0)),
    "bmm": ("aten::bmm", lambda: torch.bmm(rnd(2, 3, 5), rnd(2, 5, 7))),
    "baddbmm": ("aten::baddbmm", lambda: torch.baddbmm(rnd(2, 3, 7), rnd(2, 3, 5), rnd(2, 5, 7), beta=0.5)),
}


@pytest.mark.parametrize("case", MM_CASES)
def test_mm_family(case):
    name, fn = MM_CASES[case]
    torch.manual_seed(0)
    evs = record(fn)
    r = of(only(evs, name))
    assert r.flops == fc(fn) > 0
    assert r.effective == r.flops and r.recompute == 0 and r.mask is None and r.reason is None
    assert innermost_total(evs) == r.flops


@pytest.mark.parametrize(
    "sa,sb,equiv",
    [
        # (M,K)@(K,) runs as mv, which FlopCounterMode does not count: truth is the same product as mm
        ((3, 5), (5,), lambda a, b: torch.mm(a, b[:, None])),
        # (K,)@(K,) runs as dot (uncounted by FlopCounterMode): truth (1,K)@(K,1)
        ((5,), (5,), lambda a, b: torch.mm(a[None], b[:, None])),
        ((2, 1, 3, 5), (4, 5, 7), None),   # batch broadcast (2,1) x (4,) -> (2,4)
        ((7, 3, 5), (5, 9), None),         # N-D @ 2-D
        ((5,), (4, 5, 7), None),           # 1-D @ N-D
    ],
)
def test_matmul(sa, sb, equiv):
    a, b = rnd(*sa), rnd(*sb)
    evs = record(lambda: torch.matmul(a, b))
    r = of(only(evs, "aten::matmul"))
    truth = fc(lambda: equiv(a, b)) if equiv else fc(lambda: torch.matmul(a, b))
    assert r.flops == truth > 0
    assert r.bytes == a.nbytes + b.nbytes + torch.matmul(a, b).nbytes
    if equiv is None:
        assert innermost_total(evs) == truth


def test_linear_3d():
    x, w, b = rnd(2, 3, 5), rnd(7, 5), rnd(7)
    fn = lambda: F.linear(x, w, b)  # noqa: E731
    evs = record(fn)
    r = of(only(evs, "aten::linear"))
    assert r.flops == fc(fn) == 2 * 6 * 5 * 7
    assert "aten::linear" in WRAPPER_OPS
    assert innermost_total(evs) == r.flops  # the addmm child
    assert r.bytes == x.nbytes + w.nbytes + b.nbytes + fn().nbytes


def test_einsum():
    x, y = rnd(2, 3, 5), rnd(2, 5, 7)
    fn = lambda: torch.einsum("bij,bjk->bik", x, y)  # noqa: E731
    evs = record(fn)
    ev = only(evs, "aten::einsum")
    r = of(ev)
    # the profiler records neither the equation string nor its type
    assert r.flops is None and "equation" in r.reason
    assert innermost_total(evs) == fc(fn)  # its bmm child is counted instead
    dims, types, conc = fields(ev)
    conc = list(conc)
    conc[0] = "bij,bjk->bik"
    assert op_flops("aten::einsum", dims, types, conc).flops == fc(fn)
    conc[0] = "bij,bjk"  # implicit output
    assert op_flops("aten::einsum", dims, types, conc).flops == fc(fn)


# --------------------------------------------------------------------------------------
# fp8 scaled mm and grouped mm
# --------------------------------------------------------------------------------------


def test_scaled_mm_fp8_cpu():
    a = rnd(16, 32).to(torch.float8_e4m3fn)
    b = rnd(48, 32).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    fn = lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)  # noqa: E731
    evs = record(fn)
    r = of(only(evs, "aten::_scaled_mm"))
    assert r.flops == fc(fn) == 2 * 16 * 32 * 48
    assert r.dtype == "fp8"
    # fp8 operands 1 byte, two fp32 0-d scales, bf16 output (out_dtype recorded as ScalarType 15)
    assert r.bytes == 16 * 32 + 32 * 48 + 4 + 4 + 16 * 48 * 2
    # on CPU _scaled_mm dequantizes and calls an fp32 mm child: the innermost count is unchanged
    assert innermost_total(evs) == r.flops


def _gmm_truth(a, b, offs):
    """FlopCounterMode over the explicit per-group products (offsets cover the whole split dim)."""
    def loop():
        if a.dim() == 3 and b.dim() == 3:
            torch.bmm(a, b)
            return
        start = 0
        for g, end in enumerate(offs.tolist()):
            if a.dim() == 2 and b.dim() == 3:
                torch.mm(a[start:end], b[g])
            elif a.dim() == 3 and b.dim() == 2:
                torch.mm(a[g], b[:, start:end])
            else:
                torch.mm(a[:, start:end], b[start:end])
            start = end
    return fc(loop)


bf = torch.bfloat16


@pytest.mark.parametrize(
    "layout",
    ["2d3d", "3d2d", "2d2d", "3d3d"],
)
def test_grouped_mm(layout):
    # _grouped_mm needs 16-byte aligned strides: K, N multiples of 8 for bf16; M may be odd
    torch.manual_seed(0)
    G, K, N = 3, 16, 24
    i32 = torch.int32
    if layout == "2d3d":
        a, b, offs = rnd(11, K, dtype=bf), rnd(G, N, K, dtype=bf).transpose(-2, -1), torch.tensor([2, 6, 11], dtype=i32)
    elif layout == "3d2d":
        a, b, offs = rnd(G, 5, K, dtype=bf), rnd(40, K, dtype=bf).t(), torch.tensor([8, 24, 40], dtype=i32)
    elif layout == "2d2d":
        a, b, offs = rnd(5, 40, dtype=bf), rnd(N, 40, dtype=bf).t(), torch.tensor([8, 24, 40], dtype=i32)
    else:
        a, b, offs = rnd(G, 5, K, dtype=bf), rnd(G, N, K, dtype=bf).transpose(-2, -1), None
    out = torch._grouped_mm(a, b, offs)
    evs = record(lambda: torch._grouped_mm(a, b, offs))
    assert fc(lambda: torch._grouped_mm(a, b, offs)) == 0  # FlopCounterMode has no formula
    ev = only(evs, "aten::_grouped_mm")
    r = of(ev)
    assert r.flops == _gmm_truth(a, b, offs) > 0
    assert r.dtype == "bf16"
    assert r.bytes == a.nbytes + b.nbytes + (offs.nbytes if offs is not None else 0) + out.nbytes
    # the CPU fallback runs one mm (or a bmm) per group: those children add up to the same
    kids = [e for e in evs if e["name"] in ("aten::mm", "aten::bmm")]
    assert sum(of(e).flops for e in kids) == r.flops
    if offs is not None:
        # offsets not recorded at all (older trace / different arg list): still countable from shapes
        dims, types, conc = fields(ev)
        r2 = op_flops("aten::_grouped_mm", dims[:2], types[:2], conc[:2])
        assert r2.flops == r.flops


def test_grouped_mm_partial_offsets_is_upper_bound():
    # offsets ending before M: the kernel leaves the tail rows unwritten; offsets' values are
    # never in the trace, so the count from shapes is an upper bound of the per-group children
    a, b = rnd(11, 16, dtype=bf), rnd(3, 24, 16, dtype=bf).transpose(-2, -1)
    offs = torch.tensor([2, 6, 9], dtype=torch.int32)
    evs = record(lambda: torch._grouped_mm(a, b, offs))
    r = of(only(evs, "aten::_grouped_mm"))
    kids = sum(of(e).flops for e in evs if e["name"] == "aten::mm")
    assert kids == 2 * 9 * 16 * 24 < r.flops == 2 * 11 * 16 * 24


def test_scaled_grouped_mm_meta():
    # CUDA-only op; recorded here on meta tensors.  Hand formula for 2D x 3D:
    # out[offs[g-1]:offs[g]] = a[rows] @ b[g]  ->  sum_g 2 * rows_g * K * N = 2 * M_total * K * N
    m = lambda *s, dt=torch.float8_e4m3fn: torch.empty(*s, device="meta", dtype=dt)  # noqa: E731
    fn = lambda: torch._scaled_grouped_mm(  # noqa: E731
        m(16, 32), m(3, 48, 32).transpose(-2, -1), torch.empty(16, device="meta"),
        torch.empty(3, 48, device="meta"), offs=torch.empty(3, dtype=torch.int32, device="meta"),
        out_dtype=torch.bfloat16)
    evs = record(fn)
    r = of(only(evs, "aten::_scaled_grouped_mm"))
    assert r.flops == 2 * 16 * 32 * 48
    assert r.dtype == "fp8"
    assert r.bytes == 16 * 32 + 3 * 32 * 48 + 16 * 4 + 3 * 48 * 4 + 3 * 4 + 16 * 48 * 2


# --------------------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------------------

CONV_NAMES = {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_transpose1d",
              "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::convolution",
              "aten::_convolution", "aten::mkldnn_convolution", "aten::_slow_conv2d_forward",
              "aten::slow_conv_dilated2d", "aten::slow_conv_transpose2d", "aten::thnn_conv2d"}

CONV_CASES = {
    "conv1d": (lambda x, w: F.conv1d(x, w, None, stride=2, padding=1, dilation=2), (2, 3, 13), (5, 3, 3)),
    "conv2d": (lambda x, w: F.conv2d(x, w, torch.ones(6), stride=2, padding=(1, 2), dilation=(2, 1), groups=3),
               (2, 6, 11, 9), (6, 2, 3, 2)),
    "conv2d_unbatched": (lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=1), (3, 9, 11), (4, 3, 3, 3)),
    "conv3d": (lambda x, w: F.conv3d(x, w, stride=2, padding=1, groups=2), (1, 4, 7, 5, 9), (6, 2, 3, 3, 2)),
    "conv_transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1),
                         (2, 4, 7), (4, 3, 3)),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1,
                                                         groups=2, dilation=2), (2, 4, 5, 6), (4, 3, 3, 2)),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward(case):
    f, xs, ws = CONV_CASES[case]
    x, w = rnd(*xs), rnd(*ws)
    y = f(x, w)
    evs = record(lambda: f(x, w))
    truth = fc(lambda: f(x, w))
    conv_evs = [e for e in evs if e["name"] in MATMUL_OPS]
    assert {e["name"] for e in conv_evs} <= CONV_NAMES and len(conv_evs) >= 2
    for e in conv_evs:  # the wrapper and every level below it
        r = of(e)
        assert r.flops == truth > 0, (e["name"], r)
        assert r.effective == r.flops and r.dtype == "fp32"
        bias = 6 * 4 if case == "conv2d" else 0
        # bytes from the computed output shape (checks stride/padding/dilation/output_padding use)
        assert r.bytes == x.nbytes + w.nbytes + bias + y.nbytes, e["name"]
    assert innermost_total(evs) == truth


def test_conv_missing_concrete_inputs():
    x, w = rnd(2, 3, 9, 11), rnd(4, 3, 3, 3)
    fn = lambda: F.conv2d(x, w, stride=2, padding=1)  # noqa: E731
    y = fn()
    truth = fc(fn)
    evs = record(fn)
    for e in evs:
        if e["name"] not in MATMUL_OPS:
            continue
        dims, types, conc = fields(e)
        for missing in (None, []):
            r = op_flops(e["name"], dims, types, missing)
            assert r.flops is None and "stride" in r.reason, (e["name"], r)
            r = op_flops(e["name"], dims, types, missing, out_dims=list(y.shape))
            assert r.flops == truth, (e["name"], r)
        # with Concrete Inputs, stride 2 is taken from them (stride 1 would give 4x more)
        assert op_flops(e["name"], dims, types, conc).flops == truth


def test_conv_transpose_missing_concrete_inputs():
    # generic aten::convolution without Concrete Inputs: transposed is inferred from the channels
    x, w = rnd(2, 4, 5, 6), rnd(4, 3, 3, 3)
    fn = lambda: F.conv_transpose2d(x, w, stride=2, padding=1)  # noqa: E731
    y = fn()
    ev = only(record(fn), "aten::convolution")
    dims, types, _ = fields(ev)
    assert op_flops(ev["name"], dims, types, None).flops is None
    assert op_flops(ev["name"], dims, types, None, out_dims=list(y.shape)).flops == fc(fn)


def _conv_bwd_case(x, w, f):
    y = f(x, w)
    g = torch.randn_like(y)
    evs = record(lambda: y.backward(g, retain_graph=True))
    truth = fc(lambda: y.backward(g, retain_graph=True))
    return only(evs, "aten::convolution_backward"), truth, evs


@pytest.mark.parametrize(
    "xg,wg,mask",
    [(True, True, [True, True]), (False, True, [False, True]), (True, False, [True, False])],
)
def test_conv_backward(xg, wg, mask):
    x, w = rnd(2, 3, 9, 11, grad=xg), rnd(4, 3, 3, 3, grad=wg)
    ev, truth, evs = _conv_bwd_case(x, w, lambda x, w: F.conv2d(x, w, stride=2, padding=1, dilation=2))
    assert fields(ev)[2][10].startswith(str(mask)[:-1])  # output_mask as recorded
    r = of(ev)
    assert r.flops == truth > 0 and r.effective == truth
    out = (x.nbytes if xg else 0) + (w.nbytes if wg else 0)
    go_bytes = 2 * 4 * 4 * 5 * 4
    assert r.bytes == go_bytes + x.nbytes + w.nbytes + out
    assert innermost_total(evs) == truth
    dims, types, _ = fields(ev)
    r = op_flops(ev["name"], dims, types, None)
    assert r.flops is None and "output_mask" in r.reason


def test_conv_transpose_backward():
    x, w = rnd(2, 4, 5, 6, grad=True), rnd(4, 3, 3, 2, grad=True)
    ev, truth, _ = _conv_bwd_case(x, w, lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1))
    assert of(ev).flops == truth > 0


def test_grouped_conv_backward():
    # grad_input = conv_transpose(grad_out, w) and grad_weight = conv(x, grad_out) each do the
    # forward's multiply-adds.  FlopCounterMode's grad_weight formula uses the full C_in*C_out
    # product, i.e. `groups` times that; traceflops counts the real work.
    g = 3
    f = lambda x, w: F.conv2d(x, w, stride=2, groups=g)  # noqa: E731
    x, w = rnd(2, 6, 9, 11, grad=True), rnd(9, 2, 3, 3, grad=True)
    fwd = fc(lambda: f(x, w))
    ev, fc_full, _ = _conv_bwd_case(x, w, f)
    assert fc_full == fwd + g * fwd           # FlopCounterMode: grad_input + groups * grad_weight
    assert of(ev).flops == 2 * fwd
    # grad_input only: identical to FlopCounterMode
    ev_in, fc_in, _ = _conv_bwd_case(x, w.detach(), f)
    assert of(ev_in).flops == fc_in == fwd


def test_old_cudnn_backward_names():
    # 2021-era traces: aten::cudnn_convolution_backward -> _backward_input / _backward_weight, with
    # `self`/`grad_output` order and size arguments different from convolution_backward.
    # Truth: FlopCounterMode over the CPU convolution_backward of the same convolution.
    x, w = rnd(2, 3, 9, 11, grad=True), rnd(4, 3, 3, 3, grad=True)
    f = lambda x, w: F.conv2d(x, w, stride=2, padding=1)  # noqa: E731
    _, t_in, _ = _conv_bwd_case(x, w.detach(), f)
    _, t_w, _ = _conv_bwd_case(x.detach(), w, f)
    go = [2, 4, 5, 6]
    tail_t = ["ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"]
    tail_c = ["[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]
    # cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride, dilation, groups, ...)
    dims = [[], go, [4, 3, 3, 3]] + [[]] * 7
    types = ["ScalarList", "float", "float"] + tail_t
    r = op_flops("aten::cudnn_convolution_backward_input", dims, types, ["[2, 3, 9, 11]", "", ""] + tail_c)
    assert r.flops == t_in
    assert op_flops("aten::cudnn_convolution_backward_input", dims, types, None).flops == t_in
    # cudnn_convolution_backward_weight(weight_size, grad_output, self, padding, stride, ...)
    dims = [[], go, [2, 3, 9, 11]] + [[]] * 7
    r = op_flops("aten::cudnn_convolution_backward_weight", dims, types, ["[4, 3, 3, 3]", "", ""] + tail_c)
    assert r.flops == t_w
    r = op_flops("aten::cudnn_convolution_backward_weight", dims, types, None)
    assert r.flops is None and "weight size" in r.reason
    assert op_flops("aten::cudnn_convolution_backward_weight", dims, types, None, out_dims=[4, 3, 3, 3]).flops == t_w
    # cudnn_convolution_backward(self, grad_output, weight, padding, stride, dilation, groups, benchmark,
    #                            deterministic, allow_tf32, output_mask)
    dims = [[2, 3, 9, 11], go, [4, 3, 3, 3]] + [[]] * 8
    types = ["float", "float", "float"] + tail_t + ["ScalarList"]
    r = op_flops("aten::cudnn_convolution_backward", dims, types, ["", "", ""] + tail_c + ["[True, True]"])
    assert r.flops == t_in + t_w
    assert "aten::cudnn_convolution_backward" in WRAPPER_OPS


def test_cudnn_convolution_argument_order():
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, ...) has padding BEFORE
    # stride and no bias; the pre-1.8 overload had a bias at index 2.  Truth: FlopCounterMode.
    x, w = rnd(2, 3, 9, 11), rnd(4, 3, 3, 3)
    truth = fc(lambda: F.conv2d(x, w, stride=2, padding=1))
    dims = [[2, 3, 9, 11], [4, 3, 3, 3]] + [[]] * 7
    types = ["float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"]
    conc = ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]
    assert op_flops("aten::cudnn_convolution", dims, types, conc).flops == truth
    types_old = ["float", "float", ""] + types[2:8]
    conc_old = ["", "", ""] + conc[2:8]
    assert op_flops("aten::cudnn_convolution", dims, types_old, conc_old).flops == truth


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------


def tril_count(sq, sk, diagonal=0) -> int:
    return int(torch.ones(sq, sk).tril(diagonal).sum())


ATTN_CASES = {
    "full": (2, 3, 3, 6, 10, 8, False),
    "causal": (2, 3, 3, 6, 10, 8, True),
    "causal_sq_gt_sk": (1, 2, 2, 10, 6, 8, True),
    "gqa": (2, 4, 2, 6, 10, 8, False),
    "gqa_causal": (1, 6, 2, 7, 7, 16, True),
}


@pytest.mark.parametrize("case", ATTN_CASES)
def test_sdpa_cpu_flash(case):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, Hk, Sq, Sk, D, causal = ATTN_CASES[case]
    torch.manual_seed(0)
    q, k, v = rnd(B, H, Sq, D, grad=True), rnd(B, Hk, Sk, D, grad=True), rnd(B, Hk, Sk, D, grad=True)
    gqa = H != Hk

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa).sum().backward()

    evs = record(run)
    fwd = of(only(evs, "aten::_scaled_dot_product_flash_attention_for_cpu"))
    bwd = of(only(evs, "aten::_scaled_dot_product_flash_attention_for_cpu_backward"))
    wrap = of(only(evs, "aten::scaled_dot_product_attention"))

    # truth 1: FlopCounterMode over the math backend (bmm's; GQA repeats k/v to H heads).
    def math_fwd():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def math_all():
        math_fwd().sum().backward()

    t_fwd = fc(math_fwd)
    # the math backward is 4 bmm's (dP, dV, dQ, dK); the fused kernel also recomputes
    # S = Q K^T: 2 * B * H * Sq * Sk * D more.
    recompute = 2 * B * H * Sq * Sk * D
    t_bwd = fc(math_all) - t_fwd + recompute
    # truth 2: FlopCounterMode's own formulas for the CUDA SDPA kernels, on the same shapes
    assert t_fwd == flop_registry[aten._scaled_dot_product_flash_attention](q.shape, k.shape, v.shape, out_val=None)
    assert t_bwd == flop_registry[aten._scaled_dot_product_flash_attention_backward](
        q.shape, q.shape, k.shape, v.shape, out_val=None)

    assert fwd.flops == wrap.flops == t_fwd
    assert bwd.flops == t_bwd and bwd.recompute == recompute and fwd.recompute == 0
    assert fwd.mask == bwd.mask == wrap.mask == ("causal" if causal else "full")
    if causal:
        # torch's causal mask is tril(ones(Sq, Sk)) (top-left): count the kept entries directly
        kept = tril_count(Sq, Sk)
        assert fwd.effective * Sq * Sk == fwd.flops * kept
        assert wrap.effective == fwd.effective
        assert bwd.effective * Sq * Sk == bwd.flops * kept
    else:
        assert fwd.effective == fwd.flops and bwd.effective == bwd.flops
    assert innermost_total(evs) == t_fwd + t_bwd
    # bytes: q, k, v read, out written (fp32)
    assert fwd.bytes == q.nbytes + k.nbytes + v.nbytes + B * H * Sq * D * 4
    assert fwd.dtype == "fp32"


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_math_path(causal):
    # head dims Dqk != Dv keep CPU SDPA on the math path: a wrapper over matmul/bmm children that
    # computes the full score matrix even when causal (so effective == flops there)
    q, k, v = rnd(2, 4, 6, 8), rnd(2, 2, 10, 8), rnd(2, 2, 10, 12)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # noqa: E731
    evs = record(fn)
    truth = fc(fn)
    r = of(only(evs, "aten::_scaled_dot_product_attention_math"))
    assert r.flops == truth == 2 * 2 * 4 * 6 * 10 * (8 + 12)
    assert r.mask == ("causal" if causal else "full") and r.effective == r.flops
    w = of(only(evs, "aten::scaled_dot_product_attention"))
    assert w.flops == truth
    if causal:  # backend unknown at the API level: assumes a kernel that skips the masked part
        assert w.effective * 6 * 10 == w.flops * tril_count(6, 10)
    assert innermost_total(evs) == truth  # the bmm children


def test_cpu_flash_causal_is_top_left():
    # the CPU flash kernel's causal mask is the top-left tril mask, also for Sq != Sk
    q, k, v = rnd(1, 2, 6, 8), rnd(1, 2, 10, 8), rnd(1, 2, 10, 8)
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(6, 10, dtype=torch.bool).tril())
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_sdpa_explicit_mask(mask_dtype):
    q, k, v = rnd(2, 3, 6, 8, grad=True), rnd(2, 3, 10, 8, grad=True), rnd(2, 3, 10, 8, grad=True)
    m = torch.rand(6, 10) > 0.3 if mask_dtype == torch.bool else rnd(6, 10)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum().backward()  # noqa: E731
    evs = record(fn)
    names = ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    for n in names:
        r = of(only(evs, n))
        assert r.mask == "unknown" and r.flops > 0 and r.effective == r.flops, n
    assert of(only(evs, names[1])).flops == 2 * 2 * 3 * 6 * 10 * (8 + 8)


def test_sdpa_without_concrete_inputs():
    q, k, v = rnd(2, 3, 6, 8), rnd(2, 3, 10, 8), rnd(2, 3, 10, 8)
    ev = only(record(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
              "aten::_scaled_dot_product_flash_attention_for_cpu")
    dims, types, _ = fields(ev)
    r = op_flops(ev["name"], dims, types, None)
    assert r.mask == "unknown" and r.flops == r.effective == 2 * 2 * 3 * 6 * 10 * 16


def _meta(*s, dt=torch.float16):
    return torch.empty(*s, device="meta", dtype=dt)


def test_cuda_sdpa_ops_on_meta():
    # CUDA-only SDPA ops, recorded on meta tensors; FlopCounterMode runs on meta too.
    B, H, Sq, Sk, D = 2, 4, 6, 10, 8
    q, k, v, o = _meta(B, H, Sq, D), _meta(B, H, Sk, D), _meta(B, H, Sk, D), _meta(B, H, Sq, D)
    lse, seed = _meta(B, H, Sq, dt=torch.float32), _meta(2, dt=torch.uint64)
    i32 = _meta(0, dt=torch.int32)
    calls = {
        "aten::_scaled_dot_product_flash_attention":
            lambda c: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, c),
        "aten::_scaled_dot_product_flash_attention_backward":
            lambda c: aten._scaled_dot_product_flash_attention_backward(o, q, k, v, o, lse, i32, i32, Sq, Sk, 0.0, c,
                                                                        seed, seed),
        "aten::_scaled_dot_product_efficient_attention":
            lambda c: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, c),
        "aten::_scaled_dot_product_efficient_attention_backward":
            lambda c: aten._scaled_dot_product_efficient_attention_backward(o, q, k, v, None, o, lse, seed, seed, 0.0,
                                                                            [True, True, True, False], c),
        "aten::_scaled_dot_product_cudnn_attention":
            lambda c: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, c),
        "aten::_scaled_dot_product_cudnn_attention_backward":
            lambda c: aten._scaled_dot_product_cudnn_attention_backward(o, q, k, v, o, lse, seed, seed, None, None,
                                                                        None, Sq, Sk, 0.0, c),
    }
    for name, call in calls.items():
        for causal in (False, True):
            evs = record(lambda: call(causal))
            r = of(only(evs, name))
            assert r.flops == fc(lambda: call(causal)) > 0, name
            assert r.mask == ("causal" if causal else "full"), name
            assert r.dtype == "fp16"
            bwd = name.endswith("_backward")
            assert r.recompute == (2 * B * H * Sq * Sk * D if bwd else 0)
            if causal and "flash" in name:
                # FlashAttention-2 aligns a non-square causal mask to the bottom right
                # (torch.nn.attention.bias.causal_lower_right == tril(diagonal=Sk-Sq))
                kept = tril_count(Sq, Sk, Sk - Sq)
            elif causal:
                kept = tril_count(Sq, Sk)
            else:
                kept = Sq * Sk
            assert r.effective * Sq * Sk == r.flops * kept, name


def test_flash_and_efficient_kernels_on_meta():
    # _flash_attention_* / _efficient_attention_* take [B, S, H, D]; FlopCounterMode's formulas read
    # them as [B, H, S, D] (wrong / assertion for dense inputs), so the truth here is FlopCounterMode
    # over the SDPA-level op on the transposed [B, H, S, D] shapes.
    B, H, Hk, Sq, Sk, D = 2, 4, 2, 6, 10, 8
    qt, kt, vt, ot = _meta(B, Sq, H, D), _meta(B, Sk, Hk, D), _meta(B, Sk, Hk, D), _meta(B, Sq, H, D)
    lse, seed = _meta(B, H, Sq, dt=torch.float32), _meta(2, dt=torch.uint64)
    q, k, v = qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2)
    t_fwd = fc(lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False))
    t_bwd = fc(lambda: aten._scaled_dot_product_flash_attention_backward(
        q, q, k, v, q, lse, None, None, Sq, Sk, 0.0, False, seed, seed))

    ev = only(record(lambda: aten._flash_attention_forward(qt, kt, vt, None, None, Sq, Sk, 0.0, True, False)),
              "aten::_flash_attention_forward")
    r = of(ev)
    assert r.flops == t_fwd and r.mask == "causal"
    assert r.effective * Sq * Sk == r.flops * tril_count(Sq, Sk, Sk - Sq)
    ev = only(record(lambda: aten._flash_attention_backward(ot, qt, kt, vt, ot, lse, None, None, Sq, Sk, 0.0, False,
                                                            seed, seed)), "aten::_flash_attention_backward")
    r = of(ev)
    assert r.flops == t_bwd and r.mask == "full" and r.recompute == 2 * B * H * Sq * Sk * D
    # sliding window -> mask unknown
    ev = only(record(lambda: aten._flash_attention_forward(qt, kt, vt, None, None, Sq, Sk, 0.0, False, False,
                                                           window_size_left=3, window_size_right=0)),
              "aten::_flash_attention_forward")
    assert of(ev).mask == "unknown" and of(ev).flops == t_fwd

    # efficient kernel (no GQA): custom_mask_type 0 / 1 (top-left causal) / 2 (bottom-right causal)
    kt, vt = _meta(B, Sk, H, D), _meta(B, Sk, H, D)
    k, v = kt.transpose(1, 2), vt.transpose(1, 2)
    t_fwd = fc(lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False))
    t_bwd = fc(lambda: aten._scaled_dot_product_flash_attention_backward(
        q, q, k, v, q, lse, None, None, Sq, Sk, 0.0, False, seed, seed))
    kept = {0: Sq * Sk, 1: tril_count(Sq, Sk), 2: tril_count(Sq, Sk, Sk - Sq)}
    for mt in (0, 1, 2):
        ev = only(record(lambda: aten._efficient_attention_forward(qt, kt, vt, None, None, None, Sq, Sk, 0.0, mt,
                                                                   True)), "aten::_efficient_attention_forward")
        r = of(ev)
        assert r.flops == t_fwd and r.mask == ("full" if mt == 0 else "causal")
        assert r.effective * Sq * Sk == r.flops * kept[mt]
        ev = only(record(lambda: aten._efficient_attention_backward(ot, qt, kt, vt, None, ot, None, None, Sq, Sk, lse,
                                                                    0.0, seed, seed, mt, False)),
                  "aten::_efficient_attention_backward")
        r = of(ev)
        assert r.flops == t_bwd and r.effective * Sq * Sk == r.flops * kept[mt]
