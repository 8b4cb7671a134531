"""XLA profiles through the whole analysis: the same report as for Kineto traces."""

import pytest

from traceflops.run.load import analyze


def per_step(a, key):
    return a.steps.sort("ts")[key].to_list()


@pytest.fixture
def remat(shared):
    return {v: analyze(str(shared / "xplane" / f"jax_cpu_remat_{v}.xplane.pb")) for v in ("none", "block1", "full")}


def test_remat_variants_keep_forward_and_backward_of_the_plain_program(remat):
    """Fixture facts: with remat, forward and backward FLOPs equal those of the program without
    remat, and recompute FLOPs are the executed dot FLOPs beyond it (1 extra dot for block1, 6 for full)."""
    none = remat["none"]
    for v in ("block1", "full"):
        a = remat[v]
        assert per_step(a, "flops_forward") == per_step(none, "flops_forward")
        assert per_step(a, "flops_backward") == per_step(none, "flops_backward")
        extra = [x - y for x, y in zip(per_step(a, "flops_executed"), per_step(none, "flops_executed"))]
        assert per_step(a, "flops_recompute") == extra and all(e > 0 for e in extra)
    assert per_step(remat["block1"], "count_recompute") == [1, 1, 1]
    assert per_step(remat["full"], "count_recompute") == [6, 6, 6]
    assert per_step(none, "count_forward") == [13, 13, 13] and per_step(none, "count_backward") == [26, 26, 26]


def test_plain_program_flops_match_the_model_by_hand(remat):
    """B=4 T=64 D=128 H=4 F=512 V=256, two blocks: forward dots = per block qkv (3·D·D), out (D·D),
    MLP (2·D·F) as 2·BT·(...) plus attention 2·(2·B·H·T·T·Q) and the LM head 2·BT·D·V."""
    B, T, D, H, F, V, L = 4, 64, 128, 4, 512, 256, 2
    bt, q = B * T, D // H
    per_block = 2 * bt * (4 * D * D + 2 * D * F) + 2 * 2 * B * H * T * T * q
    fwd = L * per_block + 2 * bt * D * V
    none = remat["none"]
    assert per_step(none, "flops_forward") == [fwd] * 3
    assert per_step(none, "flops_backward") == [2 * fwd] * 3


def test_tpu_profile_detects_v6e_and_its_collectives(shared):
    a = analyze(str(shared / "xplane" / "tpu_v6e_inference.xplane.pb"))
    assert a.hardware["name"].startswith("Google TPU v6e")
    assert a.totals["matmul_count"] == {"forward": 0, "backward": 0, "recompute": 0, "optimizer": 0, "other": 0}
    assert (a.kernels["cls"] == "communication").sum() > 0
    assert a.totals["time_us"]["communication_exposed"] + a.totals["overlay_us"]["communication_overlapped"] > 0
