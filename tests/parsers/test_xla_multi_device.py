"""One XLA:CPU program on several devices, from a hand-made profile: each op keeps its `device_ordinal` as its device
(only when the profile's ops ran for more than one), a collective is named by its HLO opcode (dashes or underscores,
async -start/-done forms; by its name when the HLO is not in the profile), and the analysis partitions each device's
time, books collectives as communication and measures HFU against every device's peak."""

from __future__ import annotations

import polars as pl
import pytest

from tests.builders import pb_field, pb_varint
from traceflops.core.results import ModelOptions
from traceflops.parsers.xla import parse_xplane
from traceflops.run.load import analyze
from traceflops.stages.cpu_activities import cpu_activities

M, K, N = 48, 80, 24  # dot.1: [M,K]·[K,N], non-square
DOT_FLOPS = 2 * M * K * N
F32 = 11  # xla PrimitiveType

# -- a tiny protobuf writer ------------------------------------------------------------


_varint, _f = pb_varint, pb_field


def _stat(sid: int, value) -> bytes:
    kind = {str: 5, bytes: 6}.get(type(value), 4)  # XStat: int64 4, str 5, bytes 6
    return _f(1, sid) + _f(kind, value)


def _plane(name: str, lines: dict[str, list[tuple[str, float, float, dict]]], metadata: dict[str, dict] | None = None) -> bytes:
    """An XPlane: per line (name → [(event, ts_us, dur_us, stats)]), and event metadata carrying stats."""
    sids: dict[str, int] = {}
    mids: dict[str, int] = {}
    body = _f(2, name)
    for k, (lname, events) in enumerate(lines.items()):
        evs = b""
        for ev, ts, dur, stats in events:
            mid = mids.setdefault(ev, len(mids) + 1)
            e = _f(1, mid) + _f(2, int(ts * 1e6)) + _f(3, int(dur * 1e6))
            for s, v in stats.items():
                e += _f(4, _stat(sids.setdefault(s, len(sids) + 1), v))
            evs += _f(4, e)
        body += _f(3, _f(1, k + 1) + _f(2, lname) + _f(3, 1000) + evs)
    for ev, stats in (metadata or {}).items():
        mids.setdefault(ev, len(mids) + 1)
    for ev, mid in mids.items():
        md = _f(1, mid) + _f(2, ev)
        for s, v in (metadata or {}).get(ev, {}).items():
            md += _f(5, _stat(sids.setdefault(s, len(sids) + 1), v))
        body += _f(4, _f(1, mid) + _f(2, md))
    for s, sid in sids.items():
        body += _f(5, _f(1, sid) + _f(2, _f(1, sid) + _f(2, s)))
    return body


def _shape(*dims: int) -> bytes:
    return _f(2, F32) + b"".join(_f(3, d) for d in dims)


def _instr(name: str, opcode: str, iid: int, shape: bytes, operands=(), extra: bytes = b"") -> bytes:
    return _f(1, name) + _f(2, opcode) + _f(3, shape) + _f(35, iid) + b"".join(_f(36, o) for o in operands) + extra


# The program each device runs: a dot, a fusion, and collectives whose names do not give their opcode away.
OPCODES = {"psum_invariant.7": "all-reduce", "rs.1": "reduce_scatter", "ag.2": "all-gather-start",
           "ag.3": "all-gather-done", "fusion.1": "fusion", "dot.1": "dot"}
COLLECTIVE = {"psum_invariant.7": "all-reduce", "rs.1": "reduce-scatter", "ag.2": "all-gather-start",
              "ag.3": "all-gather-done"}


def _hlo() -> bytes:
    ins = [
        _instr("p0", "parameter", 1, _shape(M, K)),
        _instr("p1", "parameter", 2, _shape(K, N)),
        _instr("dot.1", "dot", 3, _shape(M, N), (1, 2), _f(30, _f(1, 1) + _f(2, 0))),
    ]
    ins += [_instr(n, op, 10 + i, _shape(M, N), (3,)) for i, (n, op) in enumerate(OPCODES.items()) if op != "dot"]
    comp = _f(1, "main") + b"".join(_f(2, i) for i in ins) + _f(5, 1)
    return _f(1, _f(1, "jit_f") + _f(2, "main") + _f(3, comp))


