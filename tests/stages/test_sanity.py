"""Known answers for each cleaning and check function (traceflops/stages/clean.py, metrics/checks.py) on small hand-built frames."""

import math

import polars as pl
import pytest

from tests.builders import CPU, kernels, ops, trace
from traceflops.core.errors import (
    EXIT_FORMAT,
    EXIT_INTERNAL,
    EmptyTraceError,
    FormatError,
    InternalError,
)
from traceflops.core.trace import KERNELS_SCHEMA
from traceflops.core.vocab import OVERLAYS, PARTITION
from traceflops.metrics import budget as bd
from traceflops.metrics import checks
from traceflops.stages import clean as sanity
from traceflops.stages import timeline as tl

# ------------------------------------------------------------------ duplicates


def test_duplicates_keep_the_first_copy_and_count_the_rest():
    k = kernels(("a", 0, "7", 0.0, 5.0, 1), ("a", 0, "7", 0.0, 5.0, 1), ("a", 0, "7", 0.0, 5.0, 1), ("a", 0, "8", 0.0, 5.0, 1))
    out, n = sanity.drop_duplicates(k, sanity.KERNEL_KEY)
    assert n == 2
    assert out["kernel_id"].to_list() == [0, 3]  # first copy kept, another stream is another event


def test_duplicates_compare_nulls_as_equal_and_differ_on_any_key():
    k = kernels(("a", 0, "7", 0.0, 5.0, None), ("a", 0, "7", 0.0, 5.0, None), ("a", 0, "7", 0.0, 5.5, None), ("b", 0, "7", 0.0, 5.0, None))
    out, n = sanity.drop_duplicates(k, sanity.KERNEL_KEY)
    assert n == 1 and out["kernel_id"].to_list() == [0, 2, 3]


def test_op_duplicates_exempt_zero_length_ops_without_external_id():
    o = ops(
        ("aten::empty", "1", 10.0, 0.0, None),  # µs-resolution repeated calls: real, kept
        ("aten::empty", "1", 10.0, 0.0, None),
        ("aten::mm", "1", 20.0, 4.0, 7),
        ("aten::mm", "1", 20.0, 4.0, 7),  # duplicate
        ("aten::mm", "2", 20.0, 4.0, 7),  # other thread
    )
    out, n = sanity.drop_duplicates(o, sanity.OP_KEY, sanity.op_duplicate_exempt())
    assert n == 1 and out["op_id"].to_list() == [0, 1, 2, 4]


def test_duplicates_without_a_start_time_are_still_found():
    k = kernels(("a", 0, "7", None, 5.0, 1), ("a", 0, "7", None, 5.0, 1), ("a", 0, "7", None, 6.0, 1), ("a", 0, "7", 0.0, 5.0, 1))
    out, n = sanity.drop_duplicates(k, sanity.KERNEL_KEY)
    assert n == 1 and out["kernel_id"].to_list() == [0, 2, 3]


# ------------------------------------------------------------------ far from the rest

DAY_US = 86_400e6


def test_an_event_more_than_a_day_from_the_median_start_is_dropped_and_counted():
    o = ops(("a", "1", 0.0, 5.0, None), ("b", "1", 10.0, 5.0, None), ("c", "1", 20.0, 5.0, None))
    k = kernels(("k", 0, "7", 12.0, 3.0), ("late", 0, "7", 1.5 * DAY_US, 3.0))
    out, n = sanity.drop_far_from_the_rest({"ops": o, "kernels": k})  # median start 12 µs
    assert n == 1
    assert out["kernels"]["name"].to_list() == ["k"] and out["ops"]["name"].to_list() == ["a", "b", "c"]


def test_an_event_ending_more_than_a_day_after_the_median_start_is_dropped():
    o = ops(("long", "1", 0.0, 1.2 * DAY_US, None), ("b", "1", 10.0, 5.0, None), ("c", "1", 20.0, 5.0, None))
    out, n = sanity.drop_far_from_the_rest({"ops": o})
    assert n == 1 and out["ops"]["name"].to_list() == ["b", "c"]


