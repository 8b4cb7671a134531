"""traceflops.flops.aten (and the trace type names of core.dtypes) against values written out by hand.

No torch here, directly or through a helper: these run where torch is not installed.
The formulas' torch truth (FlopCounterMode over profiled ops) is test_aten_torch.py.
"""

from __future__ import annotations

import random

import pytest

from traceflops.core.dtypes import dtype_of
from traceflops.flops.aten import (
    MATMUL_OPS,
    WRAPPER_OPS,
    OpFlops,
    op_flops,
    tensor_bytes,
)


def test_dtype_of_strings():
    assert dtype_of("c10::BFloat16") == "bf16"
    assert dtype_of("float") == "fp32"
    assert dtype_of("c10::Half") == "fp16"
    assert dtype_of("c10::Float8_e4m3fn") == "fp8"
    assert dtype_of("c10::Float8_e5m2") == "fp8"
    assert dtype_of("double") == "fp64"
    assert dtype_of("signed char") == "int8"
    assert dtype_of("long int") == "int64"
    for s in ("Scalar", "ScalarList", "", "TensorList", "no such type"):
        assert dtype_of(s) is None


def test_tensor_bytes_of_unknown_sizes_and_non_tensors():
    assert tensor_bytes([2, -1], "float") is None
    assert tensor_bytes([2, 3], "Scalar") is None


def test_varlen_flash_is_unknown():
    # packed (total, H, D) inputs: per-sequence lengths live in cum_seq tensors, never recorded
    dims = [[20, 4, 8], [20, 4, 8], [20, 4, 8], [3], [3], [], [], [], [], []]
    types = ["c10::BFloat16"] * 3 + ["int", "int", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    conc = ["", "", "", "", "", "12", "12", "0.", "True", "False"]
    r = op_flops("aten::_flash_attention_forward", dims, types, conc)
    assert r.flops is None and "cum_seq" in r.reason and r.mask == "causal"


def test_registry():
    assert op_flops("aten::add", [[3], [3]], ["float", "float"], ["", ""]) is None
    assert op_flops("mm", [[3, 5], [5, 7]], ["float", "float"], None).flops == 210
    assert WRAPPER_OPS <= MATMUL_OPS
    need = """mm addmm bmm baddbmm matmul linear _scaled_mm _grouped_mm _scaled_grouped_mm convolution
    _convolution cudnn_convolution miopen_convolution mkldnn_convolution _slow_conv2d_forward conv1d conv2d
    conv3d convolution_backward cudnn_convolution_backward cudnn_convolution_backward_input
    cudnn_convolution_backward_weight _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    _scaled_dot_product_flash_attention_for_cpu _flash_attention_forward _efficient_attention_forward
    _scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward
    _scaled_dot_product_cudnn_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward
    _flash_attention_backward _efficient_attention_backward scaled_dot_product_attention
    _scaled_dot_product_attention_math einsum""".split()
    assert {"aten::" + n for n in need} <= MATMUL_OPS
    for n in ("matmul", "linear", "conv2d", "scaled_dot_product_attention", "einsum",
              "_scaled_dot_product_attention_math"):
        assert "aten::" + n in WRAPPER_OPS
    for n in ("mm", "bmm", "addmm", "_scaled_dot_product_flash_attention_for_cpu", "convolution_backward",
              "_flash_attention_forward", "_scaled_dot_product_cudnn_attention"):
        assert "aten::" + n not in WRAPPER_OPS


@pytest.mark.parametrize(
    "name,dims,types",
    [
        ("aten::mm", [[3, 5]], ["float"]),                       # missing operand
        ("aten::mm", [[3, 5, 2], [5, 7]], ["float", "float"]),   # wrong rank
        ("aten::mm", [[3, 5], [6, 7]], ["float", "float"]),      # K mismatch
        ("aten::mm", [[3, "5"], [5, 7]], ["float", "float"]),    # non-int
        ("aten::mm", [[3, 5.0], [5, 7]], ["float", "float"]),
        ("aten::mm", [[3, -5], [-5, 7]], ["float", "float"]),    # negative
        ("aten::bmm", [[2, 3, 5], [3, 5, 7]], ["float", "float"]),
        ("aten::matmul", [[2, 3, 5], [4, 5, 7]], ["float", "float"]),  # batch does not broadcast
        ("aten::linear", [[2, 5], [7, 6]], ["float", "float"]),
        ("aten::convolution", [[2, 3, 9], [4, 3, 3, 3]] + [[]] * 7, ["float"] * 2 + ["Scalar"] * 7),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", [[2, 3, 6, 8], [2, 2, 10, 8], [2, 2, 10, 8]],
         ["float"] * 3),                                          # 3 query heads over 2 kv heads
        ("aten::_scaled_dot_product_flash_attention_for_cpu", [[2, 3, 8], [2, 3, 10, 8], [2, 3, 10, 8]],
         ["float"] * 3),
        ("aten::_grouped_mm", [[11, 16], [3, 15, 24], [3]], ["c10::BFloat16"] * 2 + ["int"]),
        ("aten::mm", None, None),
    ],
)
def test_malformed(name, dims, types):
    r = op_flops(name, dims, types, None)
    assert isinstance(r, OpFlops)
    assert r.flops is None and r.effective is None and r.reason


def test_fuzz_never_raises():
    rng = random.Random(0)
    junk = [None, [], [[]], [[-1]], [["a"]], [[1, 2], None], [[True, 2]], "x", [[2**40, 3]], [[3, 5], [5, 7]],
            [[2, 3, 6, 8]] * 6, [[2, 6, 4, 8]] * 6, [[2, 3, 9, 11], [4, 3, 3, 3]] + [[]] * 9]
    tjunk = [None, [], ["float"] * 20, ["Scalar"] * 20, [1, 2], "float"]
    cjunk = [None, [], [""] * 20, ["[1, 1]"] * 20, ["True"] * 20, [None] * 20, ["[True, x]"] * 20, [1, [2]]]
    for name in sorted(MATMUL_OPS):
        for _ in range(40):
            r = op_flops(name, rng.choice(junk), rng.choice(tjunk), rng.choice(cjunk),
                         out_dims=rng.choice([None, [2, 4, 5, 6], [-1], "x"]))
            assert isinstance(r, OpFlops)
            assert (r.flops is None) == (r.reason is not None)
