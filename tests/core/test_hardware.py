"""Hardware table: dense-not-sparse facts, detection on real trace deviceProperties."""

from __future__ import annotations

import gzip
import json
import struct

import pytest

from tests.builders import shared_fixtures
from traceflops.core.hardware import (
    HARDWARE,
    PRECISIONS,
    VECTOR_KEYS,
    custom,
    detect,
    detect_many,
    detect_xla,
    lookup,
)

TF = 1e12


KINETO = shared_fixtures() / "kineto"
XPLANE = shared_fixtures() / "xplane"


# --- the facts that must hold -------------------------------------------------------------

def test_h100_sxm_bf16_is_dense_989_not_sparse():
    bf16 = HARDWARE["h100-sxm"].peak("bf16")
    assert bf16 == pytest.approx(989e12, abs=1e12)
    # the datasheet's with-sparsity (1,979) and fp8-with-sparsity (3,958) figures are not it
    assert bf16 < 1.5e15
    assert HARDWARE["h100-sxm"].peak("fp8") == pytest.approx(1979e12, abs=1e12)


def test_a100_bf16_312():
    for key in ("a100", "a100-40gb", "a100-pcie-80gb", "a100-pcie-40gb"):
        assert HARDWARE[key].peak("bf16") == 312e12
        assert HARDWARE[key].peak("tf32") == 156e12  # dense (312 is with sparsity)
    # 40 GB and 80 GB: same compute, different HBM
    assert HARDWARE["a100"].hbm_bytes_per_s > HARDWARE["a100-40gb"].hbm_bytes_per_s


def test_palm_tpu_v4_275():
    assert HARDWARE["tpu-v4"].peak("bf16") == 275e12


def test_h200_same_compute_as_h100_sxm_more_bandwidth():
    assert HARDWARE["h200"].peaks == HARDWARE["h100-sxm"].peaks
    assert HARDWARE["h200"].hbm_bytes_per_s == pytest.approx(4.8e12)
    assert HARDWARE["h100-sxm"].hbm_bytes_per_s == pytest.approx(3.35e12)


def test_mi250x_and_mi250_are_per_gcd():
    # card peaks 383.0 / 362.1 TFLOP/s fp16-bf16; a visible device is one GCD = half
    assert HARDWARE["mi250x"].peak("bf16") == pytest.approx(383.0e12 / 2)
    assert HARDWARE["mi250"].peak("bf16") == pytest.approx(362.1e12 / 2)
    assert HARDWARE["mi250x"].compute_units == 110
    assert HARDWARE["mi250"].compute_units == 104
    # cross-check: CUs x 1024 FLOP/clk/CU (fp16 matrix) x 1.7 GHz
    for key in ("mi250x", "mi250"):
        hw = HARDWARE[key]
        assert hw.peak("fp16") == pytest.approx(hw.compute_units * 1024 * 1.7e9, rel=2e-3)


def test_mi300x_dense():
    hw = HARDWARE["mi300x"]
    assert hw.peak("bf16") == pytest.approx(1307.4e12)
    # 304 CUs x 2048 FLOP/clk/CU x 2.1 GHz
    assert hw.peak("bf16") == pytest.approx(304 * 2048 * 2.1e9, rel=1e-3)
    assert hw.peak("fp8") == pytest.approx(2 * hw.peak("bf16"), rel=1e-3)