# Per device and step (start t0 = 100·step): (op, offset, duration) on the device's own worker thread.
RUN = {
    0: [("dot.1", 10, 20), ("fusion.1", 30, 5), ("psum_invariant.7", 40, 15), ("rs.1", 60, 5), ("ag.2", 70, 2), ("ag.3", 73, 1)],
    1: [("dot.1", 12, 20), ("fusion.1", 33, 5), ("psum_invariant.7", 42, 13), ("rs.1", 60, 5), ("ag.2", 70, 2), ("ag.3", 73, 1)],
}
STEPS = 2


def _profile(tmp_path, ordinals=(0, 1), with_hlo: bool = True, names: dict | None = None) -> str:
    """Two steps; the ops of RUN[d] on thread 'worker d' with device_ordinal ordinals[d]."""
    lines = {"python": [("train", 100.0 * s, 90.0, {"step_num": s}) for s in range(STEPS)]}
    for d, ops in RUN.items():
        lines[f"worker {d}"] = [((names or {}).get(op, op), 100.0 * s + t, dur,
                                 {"hlo_op": (names or {}).get(op, op), "hlo_module": "jit_f", "program_id": 1,
                                  "device_ordinal": ordinals[d]})
                                for s in range(STEPS) for op, t, dur in ops]
    space = _f(1, _plane("/host:CPU", lines))
    if with_hlo:
        space += _f(1, _plane("/host:metadata", {}, {"jit_f(1)": {"Hlo Proto": _hlo(), "program_id": 1}}))
    p = tmp_path / "multi.xplane.pb"
    p.write_bytes(space)
    return str(p)


# -- the parser --------------------------------------------------------------------------


def test_ops_keep_their_device_and_collectives_their_opcode(tmp_path):
    ops = parse_xplane(_profile(tmp_path)).ops.filter(pl.col("cat") == "xla_op")
    assert ops.height == STEPS * sum(len(v) for v in RUN.values())
    by_thread = dict(ops.group_by("tid").agg(pl.col("device").unique()).iter_rows())
    assert {t: sorted(v) for t, v in by_thread.items()} == {"worker 0": [0], "worker 1": [1]}
    got = dict(ops.select("name", "collective").unique().iter_rows())
    assert got == {n: COLLECTIVE.get(n) for n in OPCODES}  # by opcode, dashed, whatever the name
    dot = ops.filter(pl.col("name") == "dot.1")
    assert dot["flops_hint"].to_list() == [DOT_FLOPS] * (STEPS * 2) and dot["matmul_hint"].all()


def test_one_device_leaves_the_device_null(tmp_path):
    """A program on one device (every ordinal 0): its ops are the trace's work, as before, device null."""
    ops = parse_xplane(_profile(tmp_path, ordinals=(0, 0))).ops.filter(pl.col("cat") == "xla_op")
    assert ops.height and ops["device"].null_count() == ops.height


def test_collectives_by_name_without_the_hlo(tmp_path):
    """No HLO module in the profile: the op's name without its `.N` tells the collective, dashes or underscores."""
    names = {"psum_invariant.7": "all_reduce.4", "rs.1": "reduce-scatter.1", "ag.2": "all-gather-start.2",
             "ag.3": "all_gather_done.3", "fusion.1": "fusion.1", "dot.1": "dot.1"}
    ops = parse_xplane(_profile(tmp_path, with_hlo=False, names=names)).ops
    got = dict(ops.select("name", "collective").unique().iter_rows())
    assert got == {"all_reduce.4": "all-reduce", "reduce-scatter.1": "reduce-scatter", "all-gather-start.2": "all-gather-start",
                   "all_gather_done.3": "all-gather-done", "fusion.1": None, "dot.1": None}


# -- the analysis ------------------------------------------------------------------------


