"""A trace cut mid-write: complete steps keep the numbers the whole trace gives them."""

from synth import Builder
from traceflops.analysis import analyze

M, K, N = 48, 80, 24


def two_steps():
    b = Builder()
    kernels = []
    for i in range(2):
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
    # cut inside the last kernel event: step 1 loses one of its kernels
    cut_at = raw.rfind(b'"sm90_xmma_gemm_bf16"')
    (tmp_path / "cut.json").write_bytes(raw[:cut_at])
    a_full, a_cut = analyze(full), analyze(str(tmp_path / "cut.json"))
    assert a_cut.trace.meta["truncated"] and not a_full.trace.meta["truncated"]
    s_full = a_full.steps.filter(a_full.steps["step"] == 0).row(0, named=True)
    s_cut = a_cut.steps.filter(a_cut.steps["step"] == 0).row(0, named=True)
    for k in ("flops_forward", "window", "time_matmul", "count_forward"):
        assert s_cut[k] == s_full[k], k
    assert a_cut.totals["flops"]["forward"] == s_full["flops_forward"]  # step 1 left out
    assert any("step 1 is incomplete" in w for w in a_cut.warnings)
    assert any("cut file" in w or "before its JSON closes" in w for w in a_cut.warnings)
