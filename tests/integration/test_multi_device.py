"""One process, several devices (a TPU host's four chips): per device and in total the partition, the idle reasons
and the loss budget agree, and the peak is every device's that ran the program."""

from __future__ import annotations

import polars as pl
import pytest

from traceflops.core.results import ModelOptions
from traceflops.run.load import analyze

TPU = "tpu_v6e_inference.xplane.pb"


def test_a_four_chip_profile_counts_four_devices_and_agrees_per_device(shared):
    a = analyze(str(shared / "xplane" / TPU))
    t = a.totals
    busy = a.kernels.filter(pl.col("dur") > 0)["device"].unique().drop_nulls()
    assert a.hardware["devices"] == busy.len() == 4
    assert sum(t["time_us"].values()) == pytest.approx(t["wall_us"], rel=1e-9)  # a partition of the window, per device
    assert sum(t["idle_us_by_reason"].values()) == pytest.approx(t["time_us"]["idle"], rel=1e-6)
    assert sum(t["loss_budget"].values()) == pytest.approx(1.0, abs=1e-9)
    # per device: each chip's busy time, from its own kernels here (a union per device), against the window
    for dev in busy.to_list():
        k = a.kernels.filter(pl.col("device") == dev).sort("ts")
        end, run = float("-inf"), 0.0
        for ts, dur in k.select("ts", "dur").iter_rows():
            run += max(0.0, ts + dur - max(ts, end))
            end = max(end, ts + dur)
        assert t["wall_us"] - run == pytest.approx(
            float(a.partition.filter(pl.col("device") == dev)["idle"].sum()), rel=1e-6)


def test_hfu_of_a_two_device_step_uses_both_peaks(tmp_path):
    from tests.builders import Builder, shapes

    M, K, N = 48, 80, 24
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 1000)
    for dev, t in ((0, 100), (1, 300)):
        b.device = dev
        b.op("aten::mm", t, 20, **shapes([[M, K], [K, N]]))
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 1, t + 50, 40)
    b.annotation("ProfilerStep#2", 1000, 100)
    b.kernel("void at::native::vectorized_elementwise_kernel<add>", 1001, 1010, 1)  # bounds step 1's window
    a = analyze(b.write(tmp_path / "two.json.gz"), ModelOptions(peak_tflops=1))
    s = a.steps.filter(pl.col("step") == 1).row(0, named=True)
    assert a.hardware["devices"] == 2
    assert s["hfu"] == pytest.approx(2 * (2 * M * K * N) / (s["window"] * 1e-6 * 1e12 * 2), rel=1e-12)
    assert s["time_matmul"] == pytest.approx(40.0)  # each device's 40 µs: the mean per device
