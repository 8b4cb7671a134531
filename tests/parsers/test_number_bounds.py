"""Numbers beyond any real one, where they enter: huge recorded dims, huge XLA stats, links no launch can make.

Each is left unknown or counted with a warning; none may end in a traceback (exit 4) or a silent wrong number.
"""

from __future__ import annotations

import json
import os
import struct

import pytest

from tests.builders import pb_field, pb_varint
from tests.integration.test_hostile_numbers import mm_trace, report
from traceflops.core.results import ModelOptions
from traceflops.run.load import analyze


@pytest.mark.parametrize("dims", [[[10**12, 10**12], [10**12, 10**12]], [[1 << 40, 1 << 10], [1 << 10, 1 << 40]]])
def test_gemm_shapes_beyond_int64_tiles_are_left_out_of_the_shape_table(tmp_path, dims):
    d = report(mm_trace([dims]).write(tmp_path / "t.json.gz"))
    assert all(r["M"] < 1 << 58 for r in d.get("by_gemm_shape") or []), d.get("by_gemm_shape")
    assert any("more than" in w and "in one op" in w for w in d["warnings"]), d["warnings"]


def _xla_profile(tmp_path, flops) -> str:
    """The two-device XLA:CPU profile of `test_xla_multi_device`, its dots carrying a `flops` stat (a float: double;
    a 1-tuple: uint64)."""
    import tests.parsers.test_xla_multi_device as X

    def stat(sid, v):
        if isinstance(v, float):
            return pb_field(1, sid) + pb_varint(2 << 3 | 1) + struct.pack("<d", v)
        if isinstance(v, tuple):
            return pb_field(1, sid) + pb_field(3, v[0])
        return pb_field(1, sid) + pb_field({str: 5, bytes: 6}.get(type(v), 4), v)

    lines = {"python": [("train", 100.0 * s, 90.0, {"step_num": s}) for s in range(X.STEPS)]}
    for dev, ops in X.RUN.items():
        lines[f"worker {dev}"] = [(op, 100.0 * s + t, dur, {"hlo_op": op, "hlo_module": "jit_f", "program_id": 1, "device_ordinal": dev,
                                                            **({"flops": flops} if op == "dot.1" else {})})
                                  for s in range(X.STEPS) for op, t, dur in ops]
    saved, X._stat = X._stat, stat
    try:
        space = pb_field(1, X._plane("/host:CPU", lines)) + pb_field(1, X._plane("/host:metadata", {}, {"jit_f(1)": {"Hlo Proto": X._hlo(), "program_id": 1}}))
    finally:
        X._stat = saved
    p = tmp_path / "f.xplane.pb"
    p.write_bytes(space)
    return str(p)


@pytest.mark.parametrize("flops", [1e300, (2**64 - 1,)], ids=["double_1e300", "uint64_max"])
def test_an_xla_flops_stat_beyond_int64_is_out_of_range(tmp_path, flops):
    a = analyze(_xla_profile(tmp_path, flops), ModelOptions(peak_tflops=1.0))
    assert a.totals["flops"]["executed"] == 0 and a.totals["hfu"] is None
    assert any("more than" in w and "in one op" in w for w in a.warnings), a.warnings


def test_values_beyond_int64_are_no_ids_but_counts_stay_out_of_range():
    from traceflops.parsers.values import INT64_MAX, as_count, as_int

    assert as_int(2**64 - 1) is None and as_int(1e300) is None and as_int(-(2**63)) == -(2**63)
    assert as_count(2**64 - 1) == INT64_MAX and as_count(1e300) == INT64_MAX and as_count(float("nan")) is None


# ------------------------------------------------------------------ kernels no op can be tied to


def _json(b, tmp_path, name):
    return b.write(tmp_path / f"{name}.json.gz")


