"""`analyze_trace(views=False)`, what `annotate` runs: the same tables, steps and totals as the whole analysis, and
none of the views built from them."""

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.builders import FIXTURES
from traceflops.core.results import ModelOptions
from traceflops.pipeline import analyze_trace
from traceflops.run.load import load

TABLES = ("ops", "kernels", "steps", "partition", "idle_gaps", "launch_stats", "roofline", "critical_path")
VIEWS = ("top_kernels", "by_kernel", "by_module", "by_gemm_shape", "path_summary", "communication", "collectives")


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_without_views_the_tables_and_totals_are_those_of_the_whole_analysis(name, request):
    if name == "cpu":
        path = FIXTURES / "cpu" / "ns_ckpt_reentrant.json.gz"
    else:  # a real GPU trace with collectives, recompute and a roofline
        path = request.getfixturevalue("shared") / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"
    trace = load(str(path))
    whole = analyze_trace(trace, ModelOptions())
    bare = analyze_trace(trace, ModelOptions(), views=False)
    for t in TABLES:
        if getattr(whole, t) is None:
            assert getattr(bare, t) is None, t
        else:
            assert_same(getattr(bare, t), getattr(whole, t))
    assert bare.totals == whole.totals and bare.model == whole.model and bare.hardware == whole.hardware
    assert bare.warnings == whole.warnings and bare.step_stats == whole.step_stats
    # the views: there in the whole analysis (so this can fail), absent without them
    assert whole.advice and whole.path_summary is not None
    assert bare.advice == [] and bare.what_if == []
    assert all(getattr(bare, v) is None for v in VIEWS)


def assert_same(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Equal frames; a column of Python objects (a step's loss budget) by its values, not its objects' identity."""
    objects = [c for c, d in want.schema.items() if d == pl.Object]
    assert got.columns == want.columns
    assert_frame_equal(got.drop(objects), want.drop(objects))
    for c in objects:
        assert got[c].to_list() == want[c].to_list(), c
