"""Peak dense FLOP/s and memory bandwidth per accelerator, per *visible device*.

Every number here is a vendor-published theoretical peak for DENSE math (no 2:4
structured sparsity). Where a vendor quotes only the sparse figure (NVIDIA's
Hopper/Blackwell datasheets mark tensor figures "with sparsity"), the dense
value is half of it, as the same datasheets' footnotes say.

Precision keys of ``Hardware.peaks`` (matrix / tensor-core rate, the right
denominator for MFU):

    fp64, fp32, tf32, bf16, fp16, fp8, int8, fp4

``fp32`` is the rate of an IEEE fp32 matmul: CUDA-core FMA on NVIDIA (their
tensor cores do not take fp32 without TF32), matrix-core fp32 on AMD CDNA.
``fp16`` on NVIDIA is the fp16-in / fp32-accumulate tensor rate, the mode
PyTorch uses; on GeForce parts that is half the fp16-accumulate rate.

``Hardware.vector_peaks`` holds non-matrix (SIMT / vector ALU) rates for
elementwise rooflines, keyed ``vector_fp32``, ``vector_fp16``,
``vector_bf16``, ``vector_fp64``.

Per visible device: an AMD MI250/MI250X card shows up as two devices (two
GCDs), so its rows hold half the card's figures; a TPU v2/v3 chip shows up as
two devices (one per TensorCore) while v4/v5p fuse both cores into one device.

Units: FLOP/s (or OP/s for int8) and bytes/s. Link bandwidths are bytes/s as
the vendor quotes them (NVIDIA's NVLink figures are bidirectional totals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

T = 1e12
G = 1e9

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
VECTOR_KEYS = ("vector_fp64", "vector_fp32", "vector_fp16", "vector_bf16")

_PRECISION_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "f64": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "single": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "bf": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "fp8e4m3": "fp8",
    "fp8e5m2": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "float8e4m3fn": "fp8",
    "float8e5m2": "fp8",
    "i8": "int8",
    "s8": "int8",
}


def normalize_precision(precision: str) -> str:
    """'bfloat16' -> 'bf16', 'torch.float16' -> 'fp16', 'vector fp32' -> 'vector_fp32'."""
    p = precision.strip().lower().replace("torch.", "").replace("jnp.", "")
    vector = p.startswith("vector")
    p = re.sub(r"^vector[\s_-]*", "", p)
    p = re.sub(r"[\s_\-]", "", p)
    p = _PRECISION_ALIASES.get(p, p)
    return f"vector_{p}" if vector else p


@dataclass(frozen=True)
class Hardware:
    name: str
    peaks: dict[str, float]  # FLOP/s, dense, per visible device, matrix/tensor rate
    hbm_bytes_per_s: float | None
    source: str
    vector_peaks: dict[str, float] = field(default_factory=dict)
    notes: str = ""
    # Optional extras (not needed for MFU):
    links: dict[str, float] = field(default_factory=dict)  # bytes/s, e.g. {'nvlink': 900e9}
    compute_units: int | None = None  # SMs (NVIDIA) / CUs (AMD) per visible device
    memory_bytes: float | None = None  # device memory per visible device (vendor GB, 1e9)
    key: str = ""  # key in HARDWARE ('' for custom)

    def peak(self, precision: str) -> float | None:
        """Dense peak FLOP/s for a precision ('bf16', 'bfloat16', 'vector_fp32', ...), or None."""
        p = normalize_precision(precision)
        if p.startswith("vector_"):
            return self.vector_peaks.get(p)
        return self.peaks.get(p)

    def __hash__(self) -> int:  # dict fields are unhashable; rows are identified by these
        return hash((self.key, self.name, self.source))

    def peak_tflops(self, precision: str) -> float | None:
        v = self.peak(precision)
        return None if v is None else v / T


def _hw(key: str, **kw) -> Hardware:
    return Hardware(key=key, **kw)


# --- sources ------------------------------------------------------------------

_SRC_V100 = (
    "NVIDIA Tesla V100 GPU datasheet (V100 SXM2 / PCIe / V100S PCIe), "
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf ; "
    "Volta whitepaper https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
)
_SRC_TURING = (
    "NVIDIA Turing GPU Architecture whitepaper, appendix table for GeForce RTX 2080 Ti "
    "(reference board, 1545 MHz boost), "
    "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"
)
_SRC_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet, "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
    " ; non-tensor fp16/bf16 from the NVIDIA Ampere (GA100) architecture whitepaper, "
    "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"
)
_SRC_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (tensor figures quoted with sparsity; dense = 1/2), "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet ; "
    "dense and non-tensor rates from the NVIDIA H100 (Hopper) architecture whitepaper, "
    "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
_SRC_H200 = (
    "NVIDIA H200 Tensor Core GPU datasheet (same GH100 compute as H100 SXM; 141 GB HBM3e, 4.8 TB/s), "
    "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446 ; "
    "product page https://www.nvidia.com/en-us/data-center/h200/"
)
_SRC_BLACKWELL = (
    "NVIDIA HGX / GB200 NVL72 technical specifications table, per-GPU rows "
    "(tensor figures quoted with sparsity; dense = 1/2), "
    "https://www.nvidia.com/en-us/data-center/hgx/ and https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
)
_SRC_MI200 = (
    "AMD Instinct MI200 series datasheet / MI250 & MI250X product pages (per-card peaks; "
    "per visible device = one GCD = 1/2 card), "
    "https://www.amd.com/system/files/documents/amd-instinct-mi200-datasheet.pdf , "
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html ; "
    "GCD structure and Infinity Fabric links: ROCm 'AMD Instinct MI250 microarchitecture', "
    "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi250.html"
)
_SRC_MI300X = (
    "AMD Instinct MI300X data sheet (dense and 'with structured sparsity' columns; dense used), "
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"
    " ; AMD CDNA 3 architecture whitepaper, "
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/white-papers/amd-cdna-3-white-paper.pdf"
)

_SRC_MI325X = (
    "AMD Instinct MI325X product page / data sheet (dense and 'with structured sparsity' columns; dense used), "
    "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html ; "
    "CUs, VRAM and LLVM target (304 CUs, 256 GiB, gfx942): ROCm 'AMD GPU specifications', "
    "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html ; "
    "AMD CDNA 3 architecture whitepaper, "
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/white-papers/amd-cdna-3-white-paper.pdf"
)
_SRC_MI350 = (
    "AMD Instinct MI355X / MI350X product pages (dense and 'with structured sparsity' columns; dense used), "
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html , "
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi350x.html ; "
    "AMD CDNA 4 architecture whitepaper, "
    "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/white-papers/amd-cdna-4-architecture-whitepaper.pdf"
    " ; CUs, VRAM, LLVM target and GFXIP (256 CUs, 288 GiB, gfx950, 9.5): ROCm 'AMD GPU specifications', "
    "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html ; "
    "MI355X 'up to 10 petaFLOPS (MXFP4/MXFP6)': AMD technical article 'InferenceMAX: Benchmarking Progress in "
    "Real Time', "
    "https://www.amd.com/en/developer/resources/technical-articles/2025/inferencemax-benchmarking-progress-in-real-time.html"
    " ; no TF32 GEMM on CDNA 4: ROCm Compute Profiler 'AMD CDNA architecture', "
    "https://rocm.docs.amd.com/projects/rocprofiler-compute/en/develop/conceptual/cdna/cdna-performance-model.html"
)
_SRC_GH200 = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet / product page (per-superchip GPU figures, tensor figures "
    "quoted with sparsity; dense = 1/2; the same GPU compute as H100 SXM5), "
    "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ ; "
    "'H100 on GH200', GH100, compute capability 9.0, 96GB: NVIDIA Multi-Instance GPU User Guide, Supported GPUs, "
    "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html ; "
    "device names 'NVIDIA GH200 480GB', 'NVIDIA GH200 120GB', 'NVIDIA GH200 144G HBM3e': NVIDIA "
    "open-gpu-kernel-modules README (supported GPUs), https://github.com/NVIDIA/open-gpu-kernel-modules"
)
_SRC_L40S = (
    "NVIDIA L40S datasheet (tensor columns 'dense | with sparsity'; dense used), "
    "https://www.nvidia.com/en-us/data-center/l40s/"
)


def _tpu_src(v: str) -> str:
    return f"Google Cloud TPU {v} system architecture page, https://cloud.google.com/tpu/docs/{v}"


HARDWARE: dict[str, Hardware] = {}


def _add(hw: Hardware) -> None:
    HARDWARE[hw.key] = hw


# --- NVIDIA Volta / Turing ----------------------------------------------------

_add(
    _hw(
        "v100-sxm2",
        name="NVIDIA V100 SXM2",
        peaks={"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T},
        vector_peaks={"vector_fp64": 7.8 * T, "vector_fp32": 15.7 * T, "vector_fp16": 31.4 * T},
        hbm_bytes_per_s=900 * G,
        source=_SRC_V100,
        links={"nvlink": 300 * G, "pcie_gen3_x16": 32 * G},
        compute_units=80,
        notes=(
            "fp16 = tensor-core mixed precision (fp16 in, fp32 accumulate). Volta has no bf16/tf32 "
            "tensor cores: bf16 runs without tensor cores, so peak('bf16') is None -- pass "
            "--peak-tflops if you want a bf16 denominator. DGX Station 'V100-DGXS' and DGX-2 "
            "'V100-SXM3' parts are mapped here (same 80 SMs; SXM3 may boost ~4% higher)."
        ),
    )
)
_add(
    _hw(
        "v100-pcie",
        name="NVIDIA V100 PCIe",
        peaks={"fp64": 7.0 * T, "fp32": 14.0 * T, "fp16": 112 * T},
        vector_peaks={"vector_fp64": 7.0 * T, "vector_fp32": 14.0 * T, "vector_fp16": 28.0 * T},
        hbm_bytes_per_s=900 * G,
        source=_SRC_V100,
        links={"pcie_gen3_x16": 32 * G},
        compute_units=80,
        notes="fp16 = tensor-core mixed precision. No bf16/tf32 tensor cores.",
    )
)
_add(
    _hw(
        "v100s-pcie",
        name="NVIDIA V100S PCIe",
        peaks={"fp64": 8.2 * T, "fp32": 16.4 * T, "fp16": 130 * T},
        vector_peaks={"vector_fp64": 8.2 * T, "vector_fp32": 16.4 * T, "vector_fp16": 32.8 * T},
        hbm_bytes_per_s=1134 * G,
        source=_SRC_V100,
        links={"pcie_gen3_x16": 32 * G},
        compute_units=80,
        notes="fp16 = tensor-core mixed precision. No bf16/tf32 tensor cores.",
    )
)
_add(
    _hw(
        "rtx-2080-ti",
        name="NVIDIA GeForce RTX 2080 Ti",
        peaks={"fp32": 13.4 * T, "fp16": 53.8 * T, "int8": 215.2 * T},
        vector_peaks={"vector_fp32": 13.4 * T, "vector_fp16": 26.9 * T},
        hbm_bytes_per_s=616 * G,
        source=_SRC_TURING,
        links={"nvlink_bridge": 100 * G, "pcie_gen3_x16": 32 * G},
        compute_units=68,
        memory_bytes=11e9,
        notes=(
            "GDDR6, not HBM. fp16 = tensor rate with fp32 accumulate (what PyTorch uses); "
            "GeForce Turing runs fp16-accumulate at 2x that (107.6 TFLOP/s). Reference-clock "
            "figures; Founders Edition (1635 MHz) is ~6% higher (56.9 / 113.8). No bf16/tf32."
        ),
    )
)

# --- NVIDIA Ampere --------------------------------------------------------------

_A100_PEAKS = {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T, "int8": 624 * T}
_A100_VEC = {"vector_fp64": 9.7 * T, "vector_fp32": 19.5 * T, "vector_fp16": 78 * T, "vector_bf16": 39 * T}
_A100_NOTE = "SXM4 40 GB and 80 GB share compute peaks; they differ in HBM bandwidth."
_add(
    _hw(
        "a100",
        name="NVIDIA A100 SXM4 80GB",
        peaks=_A100_PEAKS,
        vector_peaks=_A100_VEC,
        hbm_bytes_per_s=2039 * G,
        source=_SRC_A100,
        compute_units=108,
        memory_bytes=80e9,
        links={"nvlink": 600 * G, "pcie_gen4_x16": 64 * G},
        notes=_A100_NOTE,
    )
)
_add(
    _hw(
        "a100-40gb",
        name="NVIDIA A100 SXM4 40GB",
        peaks=_A100_PEAKS,
        vector_peaks=_A100_VEC,
        hbm_bytes_per_s=1555 * G,
        source=_SRC_A100,
        compute_units=108,
        memory_bytes=40e9,
        links={"nvlink": 600 * G, "pcie_gen4_x16": 64 * G},
        notes=_A100_NOTE + " Meta's 'A100-PG509-200' boards are this part.",
    )
)
_add(
    _hw(
        "a100-pcie-80gb",
        name="NVIDIA A100 PCIe 80GB",
        peaks=_A100_PEAKS,
        vector_peaks=_A100_VEC,
        hbm_bytes_per_s=1935 * G,
        source=_SRC_A100,
        compute_units=108,
        memory_bytes=80e9,
        links={"nvlink_bridge": 600 * G, "pcie_gen4_x16": 64 * G},
        notes="Same datasheet peaks as SXM4; a 300 W part may sustain lower clocks.",
    )
)
_add(
    _hw(
        "a100-pcie-40gb",
        name="NVIDIA A100 PCIe 40GB",
        peaks=_A100_PEAKS,
        vector_peaks=_A100_VEC,
        hbm_bytes_per_s=1555 * G,
        source=_SRC_A100,
        compute_units=108,
        memory_bytes=40e9,
        links={"nvlink_bridge": 600 * G, "pcie_gen4_x16": 64 * G},
        notes="Same datasheet peaks as SXM4; a 250 W part may sustain lower clocks.",
    )
)

# --- NVIDIA Ada Lovelace -----------------------------------------------------------

_add(
    _hw(
        "l40s",
        name="NVIDIA L40S",
        peaks={"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T, "fp8": 733 * T},
        vector_peaks={"vector_fp32": 91.6 * T},
        hbm_bytes_per_s=864 * G,
        source=_SRC_L40S,
        compute_units=142,
        memory_bytes=48e9,
        links={"pcie_gen4_x16": 64 * G},
        notes=(
            "48 GB GDDR6 with ECC, not HBM. Datasheet 'dense | with sparsity': TF32 183 | 366, "
            "BF16/FP16 362.05 | 733, FP8 733 | 1,466; dense used. The datasheet does not say which "
            "accumulate precision its FP16 figure assumes. No FP64 figure is published, and the INT8 "
            "figure was not confirmed against a stored copy of the datasheet in this build, so "
            "neither is in the row. 142 SMs: 18,176 CUDA cores / 128 per Ada SM (= its 142 RT cores, "
            "one per SM)."
        ),
    )
)

# --- NVIDIA Hopper --------------------------------------------------------------

_H100_SXM_PEAKS = {
    "fp64": 66.9 * T,
    "fp32": 66.9 * T,
    "tf32": 494.7 * T,
    "bf16": 989.4 * T,
    "fp16": 989.4 * T,
    "fp8": 1978.9 * T,
    "int8": 1978.9 * T,
}
_H100_SXM_VEC = {"vector_fp64": 33.5 * T, "vector_fp32": 66.9 * T, "vector_fp16": 133.8 * T, "vector_bf16": 133.8 * T}
_add(
    _hw(
        "h100-sxm",
        name="NVIDIA H100 SXM5 80GB",
        peaks=_H100_SXM_PEAKS,
        vector_peaks=_H100_SXM_VEC,
        hbm_bytes_per_s=3.35 * T,
        source=_SRC_H100,
        compute_units=132,
        memory_bytes=80e9,
        links={"nvlink": 900 * G, "pcie_gen5_x16": 128 * G},
        notes=(
            "Dense. The datasheet's 1,979 (bf16) and 3,958 (fp8) TFLOP/s are WITH 2:4 "
            "sparsity; dense is half. Datasheet rounds to 989 / 1,979 / 67 / 34."
        ),
    )
)
_add(
    _hw(
        "h100-pcie",
        name="NVIDIA H100 PCIe 80GB",
        peaks={
            "fp64": 51.2 * T,
            "fp32": 51.2 * T,
            "tf32": 378 * T,
            "bf16": 756 * T,
            "fp16": 756 * T,
            "fp8": 1513 * T,
            "int8": 1513 * T,
        },
        vector_peaks={
            "vector_fp64": 25.6 * T,
            "vector_fp32": 51.2 * T,
            "vector_fp16": 102.4 * T,
            "vector_bf16": 102.4 * T,
        },
        hbm_bytes_per_s=2.0 * T,
        source=_SRC_H100,
        compute_units=114,
        memory_bytes=80e9,
        links={"nvlink_bridge": 600 * G, "pcie_gen5_x16": 128 * G},
        notes=(
            "HBM2e. Datasheet quotes 1,513 (bf16) / 3,026 (fp8) with sparsity; dense is half. 114 SMs (vs 132 on SXM5)."
        ),
    )
)
_add(
    _hw(
        "h100-nvl",
        name="NVIDIA H100 NVL 94GB",
        peaks={
            "fp64": 60 * T,
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835.5 * T,
            "fp16": 835.5 * T,
            "fp8": 1670.5 * T,
            "int8": 1670.5 * T,
        },
        vector_peaks={"vector_fp64": 30 * T, "vector_fp32": 60 * T},
        hbm_bytes_per_s=3.9 * T,
        source=_SRC_H100,
        compute_units=132,
        memory_bytes=94e9,
        links={"nvlink_bridge": 600 * G, "pcie_gen5_x16": 128 * G},
        notes=(
            "PCIe card with 132 SMs at a 350-400 W limit: tell it from SXM5 by name ('NVL'). "
            "Per-GPU datasheet figures (835 TF32 / 1,671 BF16 / 3,341 FP8 with sparsity) halved. "
            "Not cross-checked against a stored copy of the datasheet in this build."
        ),
    )
)
_add(
    _hw(
        "h200",
        name="NVIDIA H200 SXM 141GB",
        peaks=_H100_SXM_PEAKS,
        vector_peaks=_H100_SXM_VEC,
        hbm_bytes_per_s=4.8 * T,
        source=_SRC_H200,
        compute_units=132,
        memory_bytes=141e9,
        links={"nvlink": 900 * G, "pcie_gen5_x16": 128 * G},
        notes="Same compute as H100 SXM5 (dense bf16 989 TFLOP/s); HBM3e 4.8 TB/s.",
    )
)
_add(
    _hw(
        "h200-nvl",
        name="NVIDIA H200 NVL 141GB",
        peaks={
            "fp64": 60 * T,
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835.5 * T,
            "fp16": 835.5 * T,
            "fp8": 1670.5 * T,
            "int8": 1670.5 * T,
        },
        vector_peaks={"vector_fp64": 30 * T, "vector_fp32": 60 * T},
        hbm_bytes_per_s=4.8 * T,
        source=_SRC_H200,
        compute_units=132,
        memory_bytes=141e9,
        links={"nvlink_bridge": 900 * G, "pcie_gen5_x16": 128 * G},
        notes=(
            "PCIe card at up to 600 W: datasheet 1,671 BF16 / 3,341 FP8 with sparsity, halved. "
            "Not cross-checked against a stored copy of the datasheet in this build."
        ),
    )
)

_GH200_NOTE = (
    "The GPU of a GH200 superchip: the datasheet's per-GPU compute is H100 SXM5's (67 FP64 "
    "Tensor, 989 TF32*, 1,979 BF16/FP16*, 3,958 FP8/INT8* with sparsity; dense is half), "
    "132 SMs. The module's power (CPU+GPU+memory, up to 1000 W) is configurable, so a "
    "low power setting may not sustain these clocks. "
)
_add(
    _hw(
        "gh200",
        name="NVIDIA GH200 96GB HBM3",
        peaks=_H100_SXM_PEAKS,
        vector_peaks=_H100_SXM_VEC,
        hbm_bytes_per_s=4.0 * T,
        source=_SRC_GH200,
        compute_units=132,
        memory_bytes=96e9,
        links={"nvlink_c2c": 900 * G},
        notes=_GH200_NOTE
        + (
            "96 GB HBM3 at 4 TB/s: the devices named 'GH200 480GB' and 'GH200 120GB' "
            "(those sizes are the Grace CPU's LPDDR5X). HBM bandwidth not cross-checked "
            "against a stored copy of the datasheet in this build."
        ),
    )
)
_add(
    _hw(
        "gh200-144gb",
        name="NVIDIA GH200 144GB HBM3e",
        peaks=_H100_SXM_PEAKS,
        vector_peaks=_H100_SXM_VEC,
        hbm_bytes_per_s=4.9 * T,
        source=_SRC_GH200,
        compute_units=132,
        memory_bytes=144e9,
        links={"nvlink_c2c": 900 * G},
        notes=_GH200_NOTE
        + (
            "144 GB HBM3e at 4.9 TB/s: the device named 'GH200 144G HBM3e'. HBM "
            "bandwidth not cross-checked against a stored copy of the datasheet in "
            "this build."
        ),
    )
)

# --- NVIDIA Blackwell -------------------------------------------------------------

_add(
    _hw(
        "b200",
        name="NVIDIA B200 (HGX B200, 1000 W)",
        peaks={
            "fp64": 37 * T,
            "fp32": 75 * T,
            "tf32": 1100 * T,
            "bf16": 2250 * T,
            "fp16": 2250 * T,
            "fp8": 4500 * T,
            "int8": 4500 * T,
            "fp4": 9000 * T,
        },
        vector_peaks={"vector_fp64": 37 * T, "vector_fp32": 75 * T},
        hbm_bytes_per_s=7.7 * T,
        source=_SRC_BLACKWELL,
        compute_units=148,
        memory_bytes=180e9,
        links={"nvlink": 1.8 * T, "pcie_gen5_x16": 128 * G},
        notes=(
            "HGX table quotes 4.5 PF FP16/BF16, 9 PF FP8, 2.2 PF TF32 per GPU with sparsity; "
            "dense is half. Earlier NVIDIA material gave 8 TB/s and 40/80 TFLOP/s FP64/FP32 "
            "for the same part; the later table (7.7 TB/s, 37/75) is used."
        ),
    )
)
_add(
    _hw(
        "gb200",
        name="NVIDIA B200 in GB200 (NVL72, 1200 W)",
        peaks={
            "fp64": 40 * T,
            "fp32": 80 * T,
            "tf32": 1250 * T,
            "bf16": 2500 * T,
            "fp16": 2500 * T,
            "fp8": 5000 * T,
            "int8": 5000 * T,
            "fp4": 10000 * T,
        },
        vector_peaks={"vector_fp64": 40 * T, "vector_fp32": 80 * T},
        hbm_bytes_per_s=8.0 * T,
        source=_SRC_BLACKWELL,
        memory_bytes=186e9,
        links={"nvlink": 1.8 * T},
        notes="Per-GPU row of the GB200 NVL72 table (5 PF BF16, 10 PF FP8 with sparsity), halved.",
    )
)

# --- AMD CDNA2 / CDNA3 ----------------------------------------------------------------

_add(
    _hw(
        "mi250x",
        name="AMD Instinct MI250X (one GCD)",
        peaks={"fp64": 47.85 * T, "fp32": 47.85 * T, "bf16": 191.5 * T, "fp16": 191.5 * T, "int8": 191.5 * T},
        vector_peaks={"vector_fp64": 23.95 * T, "vector_fp32": 23.95 * T},
        hbm_bytes_per_s=1.6384 * T,
        source=_SRC_MI200,
        compute_units=110,
        memory_bytes=64e9,
        links={"infinity_fabric_link": 50 * G},
        notes=(
            "Per GCD = half the card: card peaks 383 TF fp16/bf16, 95.7 TF fp64/fp32 matrix, "
            "47.9 TF fp64/fp32 vector (95.7 packed fp32), 3.2768 TB/s, 220 CUs (110 per GCD). "
            "No tf32/fp8 on CDNA2."
        ),
    )
)
_add(
    _hw(
        "mi250",
        name="AMD Instinct MI250 (one GCD)",
        peaks={"fp64": 45.25 * T, "fp32": 45.25 * T, "bf16": 181.05 * T, "fp16": 181.05 * T, "int8": 181.05 * T},
        vector_peaks={"vector_fp64": 22.65 * T, "vector_fp32": 22.65 * T},
        hbm_bytes_per_s=1.6384 * T,
        source=_SRC_MI200,
        compute_units=104,
        memory_bytes=64e9,
        links={"infinity_fabric_link": 50 * G},
        notes=(
            "Per GCD = half the card: card peaks 362.1 TF fp16/bf16, 90.5 TF fp64/fp32 matrix, "
            "45.3 TF vector, 3.2768 TB/s, 208 CUs (104 per GCD). A single-GCD MI210 "
            "(104 CUs, 64 GB, 1.6384 TB/s) has the same per-device figures."
        ),
    )
)
_add(
    _hw(
        "mi300x",
        name="AMD Instinct MI300X",
        peaks={
            "fp64": 163.4 * T,
            "fp32": 163.4 * T,
            "tf32": 653.7 * T,
            "bf16": 1307.4 * T,
            "fp16": 1307.4 * T,
            "fp8": 2614.9 * T,
            "int8": 2614.9 * T,
        },
        vector_peaks={"vector_fp64": 81.7 * T, "vector_fp32": 163.4 * T},
        hbm_bytes_per_s=5.3 * T,
        source=_SRC_MI300X,
        compute_units=304,
        memory_bytes=192e9,
        links={"infinity_fabric_link": 128 * G, "infinity_fabric_total": 896 * G, "pcie_gen5_x16": 128 * G},
        notes=(
            "Dense (the data sheet's 2,614.9 bf16 / 5,229.8 fp8 are with sparsity). "
            "In CPX partition mode each of the 8 XCDs (38 CUs) is its own device "
            "with 1/8 of these peaks."
        ),
    )
)

_add(
    _hw(
        "mi325x",
        name="AMD Instinct MI325X",
        peaks={
            "fp64": 163.4 * T,
            "fp32": 163.4 * T,
            "tf32": 653.7 * T,
            "bf16": 1307.4 * T,
            "fp16": 1307.4 * T,
            "fp8": 2614.9 * T,
            "int8": 2614.9 * T,
        },
        vector_peaks={"vector_fp64": 81.7 * T, "vector_fp32": 163.4 * T},
        hbm_bytes_per_s=6.0 * T,
        source=_SRC_MI325X,
        compute_units=304,
        memory_bytes=256e9,
        notes=(
            "MI300X compute (CDNA 3, gfx942, 304 CUs at 2.1 GHz: dense 1,307.4 bf16 / 2,614.9 fp8, "
            "the data sheet's 2,614.9 / 5,229.8 are with sparsity) with 256 GB HBM3E at 6 TB/s. "
            "Told from an MI300X by name, else by memory (256 vs 192 GiB)."
        ),
    )
)

# --- AMD CDNA4 ------------------------------------------------------------------------------

_MI350_NOTE = (
    "CDNA 4 (gfx950), 256 CUs (32 per XCD), 288 GB HBM3E at 8 TB/s. Dense figures (the "
    "sparse columns are twice fp16/bf16/fp8/int8). No TF32 matrix math on CDNA 4, so no tf32 "
    "peak. fp4 is MXFP4; MXFP6 runs at the same rate (the table has no fp6 key). MI350X and "
    "MI355X differ only in peak engine clock and board power: a trace's name or its clock "
    "rate tells them apart, else MI355X is assumed and the report says so. Every figure is "
    "256 CUs x FLOP/clock/CU x peak clock (fp64 128, fp32 256, fp16/bf16 4,096, fp8/int8 "
    "8,192, MXFP4 16,384). fp64 and fp32 were not cross-checked against a stored copy of "
    "the data sheet in this build. "
)
_add(
    _hw(
        "mi355x",
        name="AMD Instinct MI355X",
        peaks={
            "fp64": 78.6 * T,
            "fp32": 157.3 * T,
            "bf16": 2516.6 * T,
            "fp16": 2516.6 * T,
            "fp8": 5033.2 * T,
            "int8": 5033.2 * T,
            "fp4": 10066.3 * T,
        },
        vector_peaks={"vector_fp64": 78.6 * T, "vector_fp32": 157.3 * T},
        hbm_bytes_per_s=8.0 * T,
        source=_SRC_MI350,
        compute_units=256,
        memory_bytes=288e9,
        notes=_MI350_NOTE + "MI355X: 2,400 MHz peak engine clock, 1,400 W (liquid cooled).",
    )
)
_add(
    _hw(
        "mi350x",
        name="AMD Instinct MI350X",
        peaks={
            "fp64": 72.1 * T,
            "fp32": 144.2 * T,
            "bf16": 2306.9 * T,
            "fp16": 2306.9 * T,
            "fp8": 4613.7 * T,
            "int8": 4613.7 * T,
            "fp4": 9227.5 * T,
        },
        vector_peaks={"vector_fp64": 72.1 * T, "vector_fp32": 144.2 * T},
        hbm_bytes_per_s=8.0 * T,
        source=_SRC_MI350,
        compute_units=256,
        memory_bytes=288e9,
        notes=_MI350_NOTE
        + ("MI350X: 2,200 MHz peak engine clock, 1,000 W (air cooled); AMD rounds these to 2.3 / 4.6 / 9.2 PFLOP/s."),
    )
)

# --- Google TPU -------------------------------------------------------------------------

_add(
    _hw(
        "tpu-v3",
        name="Google TPU v3 (one TensorCore)",
        peaks={"bf16": 61.5 * T},
        hbm_bytes_per_s=450 * G,
        source=_tpu_src("v3"),
        memory_bytes=16 * 2**30,
        notes=(
            "Per TensorCore, the unit JAX/PyTorch-XLA show as a device on v3: the chip "
            "(2 cores) is 123 TFLOP/s bf16, 32 GiB, 900 GB/s."
        ),
    )
)
_add(
    _hw(
        "tpu-v4",
        name="Google TPU v4",
        peaks={"bf16": 275 * T, "int8": 275 * T},
        hbm_bytes_per_s=1200 * G,
        source=_tpu_src("v4") + " ; PaLM (Chowdhery et al. 2022) uses 275 TFLOP/s bf16 per chip",
        memory_bytes=32 * 2**30,
        notes=(
            "Per chip (2 TensorCores fused as one megacore device). fp32 matmuls run as "
            "multi-pass bf16: no fp32 peak is published."
        ),
    )
)
_add(
    _hw(
        "tpu-v5e",
        name="Google TPU v5e (v5 lite)",
        peaks={"bf16": 197 * T, "int8": 393 * T},
        hbm_bytes_per_s=819 * G,
        source=_tpu_src("v5e"),
        memory_bytes=16e9,
        links={"ici_bidirectional": 400 * G},
        notes="One TensorCore per chip; some doc revisions print int8 as 394.",
    )
)
_add(
    _hw(
        "tpu-v5p",
        name="Google TPU v5p",
        peaks={"bf16": 459 * T, "fp8": 459 * T},
        hbm_bytes_per_s=2765 * G,
        source=_tpu_src("v5p"),
        memory_bytes=95e9,
        links={"ici_bidirectional": 1200 * G},
        notes="Per chip (megacore). The docs list fp8 at the bf16 rate (no native fp8 speed-up).",
    )
)
_add(
    _hw(
        "tpu-v6e",
        name="Google TPU v6e (Trillium)",
        peaks={"bf16": 918 * T, "int8": 1836 * T},
        hbm_bytes_per_s=1638 * G,
        source=_tpu_src("v6e"),
        memory_bytes=32e9,
        links={"ici_bidirectional": 800 * G},
        notes=(
            "XLA reports the device type as 'TPU v6 lite'. Its xplane device stats carry "
            "peak_teraflops_per_second=918 and peak_hbm_bw ~1638 GB/s, matching this row."
        ),
    )
)


# --- lookup ------------------------------------------------------------------------------


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


_ALIASES: dict[str, str] = {}


def _alias(key: str, *names: str) -> None:
    for n in (key, HARDWARE[key].name, *names):
        _ALIASES[_norm(n)] = key


_alias("v100-sxm2", "v100", "v100 sxm2", "v100-sxm", "tesla v100", "v100-dgxs", "v100 sxm3")
_alias("v100-pcie", "tesla v100 pcie")
_alias("v100s-pcie", "v100s")
_alias("rtx-2080-ti", "2080ti", "rtx2080ti", "geforce rtx 2080 ti")
_alias("a100", "a100-sxm", "a100 sxm4", "a100-80gb", "a100 sxm4 80gb", "a100-sxm4-80gb")
_alias("a100-40gb", "a100-sxm-40gb", "a100 sxm4 40gb", "a100-sxm4-40gb", "a100-pg509-200")
_alias("a100-pcie-80gb", "a100-pcie", "a100 80gb pcie")
_alias("a100-pcie-40gb", "a100-pcie-40gb")
_alias("h100-sxm", "h100", "h100 sxm5", "h100-sxm5", "h100 80gb hbm3")
_alias("h100-pcie", "h100 pcie")
_alias("h100-nvl", "h100 nvl")
_alias("h200", "h200-sxm", "h200 sxm")
_alias("h200-nvl", "h200 nvl")
_alias("gh200", "gh200 96gb", "gh200 hbm3", "gh200 480gb", "gh200 120gb")
_alias("gh200-144gb", "gh200 144gb", "gh200 144g hbm3e", "gh200 hbm3e")
_alias("l40s", "nvidia l40s")
_alias("b200", "hgx b200", "b200-sxm")
_alias("gb200", "gb200 nvl72")
_alias("mi250x", "instinct mi250x")
_alias("mi250", "instinct mi250", "mi210")
_alias("mi300x", "instinct mi300x", "mi300")
_alias("mi325x", "instinct mi325x", "mi325")
_alias("mi355x", "instinct mi355x", "mi355")
_alias("mi350x", "instinct mi350x", "mi350")
_alias("tpu-v3", "v3", "tpuv3")
_alias("tpu-v4", "v4", "tpuv4")
_alias("tpu-v5e", "v5e", "tpu v5 lite", "v5litepod", "tpu v5litepod")
_alias("tpu-v5p", "v5p")
_alias("tpu-v6e", "v6e", "trillium", "tpu v6 lite")


def lookup(name: str) -> Hardware | None:
    """Find a row by key, alias or full device name, ignoring case, spaces, '-' and '_'.

    'H100', 'h100_sxm', 'NVIDIA H100 80GB HBM3', 'tpu v5 lite', 'MI250X' all resolve.
    """
    if not name or not name.strip():
        return None
    key = _ALIASES.get(_norm(name))
    if key:
        return HARDWARE[key]
    hw, _ = detect({"name": name})
    if hw is not None:
        return hw
    hw, _ = detect_xla(name)
    return hw


# --- detection from Kineto deviceProperties ----------------------------------------------


def _i(props: dict, key: str) -> int | None:
    v = props.get(key)
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _gb(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"


def _is_amd(name: str, props: dict) -> bool:
    n = name.lower()
    if any(s in n for s in ("amd", "instinct", "radeon", "mi2", "mi3", "gfx9")):
        return True
    if str(props.get("gcnArchName") or "").lower().startswith("gfx"):
        return True
    return _i(props, "warpSize") == 64


def detect(device_properties: dict) -> tuple[Hardware | None, str]:
    """Pick the table row for one Kineto ``deviceProperties`` entry.

    Returns (row or None, one-line explanation of how it was chosen or why not).
    On ROCm ``numSms`` holds compute units, and the name may be the generic
    'AMD Radeon Graphics': the CU count then decides.
    """
    if not isinstance(device_properties, dict) or not device_properties:
        return None, "no deviceProperties entry: pass --hardware NAME or --peak-tflops"
    props = device_properties
    raw = str(props.get("name") or "").strip()
    n = raw.lower()
    sms = _i(props, "numSms")
    mem = _i(props, "totalGlobalMem")
    major, minor = _i(props, "computeMajor"), _i(props, "computeMinor")
    cc = f"{major}.{minor}" if major is not None else "?"
    desc = f"'{raw}' ({sms if sms is not None else '?'} SMs/CUs, cc {cc}, {_gb(mem)})"

    def hit(key: str, why: str) -> tuple[Hardware, str]:
        return HARDWARE[key], f"{desc} -> {key}: {why}"

    if not raw and sms is None:
        return None, "deviceProperties has neither a name nor numSms: pass --hardware or --peak-tflops"

    if _is_amd(raw, props):
        return _detect_amd(n, props, desc, sms, major, minor, mem, hit)

    # ---- NVIDIA -------------------------------------------------------------
    if "gh200" in n:  # before 'h200': 'NVIDIA GH200 480GB', 'NVIDIA GH200 120GB', 'NVIDIA GH200 144G HBM3e'
        if "hbm3e" in n or "144g" in n.replace(" ", ""):
            return hit("gh200-144gb", "name says GH200 144G HBM3e (H100 compute, 4.9 TB/s HBM3e)")
        if re.search(r"\b(480|120) ?gb\b", n):
            return hit(
                "gh200",
                "name says GH200 480GB/120GB: the 96 GB HBM3 module (H100 compute, "
                "4 TB/s; the 480/120 GB is the CPU's LPDDR5X)",
            )
        if mem is not None:
            if mem > 120 * 2**30:
                return hit("gh200-144gb", "GH200 with more than 120 GiB of GPU memory = the 144 GB HBM3e module")
            return hit(
                "gh200", "GH200 with 96 GB HBM3 (H100 compute, 4 TB/s; the name's 480GB/120GB is the CPU's LPDDR5X)"
            )
        return hit(
            "gh200",
            "GH200 of unknown GPU memory: assumed the 96 GB HBM3 module (4 TB/s; "
            "compute is the same on the 144 GB HBM3e one)",
        )
    if "gb200" in n:
        return hit("gb200", "name says GB200")
    if "b200" in n:
        return hit("b200", "name says B200 (HGX figures)")
    if re.search(r"\bb100\b", n) or "gb300" in n or "b300" in n:
        return None, f"{desc}: Blackwell variant not in the table; pass --peak-tflops"
    if "h200" in n:
        if "nvl" in n:
            return hit("h200-nvl", "name says H200 NVL")
        return hit("h200", "name says H200 (SXM)")
    if re.search(r"\bh20\b", n):  # 'NVIDIA H20', 'NVIDIA H20-3e', 'NVIDIA H20 NVL16'
        return None, (
            f"{desc}: H20 (export variant) is not in the table: no NVIDIA datasheet with its "
            "peaks could be found to cite; pass --peak-tflops (dense peak for your precision)"
        )
    if "l40s" in n:  # 'NVIDIA L40S'; a plain L40 is a different (slower) part
        return hit("l40s", "name says L40S")
    if "h100" in n or "h800" in n:
        if "h800" in n:
            return None, (
                f"{desc}: H800 (export variant) is not in the table; its tensor peaks "
                "match H100 but pass --peak-tflops to be explicit"
            )
        if "nvl" in n:
            return hit("h100-nvl", "name says H100 NVL")
        if "pcie" in n:
            return hit("h100-pcie", "name says PCIe")
        if "hbm3" in n or "sxm" in n:
            return hit("h100-sxm", "name says HBM3/SXM (the PCIe card has HBM2e)")
        if sms == 132:
            return hit("h100-sxm", "132 SMs = SXM5 (PCIe has 114)")
        if sms == 114:
            return hit("h100-pcie", "114 SMs = PCIe (SXM5 has 132)")
        return None, f"{desc}: H100 variant not recognised from name or SM count; pass --hardware"
    if "a100" in n or "pg509" in n:
        big = mem is not None and mem > 60 * 2**30
        if "80gb" in n.replace(" ", ""):
            big = True
        elif "40gb" in n.replace(" ", ""):
            big = False
        if "pcie" in n:
            key = "a100-pcie-80gb" if big else "a100-pcie-40gb"
            return hit(key, f"name says PCIe, {'80' if big else '40'} GB by memory/name")
        key = "a100" if big else "a100-40gb"
        why = "SXM4 (PG509 board)" if "pg509" in n else "SXM4 (not PCIe by name)"
        return hit(key, f"{why}, {'80' if big else '40'} GB by memory/name")
    if "a800" in n:
        return None, f"{desc}: A800 is not in the table; pass --peak-tflops"
    if "v100" in n:
        if "v100s" in n:
            return hit("v100s-pcie", "name says V100S")
        if "pcie" in n:
            return hit("v100-pcie", "name says PCIe")
        if "dgxs" in n:
            return hit("v100-sxm2", "DGX Station V100 (NVLink module, 80 SMs): SXM2 figures")
        if "sxm3" in n:
            return hit("v100-sxm2", "DGX-2 SXM3 module: SXM2 figures (SXM3 may clock ~4% higher)")
        return hit("v100-sxm2", "name says V100 SXM2" if "sxm2" in n else "V100, assumed SXM2")
    if "2080 ti" in n or "2080ti" in n:
        return hit("rtx-2080-ti", "name says RTX 2080 Ti")
    if (
        re.fullmatch(r"(nvidia( gpu)?)?", n)
        and (major, minor) == (7, 0)
        and sms == 80
        and (mem is None or mem >= 15 * 2**30)
    ):
        # No model in the name (TensorFlow's old xplanes record none): GV100 with 80 SMs and at
        # least 16 GB is a Tesla V100 (a 12 GB TITAN V is left out).
        return hit(
            "v100-sxm2",
            "no device name; 80 SMs with compute capability 7.0 and 16/32 GB is a "
            "Tesla V100: assumed SXM2 (the PCIe and V100S cards have 80 SMs too)",
        )
    if major is not None and major >= 3:
        return None, (
            f"{desc}: NVIDIA GPU not in the hardware table; pass --peak-tflops "
            "(dense tensor-core peak for your precision)"
        )
    return None, f"{desc}: unknown device; pass --hardware NAME or --peak-tflops"


def _detect_amd(n, props, desc, sms, major, minor, mem, hit):
    has_x = "mi250x" in n
    has_plain = bool(re.search(r"mi250(?!x)", n))
    cdna2 = (major, minor) == (9, 0) or major is None  # gfx90a reports 9.0 (so does gfx908)
    # The CU count decides whenever it is one of the two MI250 values: some ROCm versions
    # name every gfx90a device 'AMD Instinct MI250X / MI250', others 'AMD Radeon Graphics'.
    if sms in (104, 110) and (cdna2 or has_x or has_plain):
        if sms == 110:
            return hit("mi250x", "110 CUs per device = one MI250X GCD (MI250 has 104)")
        return hit(
            "mi250",
            "104 CUs per device = one MI250 GCD (MI250X has 110; a single-GCD MI210 has the same per-device figures)",
        )
    if has_x and not has_plain:
        return hit("mi250x", "name says MI250X (per GCD)")
    if has_plain and not has_x:
        return hit("mi250", "name says MI250 (per GCD)")
    if "mi210" in n:
        return hit("mi250", "MI210 = one CDNA2 GCD with 104 CUs: same figures as an MI250 GCD")
    # MI325X: MI300X compute (304 CUs, gfx942) with 256 GiB instead of 192: the name or the memory.
    big_cdna3 = mem is not None and mem > 224 * 2**30 and "mi300" not in n
    if "mi325" in n or (sms == 304 and (major, minor) == (9, 4) and big_cdna3):
        if sms is not None and sms < 304:
            return None, (
                f"{desc}: MI325X with {sms} CUs per device looks like a partition mode "
                f"(e.g. CPX); scale the MI325X peaks by {sms}/304 and pass --peak-tflops"
            )
        return hit(
            "mi325x",
            "name says MI325X"
            if "mi325" in n
            else "304 CUs with gfx94x and more than 224 GiB = MI325X (an MI300X has 192 GiB)",
        )
    if "mi300x" in n or (sms == 304 and (major, minor) == (9, 4)):
        if sms is not None and sms < 304:
            return None, (
                f"{desc}: MI300X with {sms} CUs per device looks like a partition mode "
                f"(e.g. CPX); scale the MI300X peaks by {sms}/304 and pass --peak-tflops"
            )
        return hit("mi300x", "name says MI300X" if "mi300x" in n else "304 CUs with gfx94x = MI300X")
    if "mi300a" in n or (sms == 228 and (major, minor) == (9, 4)):
        return None, f"{desc}: MI300A is not in the table; pass --peak-tflops"
    arch = str(props.get("gcnArchName") or props.get("arch") or "").lower()
    if "mi350" in n or "mi355" in n or "gfx950" in n or "gfx950" in arch or (major, minor) == (9, 5):
        return _detect_cdna4(n, props, desc, sms, hit)
    if (major, minor) == (9, 4) and sms == 38:
        return None, (
            f"{desc}: 38 CUs with gfx94x looks like one MI300X XCD in CPX mode (1/8 of an MI300X); pass --peak-tflops"
        )
    return None, (
        f"{desc}: AMD device not identified (name and CU count match no row); pass --hardware NAME or --peak-tflops"
    )


def _detect_cdna4(n, props, desc, sms, hit):
    """gfx950: MI350X and MI355X share 256 CUs and 288 GB; only the peak engine clock
    (2,200 vs 2,400 MHz) and board power differ. The name decides, else a recorded clock
    rate (XLA profiles carry one, in kHz; Kineto's deviceProperties do not), else MI355X
    is assumed: the higher peak, so MFU is never overstated for want of a name."""
    if sms is not None and sms < 256:
        return None, (
            f"{desc}: gfx950 with {sms} CUs per device looks like a partition mode (e.g. CPX, "
            f"32 CUs); scale the MI355X or MI350X peaks by {sms}/256 and pass --peak-tflops"
        )
    if "mi355" in n:
        return hit("mi355x", "name says MI355X")
    if "mi350" in n:
        return hit("mi350x", "name says MI350X")
    khz = _i(props, "clockRate")
    if khz:
        mhz = khz / 1000
        if mhz > 2300:
            return hit("mi355x", f"gfx950 with a {mhz:.0f} MHz peak clock = MI355X (MI350X peaks at 2200 MHz)")
        return hit("mi350x", f"gfx950 with a {mhz:.0f} MHz peak clock = MI350X (MI355X peaks at 2400 MHz)")
    return hit(
        "mi355x",
        "gfx950 without a model name or clock rate: MI350X and MI355X record the same "
        "CUs and memory; assumed MI355X, the higher peak (pass --hardware mi350x for an "
        "MI350X: its peaks are 2200/2400 of these)",
    )


def detect_many(device_properties: list[dict]) -> tuple[Hardware | None, str]:
    """Detect over all entries of a trace's deviceProperties; they must agree."""
    if not device_properties:
        return None, "trace has no deviceProperties: pass --hardware NAME or --peak-tflops"
    found = [detect(p) for p in device_properties]
    keys = {hw.key if hw else None for hw, _ in found}
    if len(keys) == 1:
        hw, why = found[0]
        n = len(found)
        return hw, why + (f" (all {n} devices)" if n > 1 else "")
    return None, (
        "devices differ: "
        + "; ".join(sorted({w for _, w in found}))
        + " -- pass --hardware for the devices that ran the work"
    )


# --- detection from XLA device types -------------------------------------------------------


def detect_xla(device_type: str) -> tuple[Hardware | None, str]:
    """'TPU v4', 'TPU v5 lite', 'TPU v5e', 'TPU v5p', 'TPU v5', 'TPU v6 lite', 'TPU v6e', ..."""
    raw = (device_type or "").strip()
    if not raw:
        return None, "no XLA device type: pass --hardware NAME or --peak-tflops"
    n = raw.lower()
    compact = _norm(raw)
    if "tpu" not in n and not re.fullmatch(r"v\d+[a-z]*", compact):
        return detect({"name": raw})
    m = re.search(r"v(\d+)\s*([a-z]*)", n)
    if not m:
        return None, f"'{raw}': TPU generation not recognised; pass --hardware or --peak-tflops"
    gen, suffix = m.group(1), m.group(2)
    lite = "lite" in n or suffix in ("e", "lite")
    if gen == "2":
        return None, f"'{raw}': TPU v2 is not in the table; pass --peak-tflops"
    if gen == "3":
        return HARDWARE["tpu-v3"], f"'{raw}' -> tpu-v3 (per TensorCore device)"
    if gen == "4":
        if lite or suffix == "i":
            return None, f"'{raw}': TPU v4 lite/v4i is not in the table; pass --peak-tflops"
        return HARDWARE["tpu-v4"], f"'{raw}' -> tpu-v4"
    if gen == "5":
        if lite:
            return HARDWARE["tpu-v5e"], f"'{raw}' -> tpu-v5e ('v5 lite' is v5e)"
        if suffix == "p" or compact in ("tpuv5", "v5"):
            return HARDWARE["tpu-v5p"], f"'{raw}' -> tpu-v5p ('TPU v5' without 'lite' is v5p)"
    if gen == "6" and lite:
        return HARDWARE["tpu-v6e"], f"'{raw}' -> tpu-v6e ('v6 lite' is Trillium v6e)"
    return None, f"'{raw}': TPU type not in the table; pass --hardware or --peak-tflops"


# --- user-supplied peak -------------------------------------------------------------------


def custom(peak_tflops: float, precision: str) -> Hardware:
    """A row for --peak-tflops (the only way CPUs and unlisted parts are supported)."""
    try:
        value = float(peak_tflops)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--peak-tflops must be a number, got {peak_tflops!r}") from e
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"--peak-tflops must be a positive finite number, got {peak_tflops!r}")
    p = normalize_precision(precision)
    vector = p.startswith("vector_")
    return Hardware(
        name=f"custom ({value:g} TFLOP/s {p})",
        peaks={} if vector else {p: value * T},
        vector_peaks={p: value * T} if vector else {},
        hbm_bytes_per_s=None,
        source="user-supplied --peak-tflops",
        notes="Peak given on the command line; no memory bandwidth known.",
    )