def test_mi325x_is_mi300x_compute_with_more_hbm():
    # AMD MI325X spec: peak FP16/BF16 1,307.4 TFLOPS, FP8 2,614.9, TF32 653.7, FP32 163.4 (dense;
    # 2,614.9 / 5,229.8 with structured sparsity); 256 GB HBM3E at 6 TB/s. ROCm 'AMD GPU
    # specifications': 304 CUs (38 per XCD), gfx942, 256 GiB.
    hw = HARDWARE["mi325x"]
    assert hw.peak("bf16") == pytest.approx(1307.4e12)
    assert hw.peak("fp16") == pytest.approx(1307.4e12)
    assert hw.peak("fp8") == pytest.approx(2614.9e12)
    assert hw.peak("tf32") == pytest.approx(653.7e12)
    assert hw.peak("fp32") == pytest.approx(163.4e12)
    assert hw.hbm_bytes_per_s == pytest.approx(6e12)
    assert hw.compute_units == 304
    # the same CDNA 3 compute as MI300X: 304 CUs x 2048 FLOP/clk/CU (bf16) x 2.1 GHz
    assert hw.peak("bf16") == pytest.approx(304 * 2048 * 2.1e9, rel=1e-3)
    assert hw.peaks == HARDWARE["mi300x"].peaks
    assert hw.hbm_bytes_per_s > HARDWARE["mi300x"].hbm_bytes_per_s


def test_mi355x_and_mi350x_dense_cdna4():
    # AMD: MI355X up to 10 petaFLOPS MXFP4/MXFP6 (AMD technical article 'InferenceMAX'), FP8 5 PF,
    # FP16/BF16 2.5 PF, FP32 157.3 TFLOPS, INT8 5 POPS, 288 GB HBM3E at 8 TB/s; ROCm 'AMD GPU
    # specifications': 256 CUs (32 per XCD), gfx950; peak engine clock 2,400 MHz (MI355X) and
    # 2,200 MHz (MI350X, 1,000 W); CDNA 4 has no TF32 GEMM (ROCm Compute Profiler).
    hw = HARDWARE["mi355x"]
    assert hw.peak("fp4") == pytest.approx(10e15, rel=0.01)
    assert hw.peak("fp8") == pytest.approx(5e15, rel=0.01)
    assert hw.peak("bf16") == pytest.approx(2.5e15, rel=0.01)
    assert hw.peak("fp16") == hw.peak("bf16")
    assert hw.peak("int8") == pytest.approx(5e15, rel=0.01)
    assert hw.peak("fp32") == pytest.approx(157.3e12)
    assert hw.peak("tf32") is None
    assert hw.hbm_bytes_per_s == pytest.approx(8e12)
    assert hw.compute_units == 256
    # ISSCC 2026 (AMD): 8,192 FP8 FLOP per clock per CU, 256 CUs, 2.4 GHz
    assert hw.peak("fp8") == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert hw.peak("bf16") == pytest.approx(hw.peak("fp8") / 2, rel=1e-4)
    assert hw.peak("fp4") == pytest.approx(hw.peak("fp8") * 2, rel=1e-4)
    # MI350X: the same silicon at 2,200 MHz; AMD rounds its peaks to 2.3 / 4.6 / 9.2 PFLOP/s
    lo = HARDWARE["mi350x"]
    for p in ("fp64", "fp32", "bf16", "fp16", "fp8", "int8", "fp4"):
        assert lo.peak(p) == pytest.approx(hw.peak(p) * 2200 / 2400, rel=1e-3), p
    assert lo.peak("bf16") == pytest.approx(2.3e15, rel=0.01)
    assert lo.peak("fp8") == pytest.approx(4.6e15, rel=0.01)
    assert lo.peak("fp4") == pytest.approx(9.2e15, rel=0.01)
    assert lo.hbm_bytes_per_s == hw.hbm_bytes_per_s and lo.compute_units == 256


def test_gh200_gpu_is_h100_sxm_compute():
    # NVIDIA GH200 datasheet (per GPU): FP64 Tensor 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958*
    # TFLOPS (* with sparsity: dense is half); 96 GB HBM3 at 4 TB/s or 144 GB HBM3e at 4.9 TB/s.
    for key, tbps in (("gh200", 4.0), ("gh200-144gb", 4.9)):
        hw = HARDWARE[key]
        assert hw.peak("bf16") == pytest.approx(1979e12 / 2, abs=1e12)
        assert hw.peak("fp8") == pytest.approx(3958e12 / 2, abs=1e12)
        assert hw.peak("tf32") == pytest.approx(989e12 / 2, abs=1e12)
        assert hw.peak("fp64") == pytest.approx(67e12, abs=0.5e12)
        assert hw.hbm_bytes_per_s == pytest.approx(tbps * 1e12)
        assert hw.compute_units == 132
        assert hw.peaks == HARDWARE["h100-sxm"].peaks


