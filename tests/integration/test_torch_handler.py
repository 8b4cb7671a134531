"""The live-profiling handler: a real torch.profiler cycle, written and analysed as it ends."""

import pytest

torch = pytest.importorskip("torch", reason="live profiling needs torch (pip install torch==2.13.0)")

from traceflops.torch_handler import on_trace_ready  # noqa: E402

M, K, N = 24, 40, 56


def test_handler_writes_and_analyses_each_cycle(tmp_path, capsys):
    got = []
    w = torch.randn(K, N)
    x = torch.randn(M, K)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    handler = on_trace_ready(tmp_path, peak_tflops=0.1, callback=got.append)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=sched, on_trace_ready=handler) as prof:
        for _ in range(4):
            torch.mm(x, w)
            prof.step()
    files = list(tmp_path.glob("trace_step*.json.gz"))
    assert len(files) == 1
    (a,) = got
    # two active steps, one executed 2·M·N·K matmul each, forward (no autograd)
    assert a.totals["matmul_count"]["forward"] == 2
    assert a.totals["flops"]["executed"] == 2 * 2 * M * N * K
    assert "MFU" in capsys.readouterr().out
