"""Kernel names shortened by meaning (`fmt.kernel_short`), on names taken from the shared fixtures' traces."""

from __future__ import annotations

import pytest

from traceflops.core.fmt import kernel_short

REAL = [  # (a kernel name as the trace has it, what a narrow table shows)
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        "vectorized_elementwise_kernel<…> (CUDAFunctor_add)",
    ),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
        "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >"
        "(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
        "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
        "at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
        "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<"
        "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > "
        "const&)::{lambda(int)#1})",
        "elementwise_kernel<…> (MulFunctor)",
    ),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::"
        "operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda("
        "c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, ...)",
        "elementwise_kernel<…> (direct_copy_kernel_cuda)",
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, "
        "true, false, false, false, true, false>(pytorch_flash::Flash_fwd_params)",
        "flash_fwd_kernel<…>",
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>"
        ", unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, int, unsigned int)",
        "CatArrayBatchedCopy<…>",
    ),
    (
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4> >(at::native::ReduceOp<float, ...>)",
        "reduce_kernel<…> (sum_functor)",
    ),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>("
        "cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)",
        "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>",
    ),
    (
        "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
        "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, "
        "c10::BFloat16 const*, float, int, int)",
        "fused_add_rms_norm_kernel<…>",
    ),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_Generic"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "ncclKernel_AllReduce_RING_LL_Sum_float"),
]
AS_IS = [
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "triton_poi_fused_add_0",
    "aten::mm",
    "Memcpy HtoD (Pageable -> Device)",
    "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_",
]


@pytest.mark.parametrize("name, short", REAL)
def test_a_kernel_name_folds_its_template_and_keeps_what_tells_it_apart(name, short):
    assert kernel_short(name) == short
    assert kernel_short(short) == short  # shortening a shortened name changes nothing


@pytest.mark.parametrize("name", AS_IS)
def test_a_name_that_is_no_cpp_signature_is_kept_whole(name):
    assert kernel_short(name) == name