def test_l40s_dense_not_sparse():
    # NVIDIA L40S datasheet, 'dense | with sparsity': TF32 183 | 366, BF16 and FP16 362.05 | 733,
    # FP8 733 | 1,466 TFLOPS; FP32 91.6 TFLOPS; 48 GB GDDR6, 864 GB/s; 142 RT cores (one per SM).
    hw = HARDWARE["l40s"]
    assert hw.peak("bf16") == pytest.approx(362.05e12)
    assert hw.peak("fp16") == pytest.approx(362.05e12)
    assert hw.peak("tf32") == pytest.approx(183e12)
    assert hw.peak("fp8") == pytest.approx(733e12)
    assert hw.peak("fp32") == pytest.approx(91.6e12)
    assert hw.hbm_bytes_per_s == pytest.approx(864e9)
    assert hw.compute_units == 142
    assert hw.peak("fp64") is None  # the datasheet gives none: not made up


def test_new_rows_cite_their_vendor():
    vendor = {"mi325x": "amd.com", "mi355x": "amd.com", "mi350x": "amd.com", "gh200": "nvidia.com",
              "gh200-144gb": "nvidia.com", "l40s": "nvidia.com"}
    for key, domain in vendor.items():
        assert domain in HARDWARE[key].source, key


def test_tpus():
    assert HARDWARE["tpu-v5e"].peak("bf16") == 197e12
    assert HARDWARE["tpu-v5p"].peak("bf16") == 459e12
    assert HARDWARE["tpu-v6e"].peak("bf16") == 918e12
    assert HARDWARE["tpu-v4"].peak("fp32") is None  # not published: no made-up fp32 rate


def test_table_is_well_formed():
    for key, hw in HARDWARE.items():
        assert hw.key == key
        assert "http" in hw.source, key
        assert set(hw.peaks) <= set(PRECISIONS), key
        assert set(hw.vector_peaks) <= set(VECTOR_KEYS), key
        assert hw.peaks, key
        for v in (*hw.peaks.values(), *hw.vector_peaks.values()):
            assert 1e12 <= v <= 2e16, (key, v)
        assert hw.hbm_bytes_per_s is None or 1e11 < hw.hbm_bytes_per_s < 2e13
        # tensor rates never below the vector rate of the same precision
        for p in ("fp32", "fp16", "bf16", "fp64"):
            if hw.peak(p) and hw.peak("vector_" + p):
                assert hw.peak(p) >= hw.peak("vector_" + p), (key, p)
        # low precision never slower than bf16 on the same part (dense vs dense)
        if hw.peak("bf16") and hw.peak("fp8"):
            assert hw.peak("fp8") >= hw.peak("bf16")


def test_required_rows_present():
    for key in ("v100-sxm2", "v100-pcie", "a100", "a100-40gb", "h100-sxm", "h100-pcie", "h200",
                "b200", "mi250", "mi250x", "mi300x", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
                "rtx-2080-ti", "mi325x", "mi350x", "mi355x", "gh200", "gh200-144gb", "l40s"):
        assert key in HARDWARE


def test_peak_precision_aliases():
    hw = HARDWARE["h100-sxm"]
    assert hw.peak("bfloat16") == hw.peak("bf16") == hw.peak("torch.bfloat16")
    assert hw.peak("float16") == hw.peak("fp16")
    assert hw.peak("vector_fp32") == pytest.approx(66.9e12)
    assert hw.peak("vector fp32") == hw.peak("vector_fp32")
    assert HARDWARE["v100-sxm2"].peak("bf16") is None  # no bf16 tensor cores on Volta
    assert hw.peak("nonsense") is None


# --- lookup / custom ------------------------------------------------------------------------