@pytest.mark.parametrize("drop", ["cpu_op", "cuda_runtime"])
def test_kernels_tied_to_no_op_give_unknown_utilization_and_say_what_to_record(tmp_path, drop):
    b = mm_trace([])
    b.events = [e for e in b.events if e.get("cat") != drop]
    d = report(_json(b, tmp_path, drop))
    assert d["totals"]["mfu"] is None and d["totals"]["hfu"] is None
    assert any("tied to a host op" in w and "record_shapes=True" in w for w in d["warnings"]), d["warnings"]


def test_a_kernel_with_another_launchs_correlation_id_is_counted(tmp_path):
    b = mm_trace([[[48, 80], [80, 24]]])
    kernels = [e for e in b.events if e.get("cat") == "kernel"]
    kernels[1]["args"]["correlation"] = kernels[0]["args"]["correlation"]
    d = report(_json(b, tmp_path, "collide"))
    assert any("correlation id of a launch that makes one activity" in w for w in d["warnings"]), d["warnings"]


def test_a_clean_trace_has_no_collision(tmp_path):
    d = report(_json(mm_trace([[[48, 80], [80, 24]]]), tmp_path, "clean"))
    assert not any("correlation id" in w for w in d["warnings"]), d["warnings"]
    assert d["totals"]["hfu"] > 0 and json.dumps(d)
    assert os.path.exists(tmp_path / "clean.json.gz")


def test_p2p_peer_ranks_read_as_text_or_integers_and_the_rest_counted(tmp_path):
    """PyTorch writes `Dst Rank` / `Src Rank` as decimal text; an integer reads too. A negative, fractional, boolean,
    non-numeric or beyond-any-job rank is no rank: read as missing and counted in the warnings."""
    from tests.builders import Builder

    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    given = ["3", 4, "-1", "2.5", True, "x", str(1 << 40), None]
    for i, v in enumerate(given):
        extra = {} if v is None else {"Dst Rank": v}
        b.op("record_param_comms", 10 + 50 * i, 20, **{"Collective name": "send", **extra})
    a = analyze(b.write(tmp_path / "t.json.gz"))
    sends = a.ops.filter(a.ops["name"] == "record_param_comms").sort("ts")
    assert sends["p2p_peer"].to_list() == [3, 4, None, None, None, None, None, None]
    assert any("'Dst Rank' / 'Src Rank' values that are not ranks (read as missing) (5)" in w for w in a.warnings), a.warnings


def test_message_sizes_and_group_sizes_beyond_any_job_are_counted_not_multiplied(tmp_path):
    """A collective's `In msg nelems` / `Out msg nelems` past 2^48 elements (or negative) and a `Group size` outside
    1..2^24 are read as missing and counted: no byte count can wrap (2^62 elements of 8 bytes wrapped to 0 bytes,
    and -3 elements gave -24)."""
    from tests.builders import Builder
    from traceflops.views.collectives import collectives

    b = Builder()
    b.annotation("ProfilerStep#0", 0, 2000)
    given = [(1000, 1000, 4), (1 << 62, 5, 4), (-3, None, 0), (7, 1 << 49, 1 << 30)]
    for i, (n_in, n_out, size) in enumerate(given):
        args = {"Collective name": "allreduce", "In msg nelems": n_in, "dtype": "Long", "Group size": size,
                **({} if n_out is None else {"Out msg nelems": n_out})}
        b.kernel("ncclDevKernel_AllReduce_Sum_i64_RING_LL", 10 + 400 * i, 100 + 400 * i, 50, stream=20, **args)
    a = analyze(b.write(tmp_path / "t.json.gz"))
    c = collectives(a).sort("ts")
    assert c["bytes"].to_list() == [8000, 40, None, 56]
    assert c["group_size"].to_list() == [4, 4, None, None]
    assert any("'In msg nelems' values that are not element counts (0 to 2^48) (read as missing) (2)" in w
               for w in a.warnings), a.warnings
    assert "'Out msg nelems' values that are not element counts (0 to 2^48) (read as missing)" in a.warnings
    assert any("'Group size' values that are not group sizes (1 to 2^24) (read as missing) (2)" in w
               for w in a.warnings), a.warnings
