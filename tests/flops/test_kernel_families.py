"""The table of matmul-class kernel families: each family on a real kernel name, and what no family may take."""

from __future__ import annotations

import gzip

import orjson
import polars as pl
import pytest

from traceflops.flops.kernels import FAMILIES, family_of, is_matmul_kernel


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_each_family_takes_its_real_kernel_name(fam):
    assert family_of(fam.example) is fam
    assert is_matmul_kernel(pl.Series([fam.example])).to_list() == [True]


# Real kernel names (from the shared traces) that do no matmul and that a loose pattern would take.
NOT_MATMUL = [
    "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",  # "gemm" inside fbgemm
    "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblemIDF16b",
    "sage_quant_kernel",  # SageAttention's quantisation, beside sage_fwd
    "void vllm::reshape_and_cache_flash_kernel<__hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0>(__hip_bfloat16 const*)",
    "_finalize_matmul_scatter_bf16",  # triton_kernels' MoE combine: a scatter, not a matmul
    "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
    "batched_transpose_16x32_half",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, std::array<char*, 1ul> >(int)",
    "triton_poi_fused_addmm_silu_2",  # Inductor's pointwise epilogue of an addmm: the GEMM runs in its own kernel
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, int)",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "kernel_unified_attention_decode_metadata",
]


@pytest.mark.parametrize("name", NOT_MATMUL)
def test_names_that_do_no_matmul_are_not_taken(name):
    assert family_of(name) is None
    assert is_matmul_kernel(pl.Series([name])).to_list() == [False]


def test_a_null_name_is_not_matmul():
    assert is_matmul_kernel(pl.Series([None, "Cijk_Alik_Bljk_HB_MT64x64x8"], dtype=pl.Utf8)).to_list() == [False, True]


def test_every_example_is_a_kernel_some_shared_trace_ran(shared):
    """The examples are real: each begins a kernel name of a shared trace (the families' own tests above use them)."""
    names = set()
    for f in sorted((shared / "kineto").rglob("*.json.gz")):
        with gzip.open(f) as g:
            doc = orjson.loads(g.read())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names |= {e["name"] for e in events if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel")}
    missing = [fam.name for fam in FAMILIES if not any(n.startswith(fam.example) for n in names)]
    assert not missing, missing