def test_a_trace_spanning_more_than_a_day_keeps_what_lies_within_a_day_of_its_median():
    o = ops(("a", "1", 0.0, 1.0, None), ("b", "1", 0.6 * DAY_US, 1.0, None), ("c", "1", 1.2 * DAY_US, 1.0, None))
    out, n = sanity.drop_far_from_the_rest({"ops": o})  # 1.2 days end to end, each within 0.6 day of b's start
    assert n == 0 and out["ops"]["name"].to_list() == ["a", "b", "c"]


# ------------------------------------------------------------------ impossible times


def test_implausible_times_are_dropped_and_counted():
    k = kernels(("ok", 0, "7", 1.0, 2.0), ("nan", 0, "7", math.nan, 2.0), ("inf", 0, "7", 1.0, math.inf),
                 ("huge", 0, "7", 1e19, 1.0), ("ns", 0, "7", 1.7e18, 1.0), ("null", 0, "7", None, 1.0))
    out, n = sanity.drop_implausible_times(k)
    assert n == 3
    assert out["name"].to_list() == ["ok", "ns", "null"]  # ns since 1970 is below the limit; nulls are for later stages


# ------------------------------------------------------------------ kernel times


def test_partial_overlap_on_a_stream_moves_the_later_start():
    k = kernels(("a", 0, "7", 0.0, 10.0), ("b", 0, "7", 8.0, 4.0), ("c", 0, "8", 5.0, 10.0))
    out, c = sanity.clean_kernel_times(k)
    assert c == sanity.KernelTimeCounts(zero=0, negative=0, clipped=1, contained=0, overlap_us=2.0)
    assert out["ts"].to_list() == [0.0, 10.0, 5.0]  # other stream untouched
    assert out["dur"].to_list() == [10.0, 2.0, 10.0]  # b keeps its end, 12
    assert out.columns == k.columns and out["kernel_id"].to_list() == [0, 1, 2]


def test_contained_kernel_keeps_its_end_with_zero_duration():
    k = kernels(("inner", 0, "7", 2.0, 3.0), ("outer", 0, "7", 0.0, 10.0), ("after", 0, "7", 9.0, 6.0))
    out, c = sanity.clean_kernel_times(k)
    assert (c.clipped, c.contained, c.overlap_us) == (1, 1, 4.0)
    got = dict(zip(out["name"], zip(out["ts"], out["dur"])))
    assert got == {"outer": (0.0, 10.0), "inner": (5.0, 0.0), "after": (10.0, 5.0)}
    # the running max, not only the previous kernel, bounds the next start
    assert sum(out["dur"]) == 15.0  # the union [0, 15)


def test_same_start_keeps_the_longer_kernel_whatever_the_row_order():
    a = kernels(("short", 0, "7", 0.0, 2.0), ("long", 0, "7", 0.0, 5.0))
    b = kernels(("long", 0, "7", 0.0, 5.0), ("short", 0, "7", 0.0, 2.0))
    for k in (a, b):
        out, c = sanity.clean_kernel_times(k)
        got = dict(zip(out["name"], zip(out["ts"], out["dur"])))
        assert got == {"long": (0.0, 5.0), "short": (2.0, 0.0)} and c.contained == 1


def test_rounding_overlaps_and_touching_kernels_are_left_alone():
    k = kernels(("a", 0, "7", 0.0, 1.0000000001), ("b", 0, "7", 1.0, 1.0), ("c", 0, "7", 2.0, 1.0))
    out, c = sanity.clean_kernel_times(k)
    assert (c.clipped, c.contained) == (0, 0)
    assert out.equals(k)


def test_zero_and_negative_durations_are_counted_negative_set_to_zero():
    k = kernels(("z", 0, "7", 0.0, 0.0), ("neg", 0, "7", 5.0, -3.0), ("ok", 0, "7", 6.0, 1.0))
    out, c = sanity.clean_kernel_times(k)
    assert (c.zero, c.negative) == (1, 1)
    assert out["dur"].to_list() == [0.0, 0.0, 1.0]


def test_overlaps_are_per_device_and_null_streams_group_together():
    k = kernels(("a", 0, None, 0.0, 10.0), ("b", 0, None, 5.0, 10.0), ("c", 1, None, 5.0, 10.0))
    out, c = sanity.clean_kernel_times(k)
    assert c.clipped == 1 and out["ts"].to_list() == [0.0, 10.0, 5.0]