@pytest.mark.parametrize("name,key", [
    ("H100", "h100-sxm"), ("h100_sxm", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("h100 pcie", "h100-pcie"), ("NVIDIA H100 PCIe", "h100-pcie"), ("A100", "a100"),
    ("MI250X", "mi250x"), ("mi250", "mi250"), ("TPU v4", "tpu-v4"), ("tpu v5 lite", "tpu-v5e"),
    ("v6e", "tpu-v6e"), ("Trillium", "tpu-v6e"), ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("B200", "b200"), ("rtx 2080 ti", "rtx-2080-ti"),
    ("MI325X", "mi325x"), ("AMD Instinct MI325X", "mi325x"), ("mi355x", "mi355x"),
    ("AMD Instinct MI355X", "mi355x"), ("MI350X", "mi350x"), ("AMD Instinct MI350X", "mi350x"),
    ("GH200", "gh200"), ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA GH200 120GB", "gh200"),
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb"), ("L40S", "l40s"), ("NVIDIA L40S", "l40s"),
])
def test_lookup(name, key):
    hw = lookup(name)
    assert hw is not None and hw.key == key


def test_lookup_unknown():
    assert lookup("Some CPU") is None
    assert lookup("") is None


def test_custom():
    hw = custom(1.5, "fp32")
    assert hw.peak("fp32") == 1.5e12
    assert hw.hbm_bytes_per_s is None
    assert custom(100, "bfloat16").peak("bf16") == 100e12
    for bad in (0, -1, float("nan"), "abc"):
        with pytest.raises(ValueError):
            custom(bad, "bf16")


# --- detect(): synthetic entries ------------------------------------------------------------

def _amd(name, cus, major=9, minor=0, mem=64 * 2**30):
    return {"name": name, "numSms": cus, "computeMajor": major, "computeMinor": minor,
            "totalGlobalMem": mem, "warpSize": 64}


def test_mi250_vs_mi250x_by_cu_count():
    assert detect(_amd("AMD Radeon Graphics", 104))[0].key == "mi250"
    assert detect(_amd("AMD Radeon Graphics", 110))[0].key == "mi250x"
    # some ROCm versions give every gfx90a the same combined name: CUs decide
    assert detect(_amd("AMD Instinct MI250X / MI250", 104))[0].key == "mi250"
    assert detect(_amd("AMD Instinct MI250X / MI250", 110))[0].key == "mi250x"
    hw, why = detect(_amd("AMD Radeon Graphics", 110))
    assert "110" in why


def test_mi300x_by_name_or_cus():
    assert detect(_amd("AMD Instinct MI300X", 304, 9, 4))[0].key == "mi300x"
    assert detect(_amd("AMD Radeon Graphics", 304, 9, 4))[0].key == "mi300x"
    hw, why = detect(_amd("AMD Radeon Graphics", 38, 9, 4))  # CPX partition
    assert hw is None and "CPX" in why


def test_mi325x_by_name_or_memory():
    # rocminfo 'Marketing Name: AMD Instinct MI325X' (gfx942), the name HIP reports; ROCm: 256 GiB
    assert detect(_amd("AMD Instinct MI325X", 304, 9, 4, 256 * 2**30))[0].key == "mi325x"
    assert detect(_amd("AMD Radeon Graphics", 304, 9, 4, 256 * 2**30))[0].key == "mi325x"
    # an MI300X (192 GiB, as the MI300X fixtures record) stays an MI300X
    assert detect(_amd("AMD Radeon Graphics", 304, 9, 4, 192 * 2**30))[0].key == "mi300x"
    assert detect(_amd("AMD Instinct MI300X", 304, 9, 4, 192 * 2**30))[0].key == "mi300x"


def test_gfx950_mi355x_vs_mi350x():
    # rocminfo 'Marketing Name: AMD Instinct MI355X' / 'AMD Instinct MI350X' (gfx950); some ROCm
    # versions name it 'AMD Radeon Graphics'. 256 CUs and 288 GiB on both.
    mem = 288 * 2**30
    assert detect(_amd("AMD Instinct MI355X", 256, 9, 5, mem))[0].key == "mi355x"
    assert detect(_amd("AMD Instinct MI350X", 256, 9, 5, mem))[0].key == "mi350x"
    # an XLA profile records the peak engine clock (kHz): 2,400 MHz MI355X, 2,200 MHz MI350X
    hw, why = detect({**_amd("AMD GPU", 256, 9, 5, mem), "clockRate": 2400000})
    assert hw.key == "mi355x" and "2400 MHz" in why and "assumed" not in why
    assert detect({**_amd("AMD GPU", 256, 9, 5, mem), "clockRate": 2200000})[0].key == "mi350x"
    # nothing tells them apart: MI355X (the higher peak) is assumed, and the answer says so
    hw, why = detect(_amd("AMD Radeon Graphics", 256, 9, 5, mem))
    assert hw.key == "mi355x" and "assumed MI355X" in why
    # the arch string alone is enough to know it is CDNA 4
    assert detect({"name": "", "numSms": 256, "gcnArchName": "gfx950:sramecc+:xnack-"})[0].key == "mi355x"
    # a CPX partition (32 CUs per device) is not a whole GPU
    hw, why = detect(_amd("AMD Radeon Graphics", 32, 9, 5, mem // 8))
    assert hw is None and "partition" in why and "--peak-tflops" in why


def test_gh200_variants_by_name_or_memory():
    # Device names as NVIDIA's driver lists them (open-gpu-kernel-modules README): 'NVIDIA GH200
    # 480GB', 'NVIDIA GH200 120GB' (device 2342) and 'NVIDIA GH200 144G HBM3e' (device 2348).
    base = {"computeMajor": 9, "computeMinor": 0, "numSms": 132}
    assert detect({**base, "name": "NVIDIA GH200 480GB"})[0].key == "gh200"
    assert detect({**base, "name": "NVIDIA GH200 120GB"})[0].key == "gh200"
    # total_memory 153008209920 bytes is what PyTorch reports on a 'GH200 144G HBM3e'
    hw, why = detect({**base, "name": "NVIDIA GH200 144G HBM3e", "totalGlobalMem": 153008209920})
    assert hw.key == "gh200-144gb", why
    assert detect({**base, "name": "NVIDIA GH200", "totalGlobalMem": 153008209920})[0].key == "gh200-144gb"
    hw, why = detect({**base, "name": "NVIDIA GH200"})
    assert hw.key == "gh200" and "assumed" in why
    # JAX's device_kind on a GH200 (seen as 'NVIDIA GH200 480GB') goes through detect_xla
    assert detect_xla("NVIDIA GH200 480GB")[0].key == "gh200"


def test_l40s_and_h20():
    # 'NVIDIA L40S', 'NVIDIA L40', 'NVIDIA H20', 'NVIDIA H20-3e': NVIDIA driver README spellings
    assert detect({"name": "NVIDIA L40S", "numSms": 142, "computeMajor": 8, "computeMinor": 9})[0].key == "l40s"
    assert detect_xla("NVIDIA L40S")[0].key == "l40s"
    l40 = {"name": "NVIDIA L40", "numSms": 142, "computeMajor": 8, "computeMinor": 9}
    assert detect(l40)[0] is None  # the L40 is slower than the L40S: not mapped to it
    for name in ("NVIDIA H20", "NVIDIA H20-3e"):
        hw, why = detect({"name": name, "computeMajor": 9, "computeMinor": 0})
        assert hw is None and "H20" in why and "--peak-tflops" in why
    assert detect({"name": "NVIDIA H200", "numSms": 132})[0].key == "h200"  # 'h20' is not 'h200'


def test_v100_without_a_name():
    # TensorFlow's 2020 xplane (v100_tf_multiworker) records no name: 80 SMs, cc 7.0, 16945512448
    # bytes. Volta whitepaper / V100 datasheet: Tesla V100 = GV100 with 80 SMs, 16 or 32 GB.
    props = {"name": "", "numSms": 80, "computeMajor": 7, "computeMinor": 0, "totalGlobalMem": 16945512448}
    hw, why = detect(props)
    assert hw.key == "v100-sxm2" and "assumed SXM2" in why
    assert detect({k: v for k, v in props.items() if k != "name"})[0].key == "v100-sxm2"
    # a 12 GB GV100 (TITAN V) is not a Tesla V100
    assert detect({**props, "totalGlobalMem": 12 * 2**30})[0] is None


def test_h100_sxm_vs_pcie():
    base = {"computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 80 * 2**30}
    assert detect({**base, "name": "NVIDIA H100 80GB HBM3", "numSms": 132})[0].key == "h100-sxm"
    assert detect({**base, "name": "NVIDIA H100 PCIe", "numSms": 114})[0].key == "h100-pcie"
    assert detect({**base, "name": "NVIDIA H100", "numSms": 132})[0].key == "h100-sxm"
    assert detect({**base, "name": "NVIDIA H100", "numSms": 114})[0].key == "h100-pcie"
    assert detect({**base, "name": "NVIDIA H100 NVL", "numSms": 132})[0].key == "h100-nvl"


def test_a100_memory_variants():
    base = {"computeMajor": 8, "computeMinor": 0, "numSms": 108}
    assert detect({**base, "name": "NVIDIA A100-SXM4-80GB"})[0].key == "a100"
    assert detect({**base, "name": "NVIDIA A100-SXM4-40GB"})[0].key == "a100-40gb"
    assert detect({**base, "name": "NVIDIA A100 80GB PCIe"})[0].key == "a100-pcie-80gb"
    assert detect({**base, "name": "NVIDIA A100-PG509-200",
                   "totalGlobalMem": 42297524224})[0].key == "a100-40gb"


def test_unknown_devices_explain():
    for props in ({"name": "NVIDIA L4", "computeMajor": 8, "computeMinor": 9, "numSms": 58},
                  {"name": "AMD Instinct MI300A", "numSms": 228, "computeMajor": 9,
                   "computeMinor": 4, "warpSize": 64},
                  {}, {"name": ""}):
        hw, why = detect(props)
        assert hw is None
        assert "--peak-tflops" in why or "--hardware" in why


def test_detect_many_heterogeneous():
    a = {"name": "NVIDIA H100 80GB HBM3", "numSms": 132}
    b = {"name": "NVIDIA A100-SXM4-80GB", "numSms": 108}
    assert detect_many([a, a])[0].key == "h100-sxm"
    hw, why = detect_many([a, b])
    assert hw is None and "differ" in why


@pytest.mark.parametrize("device_type,key", [
    ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"),
    ("TPU v6 lite", "tpu-v6e"), ("TPU v6e", "tpu-v6e"), ("TPU v5p", "tpu-v5p"),
    ("TPU v5", "tpu-v5p"), ("TPU v3", "tpu-v3"),
])
def test_detect_xla(device_type, key):
    hw, why = detect_xla(device_type)
    assert hw is not None and hw.key == key, why


def test_detect_xla_unknown():
    for t in ("TPU v2", "TPU v7x", ""):
        hw, why = detect_xla(t)
        assert hw is None and why


# --- detect(): every deviceProperties entry in the real fixture traces -----------------------

def _kineto_files():
    if not KINETO.is_dir():
        return []
    return sorted(KINETO.rglob("*.json.gz"))


_EXPECTED = {
    "a100_ddp_resnet_rank0": "a100-40gb",  # 'NVIDIA A100-PG509-200', 39.4 GiB
    "a100_torchrec_rank3": "a100-40gb",
    "b200_inference_rank0": "b200",
    "h100_qwen_inference": "h100-sxm",  # 'NVIDIA H100 80GB HBM3', 132 SMs
    "mi250_toy_train": "mi250",  # 'AMD Radeon Graphics', 104 CUs
    "mi300_resnet_act_checkpoint_rank0": "mi300x",
    "rtx2080ti_linear_train": "rtx-2080-ti",
    "v100_resnet50_legacy2021": "v100-sxm2",  # 'Tesla V100-DGXS-32GB'
    "v100_transformer_rank1": "v100-sxm2",
    "rank0": "v100-sxm2", "rank1": "v100-sxm2", "rank2": "v100-sxm2", "rank3": "v100-sxm2",
    "rank4": "v100-sxm2", "rank5": "v100-sxm2", "rank6": "v100-sxm2", "rank7": "v100-sxm2",
}


@pytest.mark.skipif(not KINETO.is_dir(), reason=f"fixture folder {KINETO} is absent "
                    "(set TRACEFLOPS_FIXTURES to the shared fixtures folder)")
@pytest.mark.parametrize("path", _kineto_files(), ids=lambda p: p.name)
def test_detect_fixture_device_properties(path):
    with gzip.open(path) as f:
        props = json.load(f).get("deviceProperties")
    if not props:
        hw, why = detect_many(props or [])
        assert hw is None and why
        return
    for entry in props:
        hw, why = detect(entry)
        assert why, "every answer carries an explanation"
        assert hw is not None or "--peak-tflops" in why or "--hardware" in why
    hw, why = detect_many(props)
    stem = path.name.removesuffix(".json.gz")
    if stem in _EXPECTED:
        assert hw is not None and hw.key == _EXPECTED[stem], why


@pytest.mark.skipif(not (XPLANE / "tpu_v6e_inference.xplane.pb").is_file(),
                    reason=f"{XPLANE / 'tpu_v6e_inference.xplane.pb'} is absent")
def test_tpu_v6e_xplane_agrees_with_table():
    data = (XPLANE / "tpu_v6e_inference.xplane.pb").read_bytes()
    assert b"TPU v6 Lite" in data
    hw, why = detect_xla("TPU v6 Lite")
    assert hw is not None and hw.key == "tpu-v6e", why
    # the profile's own device stat peak_teraflops_per_second is the double 918.0
    assert struct.pack("<d", hw.peak("bf16") / TF) in data


@pytest.mark.skipif(not (XPLANE / "gfx950_jax_te_fused_attn_train.xplane.pb").is_file(),
                    reason=f"{XPLANE / 'gfx950_jax_te_fused_attn_train.xplane.pb'} is absent")
def test_gfx950_xplane_is_an_mi355x_by_its_clock():
    from traceflops.parsers.xla import parse_xplane
    from traceflops.run.load import analyze

    path = XPLANE / "gfx950_jax_te_fused_attn_train.xplane.pb"
    props = parse_xplane(str(path)).meta["device_properties"][0]
    # what the profile records: 256 CUs, gfx 9.5, 288 GiB, a 2.4 GHz clock
    assert (props["numSms"], props["computeMajor"], props["computeMinor"]) == (256, 9, 5)
    hw, why = detect(props)
    assert hw is not None and hw.key == "mi355x", why
    assert "assumed" not in why
    a = analyze(str(path))
    assert a.hardware["name"] == "AMD Instinct MI355X"
    assert a.hardware["peak_flops"] == pytest.approx(2.5e15, rel=0.01)  # bf16, AMD's 2.5 PF
    assert a.totals["mfu"] is not None and 0 < a.totals["mfu"] < 1
    assert not [w for w in a.warnings if w.startswith("hardware")]


@pytest.mark.skipif(not (XPLANE / "v100_tf_multiworker.xplane.pb").is_file(),
                    reason=f"{XPLANE / 'v100_tf_multiworker.xplane.pb'} is absent")
def test_nameless_v100_xplane_is_recognised_and_says_what_it_assumed():
    from traceflops.run.load import analyze

    a = analyze(str(XPLANE / "v100_tf_multiworker.xplane.pb"))
    assert a.hardware["name"] == HARDWARE["v100-sxm2"].name
    assert [w for w in a.warnings if w.startswith("hardware variant assumed") and "SXM2" in w]