def _expected(d: int) -> dict[str, float]:
    """Device d's time per step by class, from RUN (its ops do not overlap)."""
    cls = {"dot.1": "matmul", "fusion.1": "other_compute"}
    out = {"matmul": 0.0, "other_compute": 0.0, "communication_exposed": 0.0}
    for op, _t, dur in RUN[d]:
        out[cls.get(op, "communication_exposed")] += dur
    return out


def test_time_per_device_collectives_as_communication_and_every_peak(tmp_path):
    a = analyze(_profile(tmp_path), ModelOptions(peak_tflops=1))
    assert a.hardware["devices"] == 2
    part = a.partition.filter(pl.col("step") == 0)
    assert sorted(part["device"].to_list()) == [0, 1]
    s0 = a.steps.filter(pl.col("step") == 0).row(0, named=True)
    assert s0["window"] == pytest.approx(100.0)  # step 0's first op (10 µs) to step 1's (110 µs)
    for r in part.iter_rows(named=True):
        want = _expected(r["device"])
        for c, v in want.items():
            assert r[c] == pytest.approx(v, abs=1e-6), (r["device"], c)
        assert r["idle"] == pytest.approx(100.0 - sum(want.values()), abs=1e-6)
    # the step's time classes are the mean over the devices
    for c in ("matmul", "other_compute", "communication_exposed"):
        assert s0[f"time_{c}"] == pytest.approx((_expected(0)[c] + _expected(1)[c]) / 2, abs=1e-6)
    # each device ran one dot a step: HFU against both peaks
    assert s0["flops_executed"] == 2 * DOT_FLOPS
    assert s0["hfu"] == pytest.approx(2 * DOT_FLOPS / (100e-6 * 1e12 * 2), rel=1e-9)
    acts = cpu_activities(a.ops)
    assert acts.filter(pl.col("name").is_in(list(COLLECTIVE)))["cls"].unique().to_list() == ["communication"]
    assert sorted(acts["device"].unique().to_list()) == [0, 1]


def test_one_device_keeps_one_null_device(tmp_path):
    """Every ordinal 0: one device (null) in the partition, HFU against one peak; its collectives are communication."""
    a = analyze(_profile(tmp_path, ordinals=(0, 0)), ModelOptions(peak_tflops=1))
    assert a.hardware["devices"] == 1
    assert a.partition["device"].null_count() == a.partition.height
    s0 = a.steps.filter(pl.col("step") == 0).row(0, named=True)
    assert s0["hfu"] == pytest.approx(2 * DOT_FLOPS / (100e-6 * 1e12), rel=1e-9)
    assert s0["time_communication_exposed"] > 0


def test_program_devices_by_busy_time_or_compute_ops():
    """A device late to the program (busy less than half as long: the others waited for it in a collective) still ran
    it: as many compute ops as the others. A device that only took transfers, or ran a side program of few ops, did
    not."""
    from traceflops.stages.timeline import program_devices

    def part(busy: dict) -> pl.DataFrame:
        return pl.DataFrame({"device": list(busy), "step": [0] * len(busy), "window": [100.0] * len(busy),
                             "idle": [100.0 - b for b in busy.values()]})

    def acts(ops: dict) -> pl.DataFrame:
        rows = [(d, c) for d, per in ops.items() for c, n in per.items() for _ in range(n)]
        return pl.DataFrame({"device": [d for d, _ in rows], "cls": [c for _, c in rows], "step": [0] * len(rows)})

    busy = {0: 90.0, 1: 30.0, 2: 88.0, 3: 20.0, 4: 10.0}
    ran = acts({0: {"matmul": 4, "other_compute": 20, "communication": 2}, 1: {"matmul": 4, "other_compute": 20},
                2: {"matmul": 4, "other_compute": 20}, 3: {"memcpy": 60}, 4: {"other_compute": 3}})
    assert program_devices(part(busy)) == [0, 2]  # by busy time alone
    assert program_devices(part(busy), ran) == [0, 2, 1]  # the busiest first
    assert program_devices(part({None: 40.0}), acts({None: {"matmul": 1}})) == [None]