def test_same_start_and_length_sorts_by_name_then_file_order():
    """The last tie-breakers: the name (in text order, whatever codes sort it), then the row; the later one is the
    contained copy."""
    named = kernels(("b", 0, "7", 0.0, 4.0, 3), ("a", 0, "7", 0.0, 4.0, 3))
    out, c = sanity.clean_kernel_times(named)
    assert dict(zip(out["name"], zip(out["ts"], out["dur"]))) == {"a": (0.0, 4.0), "b": (4.0, 0.0)}
    twins = kernels(*[("k", 0, "7", 0.0, 4.0, 3)] * 3)
    out, c = sanity.clean_kernel_times(twins)
    assert out["dur"].to_list() == [4.0, 0.0, 0.0] and c.contained == 2


def test_large_input_counts_every_overlap():
    n = 200_000
    k = pl.DataFrame(
        {"kernel_id": range(n), "name": ["k"] * n, "kind": ["compute"] * n, "device": [0] * n,
         "stream": [str(i % 4) for i in range(n)], "ts": [float(i) for i in range(n)], "dur": [5.0] * n, "correlation": range(n)},
    ).with_columns([pl.lit(None, t).alias(c) for c, t in KERNELS_SCHEMA.items() if c not in ("kernel_id", "name", "kind", "device", "stream", "ts", "dur", "correlation")]).select(list(KERNELS_SCHEMA)).cast(KERNELS_SCHEMA)
    _, c = sanity.clean_kernel_times(k)
    assert c.clipped == n - 4  # 4 streams, kernels every 4 µs on each, 5 µs long
    assert abs(c.overlap_us - (n - 4) * 1.0) < 1e-6


# ------------------------------------------------------------------ time unit


def test_microsecond_traces_raise_no_suspicion():
    t = trace(ops(*[("a", "1", 1.66e15 + i * 10, 5.0, i) for i in range(50)]))
    assert sanity.time_unit_suspicion(t) is None


def test_nanosecond_epoch_timestamps_are_suspected():
    t = trace(ops(*[("a", "1", 1.7e18 + i * 1e4, 5e3, i) for i in range(5)]))
    assert "beyond 1e17" in sanity.time_unit_suspicion(t)


def test_nanosecond_durations_are_suspected_by_their_median():
    t = trace(kernels=kernels(*[("k", 0, "7", 1e9 + i * 1e5, 5e4) for i in range(30)]))
    why = sanity.time_unit_suspicion(t)
    assert "median duration of 30 device activities" in why


def test_a_span_of_weeks_is_suspected_but_few_long_events_are_not():
    t = trace(ops(("a", "1", 0.0, 5.0, 1), ("b", "1", 2e12, 5.0, 2)))
    assert "spans" in sanity.time_unit_suspicion(t)
    t = trace(ops(*[("a", "1", i * 1e5, 5e4, i) for i in range(5)]))  # 5 long ops: too few to judge
    assert sanity.time_unit_suspicion(t) is None


def test_clean_warns_about_nanoseconds_and_does_not_rescale():
    o = ops(*[("a", "1", 1.7e18 + i * 1e4, 5e3, i) for i in range(3)])
    t = sanity.clean(trace(o))
    assert t.ops["ts"].to_list() == o["ts"].to_list()
    assert any("look like nanoseconds" in line for line in t.warnings.lines())


# ------------------------------------------------------------------ clean


def test_clean_counts_every_change_in_warnings():
    o = ops(("aten::mm", "1", 0.0, 4.0, 1), ("aten::mm", "1", 0.0, 4.0, 1))
    k = kernels(("a", 0, "7", 0.0, 10.0, 1), ("a", 0, "7", 0.0, 10.0, 1), ("b", 0, "7", 8.0, 4.0), ("z", 0, "7", 20.0, 0.0))
    t = sanity.clean(trace(o, k))
    assert t.ops.height == 1 and t.kernels.height == 3
    c = t.warnings.counts
    assert c["duplicate host ops (identical name, thread, ts, dur, External id; extra copies dropped)"] == 1
    assert c["duplicate device activities (identical name, device, stream, ts, dur, correlation; extra copies dropped)"] == 1
    assert c["device activities of zero duration (they take no time)"] == 1
    assert any(r.startswith("device activities that start before") and n == 1 for r, n in c.items())


