"""JAX (XLA:CPU) profiles of fixtures/jax/ against the truth the generator took from the
compiled HLO (fixtures/generate_jax.py, fixtures/jax/README.md); committed files only."""

import json

import pytest

from tests.builders import ROOT
from traceflops.run.load import analyze

JAX = ROOT / "fixtures" / "jax"
TRUTH = json.loads((JAX / "truth.json").read_text())
VARIANTS = ("none", "remat_block1", "remat_full", "scan_remat")

def per_step(a, key):
    return a.steps.sort("ts")[key].to_list()


@pytest.fixture(scope="module")
def runs():
    return {v: analyze(str(JAX / f"{v}.xplane.pb")) for v in VARIANTS}


def test_truth_is_consistent():
    """The generator's HLO count of the plain program equals the hand formula from the dims."""
    m = TRUTH["_meta"]
    d = m["dims"]
    B, T, D, H, F, V, L = (d[k] for k in "BTDHFVL")
    bt, q = B * T, D // H
    fwd = L * (2 * bt * (4 * D * D + 2 * D * F) + 2 * 2 * B * H * T * T * q) + 2 * bt * D * V
    for v in VARIANTS:
        t = TRUTH["variants"][v]
        assert t["per_step"]["forward"] == fwd and t["per_step"]["backward"] == 2 * fwd
        assert t["per_step"]["executed"] == fwd * 3 + t["per_step"]["recompute"]
        assert (JAX / f"{v}.xplane.pb").stat().st_size < 2 << 20


@pytest.mark.parametrize("variant", [
    "none",
    "remat_block1",
    "remat_full",
    "scan_remat",
])
def test_phase_flops_equal_the_hlo_truth(runs, variant):
    a, t = runs[variant], TRUTH["variants"][variant]["per_step"]
    n = TRUTH["_meta"]["steps"]
    assert per_step(a, "flops_forward") == [t["forward"]] * n
    assert per_step(a, "flops_backward") == [t["backward"]] * n
    assert per_step(a, "flops_recompute") == [t["recompute"]] * n
    assert per_step(a, "count_forward") == [t["forward_dots"]] * n
    assert per_step(a, "count_backward") == [t["backward_dots"]] * n
    assert per_step(a, "count_recompute") == [t["recompute_dots"]] * n


@pytest.mark.parametrize("variant", VARIANTS)
def test_executed_dot_flops_equal_the_hlo_truth(runs, variant):
    """Phase-independent: every executed dot is seen once per execution (scan: once per layer),
    with XLA's 2·(output elements)·(contracted size), the generator's convention."""
    a, t = runs[variant], TRUTH["variants"][variant]["per_step"]
    n = TRUTH["_meta"]["steps"]
    assert per_step(a, "flops_executed") == [t["executed"]] * n
    total = [sum(x) for x in zip(*(per_step(a, f"count_{p}") for p in ("forward", "backward", "recompute", "optimizer", "other")))]
    assert total == [t["executed_dots"]] * n


def test_te_fused_attention_gets_sdpa_flops(shared):
    """gfx950 JAX + Transformer Engine: qkv packed [B=2, S=2048, 3, H=16, D=128] (bf16), output
    [2, 2048, 16, 128], backend config mask_type = 2 (causal). Dense, as FlopCounterMode counts
    SDPA: forward 4·B·H·S·S·D, backward 2.5×, of which its in-kernel Q·Kᵀ recompute 2·B·H·S·S·D
    is recompute (in HFU, not in MFU), as a flash backward's is on PyTorch traces."""
    a = analyze(str(shared / "xplane" / "gfx950_jax_te_fused_attn_train.xplane.pb"))
    B, S, H, D = 2, 2048, 16, 128
    fwd = 4 * B * H * S * S * D
    ops = a.ops.filter(a.ops["name"].str.starts_with("te_fused_attn_"))
    assert ops.height > 0
    score = 2 * B * H * S * S * D
    for name, phase, flops, rec, mask in ops.select("name", "phase", "flops", "recompute_flops", "mask").iter_rows():
        if name.startswith("te_fused_attn_forward"):
            assert (phase, flops, rec, mask) == ("forward", fwd, 0, "causal")
        else:
            assert (phase, flops, rec, mask) == ("backward", 5 * fwd // 2, score, "causal")
    assert not [w for w in a.warnings if "fused attention" in w]
    # The recompute leaves the backward and its share of model FLOPs; executed FLOPs stay whole.
    n_bwd = ops.filter(ops["name"].str.starts_with("te_fused_attn_backward")).height
    others = a.ops.filter(a.ops["matmul"] & a.ops["ran"] & ~a.ops["name"].str.starts_with("te_fused_attn_"))
    assert a.totals["flops"]["recompute"] == n_bwd * score + int(others.filter(others["phase"] == "recompute")["flops"].sum())
    assert a.totals["flops"]["executed"] == int(a.ops.filter(a.ops["matmul"] & a.ops["ran"])["flops"].sum())

    from traceflops.core.trace import Warnings
    from traceflops.parsers.xla import decode_hlo_proto, decode_xspace
    from traceflops.parsers.xla import hlo_facts as X

    p = shared / "xplane" / "gfx950_jax_te_fused_attn_train.xplane.pb"
    progs = X.Programs(decode_xspace(p.read_bytes()), Warnings(), str(p))
    seen = 0
    for raw in progs.raw.values():
        mf = X.ModuleFacts(decode_hlo_proto(raw))
        for c in mf.module.computations:
            for ins in c.instructions:
                if ins.opcode == "custom-call" and ins.custom_call_target.startswith("te_fused_attn_"):
                    got = mf.te_attention(ins)
                    fl, rec, mask = got.flops, got.recompute, got.mask
                    bwd = "backward" in ins.custom_call_target
                    assert (fl, rec, mask) == ((5 * fwd // 2, fwd // 2, "causal") if bwd else (fwd, 0, "causal"))
                    seen += 1
    assert seen == 4
