"""A trace cut mid-write: complete steps keep the numbers the whole trace gives them."""

from tests.builders import Builder
from traceflops.run.load import analyze

M, K, N = 48, 80, 24


def two_steps():
    b = Builder()
    kernels = []
    for i in range(3):
        t0 = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t0, 900)
        b.op("aten::mm", t0 + 10, 30, **{"Input Dims": [[M, K], [K, N]], "Input type": ["c10::BFloat16"] * 2})
        b.kernel("sm90_xmma_gemm_bf16", t0 + 15, t0 + 100, 200)
        b.op("aten::mm", t0 + 50, 30, **{"Input Dims": [[M, N], [N, K]], "Input type": ["c10::BFloat16"] * 2})
        b.kernel("sm90_xmma_gemm_bf16", t0 + 55, t0 + 300, 200)
    # Kineto writes device activities after all host events
    host = [e for e in b.events if e["cat"] != "kernel"]
    kernels = [e for e in b.events if e["cat"] == "kernel"]
    b.events = host + kernels
    return b


def test_cut_in_the_kernels_keeps_the_complete_step(tmp_path):
    b = two_steps()
    full = b.write(tmp_path / "full.json", gz=False)
    raw = open(full, "rb").read()
    # cut inside the last kernel event: step 2 loses its last kernel
    cut_at = raw.rfind(b'"sm90_xmma_gemm_bf16"')
    (tmp_path / "cut.json").write_bytes(raw[:cut_at])
    a_full, a_cut = analyze(full), analyze(str(tmp_path / "cut.json"))
    assert a_cut.trace.meta["truncated"] and not a_full.trace.meta["truncated"]
    s_full = a_full.steps.filter(a_full.steps["step"] == 0).row(0, named=True)
    s_cut = a_cut.steps.filter(a_cut.steps["step"] == 0).row(0, named=True)
    for k in ("flops_forward", "window", "time_matmul", "count_forward"):
        assert s_cut[k] == s_full[k], k
    # step 2 lost a kernel; step 1 still ends at step 2's first device activity, which survived
    assert a_cut.steps["step"].to_list() == [0, 1]
    assert a_cut.totals["flops"]["forward"] == 2 * s_full["flops_forward"]
    assert any("step 2 is incomplete" in w for w in a_cut.warnings)
    assert any("cut file" in w or "before its JSON closes" in w for w in a_cut.warnings)


STEP_KEYS = ("flops_forward", "flops_backward", "flops_recompute", "flops_optimizer", "flops_other",
             "count_forward", "count_backward", "count_recompute", "window", "start",
             "time_matmul", "time_other_compute", "time_memcpy", "time_communication_exposed", "time_idle")


def test_a100_ddp_cut_at_several_offsets_reports_only_exact_steps(shared, tmp_path):
    """Every step a cut file reports is complete and has exactly the whole file's numbers."""
    import gzip

    import pytest

    raw = gzip.open(shared / "kineto" / "a100_ddp_resnet_rank0.json.gz").read()
    full = analyze(str(shared / "kineto" / "a100_ddp_resnet_rank0.json.gz"))
    want = {r["step"]: r for r in full.steps.iter_rows(named=True)}
    reported_any = 0
    # cuts inside the events, and one in the top-level fields written after them (every event kept)
    for cut in [int(len(raw) * f) for f in (0.35, 0.55, 0.7, 0.8, 0.9, 0.95, 0.99)] + [len(raw) - 60]:
        p = tmp_path / f"cut{cut}.json"
        p.write_bytes(raw[:cut])
        a = analyze(str(p))
        assert any("before its JSON closes" in w for w in a.warnings)
        for r in a.steps.iter_rows(named=True):
            reported_any += 1
            for k in STEP_KEYS:
                assert r[k] == pytest.approx(want[r["step"]][k], rel=1e-12, abs=1e-9), (cut, r["step"], k)
        left_out = set(want) - {r["step"] for r in a.steps.iter_rows(named=True)}
        assert all(any(f"step {s}" in w for w in a.warnings) for s in left_out), (cut, left_out, a.warnings)
    # this trace writes some device activity of every step near its end, so a cut inside the
    # events leaves every step incomplete; the cut after the events keeps all three
    assert reported_any == 3