def test_clean_of_an_empty_trace_is_a_format_error_naming_the_file():
    t = trace()
    t.warnings.add("'traceEvents' is not a list")
    with pytest.raises(EmptyTraceError) as e:
        sanity.clean(t)
    assert isinstance(e.value, FormatError) and e.value.exit_code == EXIT_FORMAT
    line = e.value.line()
    assert line.startswith("error: t.json: ") and "'traceEvents' is not a list" in line and "\n" not in line


def test_clean_leaves_a_clean_trace_alone():
    o = ops(("aten::mm", "1", 0.0, 4.0, 1))
    k = kernels(("a", 0, "7", 0.0, 10.0), ("b", 0, "7", 10.0, 4.0))
    t = sanity.clean(trace(o, k))
    assert t.ops.equals(o) and t.kernels.equals(k) and not t.warnings.counts


# ------------------------------------------------------------------ conservation


def test_check_classes_accepts_the_five_classes_only():
    k = kernels(*[("a", 0, "7", 0.0, 1.0)] * 5).with_columns(cls=pl.Series(list(checks.CLASSES)))
    checks.check_classes(k, "t.json")
    for bad in (None, "forward"):
        with pytest.raises(InternalError) as e:
            checks.check_classes(k.with_columns(cls=pl.lit(bad, pl.Utf8)), "t.json")
        assert e.value.exit_code == EXIT_INTERNAL and "t.json" in e.value.line() and "5 device activities" in e.value.line()


def _partition_row(**parts):
    row = {"device": 0, "step": 1, "start": 0.0, "window": 10.0, **{c: 0.0 for c in (*PARTITION, *OVERLAYS)}}
    row.update(parts)
    return pl.DataFrame([row])


def test_check_partition_passes_a_partition_that_sums_and_raises_internal_otherwise():
    checks.check_partition(_partition_row(matmul=4.0, matmul_known=4.0, idle=6.0), "t.json")
    with pytest.raises(InternalError) as e:
        checks.check_partition(_partition_row(matmul=4.0, matmul_known=4.0, idle=5.0), "t.json")
    assert e.value.exit_code == EXIT_INTERNAL and "partition" in e.value.line()


def test_check_budgets_raises_only_for_a_fully_known_budget_off_one():
    good = {k: 0.0 for k in bd.TERMS} | {"idle": 1.0}
    partial = good | {"mfu": None, "idle": 0.3}
    checks.check_budgets([good, partial, None])
    with pytest.raises(InternalError) as e:
        checks.check_budgets([good | {"idle": 0.9}], "t.json")
    assert "loss budget" in e.value.line() and e.value.exit_code == EXIT_INTERNAL


def test_a_check_that_fires_inside_the_pipeline_is_an_internal_error(monkeypatch):
    from traceflops import pipeline
    from traceflops.core.results import ModelOptions

    def broken(trace, opt, stage, captures=(), views=True):
        tl.check_partition(_partition_row(idle=3.0))

    def other(trace, opt, stage, captures=(), views=True):
        raise ValueError("not a conservation check")

    t = trace(ops(("a", "1", 0.0, 1.0, 1)))
    monkeypatch.setattr(pipeline, "_analyze", broken)
    with pytest.raises(InternalError) as e:
        pipeline.analyze_trace(t, ModelOptions())
    assert "time partition conservation check failed" in e.value.line() and "t.json" in e.value.line()
    assert e.value.exit_code == EXIT_INTERNAL
    monkeypatch.setattr(pipeline, "_analyze", other)
    with pytest.raises(ValueError, match="not a conservation check"):
        pipeline.analyze_trace(t, ModelOptions())


def test_analysis_of_a_real_trace_passes_every_check():
    from traceflops.core.results import ModelOptions
    from traceflops.run.load import analyze

    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"), ModelOptions(peak_tflops=1))
    checks.check_analysis(a)
