"""Matmul-class kernels told by their own name: GEMM, convolution and attention libraries.

A kernel launched under an aten matmul op gets that op's FLOPs. But a kernel
replayed from a CUDA/HIP graph has no op above it, and a framework's own op
(`aiter::*`, `vllm::*`, a Triton MoE) may have no formula: such kernels were
booked as non-matmul time while the report claimed full coverage. Each family
below names what its library's kernels are called; a kernel of a family is
matmul time wherever it ran, its FLOPs unknown unless an op says them.

Every family carries one real kernel name (from a published trace) that its
pattern must match; `tests/flops/test_kernel_families.py` holds each to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from traceflops.core.trace import name_matches

__all__ = ["FAMILIES", "MATMUL_KERNEL_RE", "NOT_MATMUL_RE", "KernelFamily", "family_of", "is_matmul_kernel"]


@dataclass(frozen=True, slots=True)
class KernelFamily:
    name: str  # the library
    kind: str  # gemm | conv | attention
    pattern: str  # a regex, searched case-sensitively in the kernel name
    example: str  # a real kernel name of this family


FAMILIES: tuple[KernelFamily, ...] = (
    KernelFamily(
        "cuBLAS SIMT/tensor-core GEMM",
        "gemm",
        r"\b(?:maxwell|pascal|volta|turing|ampere|ada|hopper|sm\d{2,3})_[a-z0-9]*gemm",
        "volta_sgemm_128x64_nn",
    ),
    KernelFamily(
        "cuBLAS xmma GEMM",
        "gemm",
        r"\bsm\d{2,3}_xmma_gemm_",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    ),
    KernelFamily(
        "cuBLAS small GEMM / GEMV",
        "gemm",
        r"\bgemm(?:SN|k1)_\w*kernel|\bgemv\w*_kernel|\bgemvx::kernel",
        "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >(cublasGemmSmallNParams<"
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float>, float>)",
    ),
    KernelFamily(
        "cuBLASLt epilogue",
        "gemm",
        r"\bepilogue::impl::globalKernel<|cublasLt::",
        "void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*, "
        "cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, long, int*)",
    ),
    KernelFamily(
        "nvjet (cuBLAS, Hopper/Blackwell)", "gemm", r"^nvjet_", "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT"
    ),
    KernelFamily(
        "CUTLASS GEMM",
        "gemm",
        r"cutlass\w*_(?:simt|tensorop|wmma)_\w*gemm|\bcutlass3x_\w*gemm|cutlass::gemm::kernel",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4>"
        "(cutlass_80_tensorop_s1688gemm_64x64_16x6_nt_align4::Params)",
    ),
    KernelFamily(
        "MAGMA GEMM",
        "gemm",
        r"\bmagma_\w*gemm",
        "void magma_sgemmEx_kernel<float, float, float, true, false, 6, 4, 6, 3, 4>(int, int, int, Tensor, int, "
        "Tensor, int, Tensor, int, Tensor, int, int, int, float const*, float const*, float, float, int, "
        "cublasLtEpilogue_t, int, void const*, long)",
    ),
    KernelFamily(
        "TensorRT-LLM / FlashInfer batched GEMM",
        "gemm",
        r"^bmm_(?:Bfloat16|Fp16|Fp32|E4m3|E5m2|E2m1|MxE\w+)_",
        "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
        "schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f",
    ),
    KernelFamily(
        "Tensile (hipBLASLt, rocBLAS)",
        "gemm",
        r"^Cijk_",
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_"
        "DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_LBSPPB256_LBSPPM0_LPA16_LPB16_"
        "LPM0_LRVW8_LWPMn1_MIAV0_MIWT8_6_MO40_NTn1_NTA0_NTB0_NTC0_NTD4_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_"
        "SIA3_SS1_SPO0_SRVW0_SSO0_SVW8_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_VWA8_VWB2_WSGRA0_WSGRB0_WS64_WG32_8_1",
    ),
    KernelFamily(
        "Composable Kernel GEMM / convolution",
        "gemm",
        r"^_ZN2ck16tensor_operation\w*(?:[Gg]emm|_conv_)",
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28GridwiseGemm_xdl_"
        "cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorES7_ttfttNS0_12element_wise11PassThroughESA_SA_LNS1_"
        "18GemmSpecializationE7ELi256ELi64ELi64ELi64ELi8ELi8ELi32ELi32ELi1ELi1E",
    ),
    KernelFamily(
        "Triton matmul (Inductor templates, triton_kernels, fused MoE)",
        "gemm",
        r"^triton_tem_fused_\w*(?:mm|conv)|^_matmul_ogs_|^_?fused_moe_kernel|^_?matmul_kernel|^_?grouped_matmul",
        "_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu",
    ),
    KernelFamily(
        "MIOpen convolution",
        "conv",
        r"^igemm_(?:fwd|bwd|wrw)_|^MIOpen\w*Conv|^naive_conv_|^gridwise_convolution",
        "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs",
    ),
    KernelFamily(
        "cuDNN convolution",
        "conv",
        r"\b(?:implicit|explicit)_convolve_sgemm|_scudnn_|\bsm\d{2,3}_xmma_(?:fprop|dgrad|wgrad)_|cudnn::detail::dgrad|"
        r"cudnn::cnn::wgrad_alg\d|cudnn::winograd|cutlass\w*_s\d+(?:fprop|dgrad|wgrad)|ImplicitGemmConvolution",
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_"
        "g1_tensor16x8x8_execute_kernel_cudnn_infer",
    ),
    KernelFamily(
        "FlashAttention / cuDNN / CUTLASS fused attention",
        "attention",
        r"\bflash_(?:fwd|bwd)\w*kernel|\bflash::|\bfmha_cutlass[FB]|\bcudnn_generated_fort_native_sdpa|\bfmha_(?:fwd|bwd)_",
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, false, true, false>(pytorch_flash::Flash_fwd_params)",
    ),
    KernelFamily(
        "TensorRT-LLM / FlashInfer attention",
        "attention",
        r"^fmhaSm\d+|\b(?:Batch|Single)(?:Prefill|Decode)With\w*Kernel|\bpaged_attention_v\d|\bmultihead_attention",
        "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext",
    ),
    KernelFamily(
        "CK / aiter attention",
        "attention",
        r"Fmha(?:Fwd|Bwd|Batch|Split)\w*Kernel|\bfmha_v3_|^aiter::\w*fmha",
        "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40BlockFmhaBatchPrefillPipelineQRKSVSAsyncINS_"
        "36BlockFmhaBatchPrefillPipelineProblemIDF16bDF16bDF16bffDF16bhfDF16bfDF16bNS_13TileFmhaShapeINS_8sequenceIJLi128E",
    ),
    KernelFamily(
        "Triton attention (vLLM, SageAttention, tutorials)",
        "attention",
        r"^kernel_unified_attention_\dd|^_?attn_fwd\b|^_?attn_bwd\w*|^sage_fwd$|^_fwd_kernel$|^_bwd_kernel\w*$",
        "kernel_unified_attention_2d",
    ),
)

# Names a family's pattern would take that do no matmul: FBGEMM's embedding kernels (the name holds "gemm").
NOT_MATMUL_RE = r"fbgemm"

MATMUL_KERNEL_RE = "|".join(f"(?:{f.pattern})" for f in FAMILIES)

_COMPILED = tuple((f, re.compile(f.pattern)) for f in FAMILIES)
_NOT = re.compile(NOT_MATMUL_RE)


def family_of(name: str | None) -> KernelFamily | None:
    """The first family whose pattern matches a kernel name (None: not told by name)."""
    if not name or _NOT.search(name):
        return None
    return next((f for f, rx in _COMPILED if rx.search(name)), None)


def is_matmul_kernel(names: pl.Series) -> pl.Series:
    """Per kernel, whether its name says matmul class (the regex runs once per distinct name)."""
    return name_matches(names, MATMUL_KERNEL_RE, unless=NOT_MATMUL_RE)
