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
                "rtx-2080-ti"):
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
