"""The autograd node an op runs in, as phase tagging reads it: only a node that encloses the op."""

import polars as pl

from tests import builders as b
from traceflops.stages.link import link
from traceflops.stages.phases import tag_ops

CKPT = "autograd::engine::evaluate_function: CheckpointFunctionBackward"


def _tagged(*rows):
    linked = link(b.trace(ops=b.ops(*rows)))
    ops = tag_ops(linked, (linked.ops["name"] == "aten::mm").to_numpy())
    return {r["ts"]: (r["phase"], r["node"]) for r in ops.iter_rows(named=True)}


def test_backward_work_outside_every_node_runs_in_none():
    """An FSDP post-backward callback's matmul is backward work outside any node: no node's rules apply to it, not
    those of the trace's first op (here a checkpoint's backward node, whose forward re-run is recompute)."""
    got = _tagged(
        (CKPT, "1", 0.0, 10.0, 1),
        ("aten::mm", "1", 1.0, 2.0, 2),  # re-run forward under the checkpoint's node: recompute
        ("FSDP::post_backward_reshard", "1", 20.0, 10.0, 3),
        ("aten::mm", "1", 21.0, 2.0, 4),
    )
    assert got[1.0] == ("recompute", "CheckpointFunctionBackward")
    assert got[21.0] == ("backward", "")
    assert got[20.0] == ("backward", "")


def test_an_op_inside_a_node_takes_that_nodes_name():
    got = _tagged(
        ("aten::mm", "1", 0.0, 2.0, 1),
        ("autograd::engine::evaluate_function: MmBackward0", "1", 10.0, 10.0, 2),
        ("aten::mm", "1", 11.0, 2.0, 3),
        (CKPT, "1", 30.0, 10.0, 4),
        ("aten::mm", "1", 31.0, 2.0, 5),
    )
    assert got[0.0] == ("forward", "")
    assert got[11.0] == ("backward", "MmBackward0")
    assert got[31.0] == ("recompute", "CheckpointFunctionBackward")


def test_node_names_per_row_as_the_pattern_reads_each_name():
    """`node_names` (the regex per distinct name, laid over the rows) against Python's `re` on every row."""
    from traceflops.stages.phases import _NODE_RE, node_names

    rows = [
        CKPT,
        "aten::mm",
        None,
        "MmBackward0",
        "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
        "aten::mm",
        "",
        CKPT,
        None,
    ]
    truth = []
    for name in rows:
        m = _NODE_RE.match(name) if name is not None else None
        truth.append((m.group(1) or m.group(2)) if m else "")
    assert node_names(pl.Series(rows, dtype=pl.Utf8)).to_list() == truth
