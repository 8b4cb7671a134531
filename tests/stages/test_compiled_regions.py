"""torch.compile with checkpointing: each compiled backward region recomputes only its own forward's GEMMs.

Two regions per micro-batch, as a decoder stack and an LM head compiled apart:
the decoder's forward runs two GEMMs of one signature, the head's one of
another. The decoder's backward re-runs both of its GEMMs (recompute) and two
weight gradients; the head's backward recomputes nothing. A budget shared
across regions (a forward's worth divided by the number of regions) books one
of the decoder's recomputed GEMMs as backward.
"""

from __future__ import annotations

from tests.builders import EVAL, Builder, shapes
from traceflops.run.load import analyze

B, D, V = 6, 40, 72  # tokens, hidden, vocab: non-square


def mm(b, ts, a_dims, b_dims, a_strides, b_strides, tid=None):
    b.op("aten::mm", ts, 8, tid=tid, **shapes([a_dims, b_dims]), **{"Input Strides": [a_strides, b_strides]})
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", ts + 1, ts + 100, 5, tid=tid)


def two_region_trace(tmp_path) -> str:
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    b.op("CompiledFunction", 100, 100, **{"Sequence number": 10})  # decoder stack
    mm(b, 110, [B, D], [D, D], [D, 1], [1, D])  # x @ W.t(): W read transposed
    mm(b, 130, [B, D], [D, D], [D, 1], [1, D])
    b.op("CompiledFunction", 300, 100, **{"Sequence number": 11})  # LM head
    mm(b, 310, [B, D], [D, V], [D, 1], [1, D])
    # backward, head first; each region's node carries its forward's sequence number
    b.op(EVAL + "CompiledFunctionBackward", 1000, 200, tid=2, **{"Sequence number": 11})
    b.op("CompiledFunctionBackward", 1001, 198, tid=2, **{"Sequence number": 11})
    mm(b, 1010, [B, V], [V, D], [V, 1], [D, 1], tid=2)  # dgrad: other strides
    b.op(EVAL + "CompiledFunctionBackward", 2000, 800, tid=2, **{"Sequence number": 10})
    b.op("CompiledFunctionBackward", 2001, 798, tid=2, **{"Sequence number": 10})
    mm(b, 2010, [B, D], [D, D], [D, 1], [1, D], tid=2)  # recompute, the forward's signature
    mm(b, 2030, [B, D], [D, D], [D, 1], [1, D], tid=2)  # recompute
    mm(b, 2050, [B, D], [D, D], [D, 1], [D, 1], tid=2)  # dgrad
    mm(b, 2070, [D, B], [B, D], [1, D], [D, 1], tid=2)  # wgrad
    return b.write(tmp_path / "compiled.json.gz")


def test_each_backward_region_recomputes_its_own_forward(tmp_path):
    a = analyze(two_region_trace(tmp_path))
    s = a.steps.row(0, named=True)
    assert (s["count_forward"], s["count_recompute"], s["count_backward"]) == (3, 2, 3)
    assert s["flops_recompute"] == 2 * (2 * B * D * D)
    assert s["flops_forward"] == 2 * (2 * B * D * D) + 2 * B * D * V
