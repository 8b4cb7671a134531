"""A grouped mm counts once, as the dispatcher-level op: FLOPs from its own shapes, the per-group mm inside not again.

Truth: PyTorch's CPU fallback of `torch._grouped_mm` runs one `aten::mm` per expert group inside it (recorded here),
and the FLOPs of a grouped mm of A[M, K] by G weights [K, N] with offsets covering all M rows are 2·M·K·N.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from traceflops.run.load import analyze

torch = pytest.importorskip("torch")


def test_grouped_mm_counted_once(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    M, K, N, G, CALLS = 11, 16, 24, 3, 2
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(G, N, K, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.tensor([2, 6, 11], dtype=torch.int32)  # three groups of 2, 4 and 5 rows
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(CALLS):
            torch._grouped_mm(a, b, offs)
            torch.mm(a, b[0])  # a plain mm beside it still counts
    path = str(tmp_path / "gmm.json")
    p.export_chrome_trace(path)
    with open(path) as f:
        names = [e.get("name") for e in json.load(f)["traceEvents"]]
    assert names.count("aten::mm") == CALLS * (G + 1)  # the fallback's per-group mm are in the trace
    an = analyze(path)
    counted = an.ops.filter(an.ops["matmul"])
    assert sorted(counted["name"].to_list()) == ["aten::_grouped_mm"] * CALLS + ["aten::mm"] * CALLS
    assert sum(an.totals["matmul_count"].values()) == 2 * CALLS
    assert an.totals["flops"]["executed"] == CALLS * (2 * M * K * N + 2 * M * K * N)


EP = Path(__file__).resolve().parents[2] / "fixtures" / "dist"


@pytest.mark.skipif(not (EP / "ep" / "rank0.json.gz").exists(), reason="project EP fixture missing")
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_expert_parallel_grouped_mm_once_per_call(rank):
    # Each step runs two grouped GEMMs forward (40→72, 72→40) and, backward, the input and weight gradient of each:
    # six grouped-mm calls, whose FLOPs are the generator's hand count of the experts (from the tokens they ran).
    truth = json.loads((EP / "truth.json").read_text())["ep"]["ranks"][str(rank)]["steps"]
    a = analyze(str(EP / "ep" / f"rank{rank}.json.gz"))
    counted = a.ops.filter(a.ops["matmul"] & (a.ops["name"] == "aten::_grouped_mm"))
    by_step = {s: (n, f) for s, n, f in counted.group_by("step").agg(pl.len(), pl.col("flops").sum()).iter_rows()}
    steps = sorted(s for s in by_step if s >= 0)
    assert len(steps) == len(truth)
    for s, t in zip(steps, truth):
        n, f = by_step[s]
        assert n == 6
        assert f == t["flops"]["experts"]["forward"] + t["flops"]["experts"]["backward"]
