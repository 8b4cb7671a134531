"""XLA profile (XSpace .xplane.pb) parser, HLO FLOPs and JAX name-stack phases.

Truths come from outside the parser: the fixture README's facts (dots per step,
the remat model's dimensions), FLOPs computed here by hand from those
dimensions or from shapes, and event counts taken straight from the decoded
protobuf.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.builders import pb_field, pb_varint
from traceflops.core.errors import FormatError
from traceflops.core.hardware import detect_xla
from traceflops.parsers import detect_format
from traceflops.parsers.xla import decode_hlo_proto, decode_xspace, parse_xplane
from traceflops.run.load import load
from traceflops.stages.link import link
from traceflops.stages.steps import assign
from traceflops.stages.xla_phases import logical_name, tag

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _xdir(shared: Path) -> Path:
    d = shared / "xplane"
    if not d.is_dir():
        pytest.skip(f"{d} is absent")
    return d


def _file(shared: Path, name: str) -> Path:
    p = _xdir(shared) / name
    if not p.is_file():
        pytest.skip(f"{p} is absent")
    return p


def _ops_with_steps(trace):
    return trace.ops.with_columns(step=assign(trace.ops, "ts", trace.steps.select("step", "name", "ts", "dur")))


# -- a tiny protobuf writer, for hand-made profiles -----------------------------------


_varint, _f = pb_varint, pb_field


def _stat(mid: int, value) -> bytes:
    if isinstance(value, str):
        return _f(1, mid) + _f(5, value)
    if isinstance(value, float):
        return _f(1, mid) + _f(2, value)
    return _f(1, mid) + _f(4, value)


def _cpu_profile(events: list[tuple[str, float, float, dict]]) -> bytes:
    """An XSpace with one /host:CPU plane: (name, ts_us, dur_us, stats) events on one line."""
    stat_ids: dict[str, int] = {}
    meta_ids: dict[str, int] = {}
    ev_bytes = b""
    for name, ts, dur, stats in events:
        mid = meta_ids.setdefault(name, len(meta_ids) + 1)
        body = _f(1, mid) + _f(2, int(ts * 1e6)) + _f(3, int(dur * 1e6))
        for k, v in stats.items():
            sid = stat_ids.setdefault(k, len(stat_ids) + 1)
            body += _f(4, _stat(sid, v))
        ev_bytes += _f(4, body)
    line = _f(1, 7) + _f(2, "worker") + _f(3, 1000) + ev_bytes
    plane = _f(1, 0) + _f(2, "/host:CPU") + _f(3, line)
    for name, mid in meta_ids.items():
        plane += _f(4, _f(1, mid) + _f(2, _f(1, mid) + _f(2, name)))
    for name, sid in stat_ids.items():
        plane += _f(5, _f(1, sid) + _f(2, _f(1, sid) + _f(2, name)))
    return _f(1, plane)


# --------------------------------------------------------------------------------------
# every shared profile parses; counts agree with the raw protobuf
# --------------------------------------------------------------------------------------

XPLANE_FILES = [
    "gfx950_jax_te_fused_attn_train.xplane.pb",
    "jax_cpu_remat_block1.xplane.pb",
    "jax_cpu_remat_full.xplane.pb",
    "jax_cpu_remat_none.xplane.pb",
    "mi300_jax_attention.xplane.pb",
    "mi300_jax_conv.xplane.pb",
    "mi300_jax_gemm.xplane.pb",
    "tpu_v6e_inference.xplane.pb",
    "v100_tf_multiworker.xplane.pb",
]


def test_every_shared_profile_is_listed(shared):
    assert sorted(p.name for p in _xdir(shared).glob("*.pb")) == sorted(XPLANE_FILES)


@pytest.mark.parametrize("name", XPLANE_FILES)
def test_shared_profile_parses(shared, name):
    path = _file(shared, name)
    assert detect_format(str(path)) == "xplane"
    trace = load(str(path))
    space = decode_xspace(path.read_bytes(), str(path))
    ops, kernels, launches = trace.ops, trace.kernels, trace.launches
    assert trace.meta["format"] == "xplane"
    assert ops.height > 0

    # Device activities: exactly the events of the device planes' op/stream lines.
    device_events = 0
    for p in space.planes:
        if p.name.startswith("/device:TPU"):
            device_events += sum(len(ln.events) for ln in p.lines if ln.name == "XLA Ops")
        elif p.name.startswith("/device:GPU"):
            device_events += sum(len(ln.events) for ln in p.lines if ln.name.startswith("Stream"))
    assert kernels.height == device_events

    # Sane values, and every kernel reaches a launch row of its own.
    for df in (ops, kernels, launches):
        if df.height:
            assert df["ts"].is_finite().all() and (df["dur"] >= 0).all()
    if kernels.height:
        assert kernels["correlation"].null_count() == 0
        assert kernels["correlation"].is_in(launches["correlation"].implode()).all()
        assert set(kernels["kind"].unique()) <= {"compute", "communication", "memcpy", "memset"}
    # Nothing unused goes unmentioned: runtime annotations are counted in meta.
    assert isinstance(trace.meta["ignored_events"], dict) and trace.meta["ignored_events"]
    assert all(isinstance(w, str) for w in trace.warnings.lines())


@pytest.mark.parametrize("name", ["mi300_jax_gemm.xplane.pb", "gfx950_jax_te_fused_attn_train.xplane.pb",
                                  "mi300_jax_attention.xplane.pb", "mi300_jax_conv.xplane.pb"])
def test_gpu_kernels_link_to_their_hlo_op(shared, name):
    """Every kernel annotated with an hlo_op reaches, through its launch, an op of that name."""
    path = _file(shared, name)
    space = decode_xspace(path.read_bytes())
    want = []
    for p in space.planes:
        if p.name.startswith("/device:GPU"):
            for ln in p.lines:
                if ln.name.startswith("Stream"):
                    for e in ln.events:
                        st = e.stats or {}
                        want.append(st.get("hlo_op"))
    trace = parse_xplane(str(path))
    linked = link(trace)
    k = linked.kernels.join(linked.ops.select(pl.col("row").alias("op_row"), pl.col("name").alias("op_name")),
                            on="op_row", how="left")
    annotated = sum(1 for h in want if h)
    assert annotated > 0
    hit = k.filter(pl.col("op_name").is_not_null())
    assert hit.height == annotated
    # Kernels not annotated (input transfers) have no op.
    assert k.filter(pl.col("op_name").is_null()).height == len(want) - annotated


def test_gpu_ops_are_executions_not_launches(shared):
    """mi300_jax_gemm runs each jit(dot) program 3 times: 3 ops each, not 1 merged nor one per kernel."""
    trace = parse_xplane(str(_file(shared, "mi300_jax_gemm.xplane.pb")))
    mm = trace.ops.filter(pl.col("matmul_hint"))
    assert mm.height == 18
    assert mm.group_by("dims").len()["len"].to_list() == [3] * 6


# --------------------------------------------------------------------------------------
# decoders: malformed input is a FormatError, never a crash or a hang
# --------------------------------------------------------------------------------------


def test_malformed_files_raise_format_error(tmp_path, shared):
    good = _file(shared, "mi300_jax_gemm.xplane.pb").read_bytes()
    cases = {
        "truncated.xplane.pb": good[: len(good) // 2],
        "garbage.xplane.pb": bytes(range(256)) * 8,
        "huge_length.xplane.pb": _varint(1 << 3 | 2) + _varint(1 << 60) + b"x",
        "long_varint.xplane.pb": _varint(1 << 3) + b"\xff" * 20,
        "group.xplane.pb": _varint(1 << 3 | 3) + b"\x00",
    }
    for fname, data in cases.items():
        p = tmp_path / fname
        p.write_bytes(data)
        with pytest.raises(FormatError):
            decode_xspace(data, str(p))
        with pytest.raises(FormatError):
            parse_xplane(str(p))


def test_deep_nesting_is_bounded():
    # Shapes nest (tuple_shapes); a hostile HloProto nests them 10,000 deep.
    shape = _f(2, 11)
    for _ in range(10_000):
        shape = _f(2, 13) + _f(4, shape)
    ins = _f(1, "x") + _f(2, "tuple") + _f(3, shape)
    module = _f(1, "m") + _f(3, _f(1, "c") + _f(2, ins))
    with pytest.raises(FormatError):
        decode_hlo_proto(_f(1, module))


def test_empty_profile_parses_with_a_warning(tmp_path):
    p = tmp_path / "empty.xplane.pb"
    p.write_bytes(b"")
    trace = parse_xplane(str(p))
    assert trace.ops.height == 0 and trace.kernels.height == 0
    assert any("no XLA op executions" in w for w in trace.warnings.lines())


def test_hand_made_cpu_profile(tmp_path):
    """CPU ops, a StepTraceAnnotation, an unknown-stat event; values read back exactly."""
    events = [
        ("train", 0.0, 100.0, {"step_num": 7}),
        ("dot.1", 10.0, 5.0, {"hlo_op": "dot.1", "hlo_module": "jit_f", "program_id": 3}),
        ("ThunkExecutor::Execute", 9.0, 20.0, {}),
    ]
    p = tmp_path / "cpu.xplane.pb"
    p.write_bytes(_cpu_profile(events))
    trace = parse_xplane(str(p))
    assert trace.ops["name"].to_list() == ["dot.1"]
    assert trace.ops["ts"][0] == pytest.approx(1.0 + 10.0)  # line at 1000 ns
    assert trace.ops["dur"][0] == pytest.approx(5.0)
    assert trace.steps.select("step", "name").rows() == [(7, "train#7")]
    # No HLO module in the profile: said once per op, never silently.
    assert any("HLO module is not in the profile" in w for w in trace.warnings.lines())


# --------------------------------------------------------------------------------------
# JAX remat on CPU: dots per step, and FLOPs per phase from the model's dimensions
# --------------------------------------------------------------------------------------

B, T, D, H, F, V = 4, 64, 128, 4, 512, 256
BT, HD = B * T, D // H
QKV, SCORES, PV, PROJ = 2 * BT * D * 3 * D, 2 * B * H * T * T * HD, 2 * B * H * T * T * HD, 2 * BT * D * D
UP, DOWN, HEAD = 2 * BT * D * F, 2 * BT * F * D, 2 * BT * D * V
BLOCK = QKV + SCORES + PV + PROJ + UP + DOWN
FORWARD = 2 * BLOCK + HEAD  # per step
BACKWARD = 2 * FORWARD  # dgrad + wgrad of every forward matmul
# Executed beyond the no-remat program (README: 1 extra dot for block1, 6 for full). Reading
# the HLO: block1's extra dot is its MLP up-projection (XLA's CSE merged the other four
# recomputed dots with their forward twins); with both blocks checkpointed, block0 keeps
# its forward and recomputes QKV, scores, PV, projection and up-projection, block1 as above.
EXTRA = {"none": 0, "block1": UP, "full": QKV + SCORES + PV + PROJ + UP + UP}
NAMED = {"none": (13, 0, 26), "block1": (9, 5, 26), "full": (9, 10, 26)}  # fwd, rematted, bwd


def _remat(shared, variant):
    trace = parse_xplane(str(_file(shared, f"jax_cpu_remat_{variant}.xplane.pb")))
    ops = _ops_with_steps(trace)
    return trace, ops.with_columns(phase=tag(ops))


@pytest.mark.parametrize("variant", ["none", "block1", "full"])
def test_remat_dots_per_step_by_name(shared, variant):
    trace, ops = _remat(shared, variant)
    assert trace.steps["step"].to_list() == [0, 1, 2]
    dots = ops.filter(pl.col("matmul_hint"))
    assert dots["flops_hint"].null_count() == 0
    named = dots.with_columns(
        kind=pl.when(pl.col("scope").str.contains("/rematted_computation/"))
        .then(pl.lit("remat"))
        .when(pl.col("scope").str.contains(r"transpose\(jvp\("))
        .then(pl.lit("bwd"))
        .otherwise(pl.lit("fwd"))
    )
    fwd, remat, bwd = NAMED[variant]
    for step in (0, 1, 2):
        s = named.filter(pl.col("step") == step)
        got = {k: n for k, n in s.group_by("kind").len().iter_rows()}
        assert got.get("fwd", 0) == fwd and got.get("remat", 0) == remat and got.get("bwd", 0) == bwd
        # FLOPs from HLO shapes: every dot executed, at the model's dimensions.
        assert s["flops_hint"].sum() == FORWARD + BACKWARD + EXTRA[variant]


@pytest.mark.parametrize("variant", ["none", "block1", "full"])
def test_remat_phase_flops_after_correction(shared, variant):
    _, ops = _remat(shared, variant)
    dots = ops.filter(pl.col("matmul_hint"))
    for step in (0, 1, 2):
        by = {p: (n, f) for p, n, f in dots.filter(pl.col("step") == step)
              .group_by("phase").agg(pl.len(), pl.col("flops_hint").sum()).iter_rows()}
        assert by["forward"] == (13, FORWARD)
        assert by["backward"] == (26, BACKWARD)
        assert by.get("recompute", (0, 0)) == ({"none": 0, "block1": 1, "full": 6}[variant], EXTRA[variant])
        assert set(by) <= {"forward", "backward", "recompute"}


def test_remat_optimizer_and_unscoped_ops(shared):
    _, ops = _remat(shared, "none")
    opt = ops.filter(pl.col("phase") == "optimizer")
    assert opt.height and (opt["scope"] == "jit(train_step)/sub").all()  # the SGD update
    assert ops.filter(pl.col("scope").is_null())["phase"].null_count() == ops.filter(pl.col("scope").is_null()).height


# --------------------------------------------------------------------------------------
# TPU v6e inference: no dots, a communication all-reduce, the compiler's flops stat
# --------------------------------------------------------------------------------------


def test_tpu_v6e_inference(shared):
    trace = parse_xplane(str(_file(shared, "tpu_v6e_inference.xplane.pb")))
    ops, kernels = trace.ops, trace.kernels
    assert not ops["matmul_hint"].any()
    ar = kernels.filter(pl.col("name").str.starts_with("all-reduce"))
    assert ar.height == 12 and (ar["kind"] == "communication").all()  # 3 psums x 4 chips
    assert (ar["collective"] == "all-reduce").all()
    assert set(kernels.filter(pl.col("kind") == "communication")["name"].unique()) == {"all-reduce"}
    copies = kernels.filter(pl.col("name").str.contains(r"^copy-(start|done)"))
    assert copies.height and (copies["kind"] == "memcpy").all()
    # The compiler's flops stat: one add per element of f32[5,1024,1024,256].
    add = ops.filter(pl.col("name").str.starts_with("broadcast_add_fusion"))
    assert add.height and (add["flops_hint"] == 5 * 1024 * 1024 * 256).all()
    assert (add["bytes_hint"] == 2 * 5 * 1024 * 1024 * 256 * 4).all()  # read a, write out
    assert trace.meta["xla_device"] == "TPU v6 Lite"
    hw, _ = detect_xla(trace.meta["xla_device"])
    assert hw is not None and hw.key == "tpu-v6e"
    assert trace.meta["devices"] == 4
    # Each TPU op is its own device activity and links to itself. The profile has 183
    # zero-length ops, some sharing an instant with another zero-length op: those may swap
    # (no device time or FLOPs move: FLOPs are on ops, both are zero-length).
    linked = link(trace)
    k = linked.kernels.join(linked.ops.select(pl.col("row").alias("op_row"), pl.col("name").alias("op_name"),
                                              pl.col("ts").alias("op_ts"), pl.col("pid").alias("op_pid"),
                                              pl.col("flops_hint")),
                            on="op_row", how="left")
    assert k["op_row"].null_count() == 0
    assert (k["op_ts"] == k["ts"]).all() and (k["op_pid"] == k["pid"]).all()
    swapped = k.filter(pl.col("op_name") != pl.col("name"))
    assert (swapped["dur"] == 0).all()
    assert kernels.filter(pl.col("dur") == 0).height == 183


# --------------------------------------------------------------------------------------
# MI300 GEMMs and convolution: FLOPs from HLO shapes, checked by hand
# --------------------------------------------------------------------------------------


def test_mi300_gemm_flops_from_shapes(shared):
    trace = parse_xplane(str(_file(shared, "mi300_jax_gemm.xplane.pb")))
    mm = trace.ops.filter(pl.col("matmul_hint"))
    import orjson

    seen = set()
    for dims, types, flops in mm.select("dims", "types", "flops_hint").iter_rows():
        (m, k), (k2, n) = orjson.loads(dims)
        assert k == k2
        assert flops == 2 * m * n * k
        assert orjson.loads(types) == ["c10::BFloat16", "c10::BFloat16"]
        seen.add((m, k, n))
    assert seen == {(256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 4096, 8192),
                    (2048, 8192, 2048), (16384, 1024, 4096)}
    total = 3 * 2 * (256**3 + 1024**3 + 4096**3 + 8192 * 4096 * 8192 + 2048 * 8192 * 2048 + 16384 * 1024 * 4096)
    assert mm["flops_hint"].sum() == total


def test_mi300_conv_flops_from_shapes(shared):
    trace = parse_xplane(str(_file(shared, "mi300_jax_conv.xplane.pb")))
    conv = trace.ops.filter(pl.col("matmul_hint"))
    assert conv.height == 5 and (conv["name"] == "cudnn-conv.1.0").all()
    # input f32[1,16,32,60,104] (NCDHW), kernel [5120,16,1,2,2] (OIDHW), output [1,5120,34,31,53]:
    # 2 x output elements x (16 input channels x 1x2x2 window)
    assert (conv["flops_hint"] == 2 * (5120 * 34 * 31 * 53) * (16 * 1 * 2 * 2)).all()


def test_te_fused_attention_is_matmul_with_flops_from_shapes(shared):
    trace = parse_xplane(str(_file(shared, "gfx950_jax_te_fused_attn_train.xplane.pb")))
    attn = trace.ops.filter(pl.col("name").str.starts_with("te_fused_attn"))
    assert attn.height == 20 and attn["matmul_hint"].all() and attn["flops_hint"].null_count() == 0
    assert not any("FLOPs not derived" in w for w in trace.warnings.lines())
    # Its forward and backward are told apart by the name stack.
    ph = tag(trace.ops)
    got = trace.ops.with_columns(phase=ph).filter(pl.col("name").str.starts_with("te_fused_attn"))
    assert set(got.filter(pl.col("name").str.contains("forward"))["phase"]) == {"forward"}
    assert set(got.filter(pl.col("name").str.contains("backward"))["phase"]) == {"backward"}


def test_tpu_collectives_kind_and_size_against_xprof_hlo_stats(shared, tmp_path):
    """XLA names its collectives by HLO opcode, with dashes (`all-reduce`): xprof's hlo_stats puts the TPU profile's
    12 executions in category `all-reduce`, and the collectives here are those 12, of kind allreduce (a name read
    for PyTorch's spellings alone gave them no kind). XLA records no message size: each moves its operand, whose
    shape xprof's HLO text gives (`all-reduce(f32[5,1024,1024,256]...`): elements x 4 bytes."""
    import math
    import re

    from traceflops.run.load import analyze
    from traceflops.views.collectives import collectives

    src = shared / "xplane" / "tpu_v6e_inference.xplane.pb"
    rows = _xprof_hlo_stats(src, tmp_path)
    by_category: dict[str, int] = {}
    for row in rows:
        by_category[row["category"]] = by_category.get(row["category"], 0) + int(row["occurrences"])
    kinds = {"all-reduce": "allreduce", "all-gather": "allgather", "reduce-scatter": "reduce_scatter",
             "all-to-all": "all_to_all"}
    want = {kinds[c]: n for c, n in by_category.items() if c in kinds}
    assert want == {"allreduce": 12}
    (expr,) = {r["hlo_op_expression"] for r in rows if r["category"] == "all-reduce"}
    elem, dims = re.search(r"all-reduce\((\w+)\[([\d,]+)\]", expr).groups()
    message = math.prod(int(d) for d in dims.split(",")) * {"f32": 4, "bf16": 2, "f16": 2}[elem]
    c = collectives(analyze(str(src)))
    assert dict(c.group_by("kind").len().iter_rows()) == want
    assert c["bytes"].to_list() == [message] * 12 and message == 5 * 1024 * 1024 * 256 * 4


def test_mi300_gemm_against_xprof_hlo_stats(shared, tmp_path):
    """Peer check with xprof's hlo_stats tool (pip install tensorboard-plugin-profile), on a copy.

    xprof agrees on executions per (program, HLO op). It reports FLOPs only for the
    Triton GEMM fusion (its cost analysis gives cuBLAS custom calls 0): there they match.
    """
    src = _file(shared, "mi300_jax_gemm.xplane.pb")
    rows = _xprof_hlo_stats(src, tmp_path)

    trace = parse_xplane(str(src))
    ops = trace.ops
    # Our op rows carry no program id; the module's HLO op names repeat across programs,
    # so compare per HLO op name, summed over programs.
    ours = dict(ops.group_by("name").len().iter_rows())
    theirs: dict[str, int] = {}
    for row in rows:
        theirs[row["hlo_op_name"]] = theirs.get(row["hlo_op_name"], 0) + int(row["occurrences"])
    assert ours == theirs
    for row in rows:
        flops = row["model_flop_rate"] * 1e9 * row["total_time"] * 1e-6
        if flops:
            mine = ops.filter(pl.col("name") == row["hlo_op_name"])["flops_hint"].sum()
            assert mine == pytest.approx(flops, rel=1e-3)


def _xprof_hlo_stats(src: Path, tmp_path: Path) -> list[dict]:
    """xprof's hlo_stats rows for a copy of src (xprof writes cache files beside its input)."""
    r2t = pytest.importorskip("xprof.convert.raw_to_tool_data")
    import json
    import shutil

    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    copy = run / "host.xplane.pb"
    shutil.copy(src, copy)
    data, _ = r2t.xspace_to_tool_data([str(copy)], "hlo_stats", {})
    table = json.loads(data)
    cols = [c["id"] for c in table["cols"]]
    return [dict(zip(cols, [c.get("v") for c in r["c"]])) for r in table["rows"]]


def _xprof_flops_by_op(rows: list[dict]) -> tuple[dict[str, float], dict[str, int]]:
    """FLOPs and occurrences per HLO op name, summed over programs.

    hlo_stats has no FLOPs column: model_flop_rate (GFLOP/s) x total_time (us) is the op's
    model FLOPs over all its occurrences.
    """
    flops: dict[str, float] = {}
    n: dict[str, int] = {}
    for row in rows:
        name = row["hlo_op_name"]
        flops[name] = flops.get(name, 0.0) + row["model_flop_rate"] * 1e9 * row["total_time"] * 1e-6
        n[name] = n.get(name, 0) + int(row["occurrences"])
    return flops, n


def test_gfx950_te_attention_against_xprof_hlo_stats(shared, tmp_path):
    """Peer check with xprof's hlo_stats on the gfx950 Transformer Engine training profile.

    The Triton GEMM fusions: FLOPs from shapes equal xprof's (its cost analysis), per op
    summed over its 5 executions (2 x 4096 x 6144 x 2048 = 103079215104 each). The TE
    fused-attention custom calls: xprof gives them 0 FLOPs (custom calls are opaque to its
    cost analysis); traceflops derives them from the qkv shape. (xprof's occurrences for these
    count kernels, 2 per forward and 5 per backward execution, not executions: not compared.)
    """
    src = _file(shared, "gfx950_jax_te_fused_attn_train.xplane.pb")
    theirs, n_theirs = _xprof_flops_by_op(_xprof_hlo_stats(src, tmp_path))
    ops = parse_xplane(str(src)).ops

    gemm = ops.filter(pl.col("name").str.starts_with("gemm_fusion_dot"))
    ours = {name: (n, f) for name, n, f in
            gemm.group_by("name").agg(pl.len(), pl.col("flops_hint").sum()).iter_rows()}
    assert len(ours) == 5 and gemm["matmul_hint"].all() and gemm["flops_hint"].null_count() == 0
    assert {k for k in theirs if k.startswith("gemm_fusion_dot")} == set(ours)
    for name, (n, f) in ours.items():
        assert n == n_theirs[name] == 5
        assert theirs[name] > 0
        assert f == pytest.approx(theirs[name], rel=1e-2), name
    total = sum(f for _, f in ours.values())
    assert total == pytest.approx(sum(theirs[k] for k in ours), rel=1e-2)
    assert total == 5 * 515396075520

    attn = ops.filter(pl.col("name").str.starts_with("te_fused_attn"))
    names = set(attn["name"])
    assert names == {k for k in theirs if k.startswith("te_fused_attn")} and len(names) == 4
    for name in names:
        assert theirs[name] == 0, name
    assert attn["flops_hint"].null_count() == 0 and (attn["flops_hint"] > 0).all()


def test_tpu_v6e_inference_against_xprof_hlo_stats(shared, tmp_path):
    """Peer check with xprof's hlo_stats on the TPU v6e profile: the parser's per-op FLOPs
    (the compiler's flops stat) equal xprof's, op by op, and so do the occurrences."""
    src = _file(shared, "tpu_v6e_inference.xplane.pb")
    theirs, n_theirs = _xprof_flops_by_op(_xprof_hlo_stats(src, tmp_path))
    ops = parse_xplane(str(src)).ops
    assert ops["flops_hint"].null_count() == 0

    per_op = ops.group_by("name").agg(pl.len(), pl.col("flops_hint").sum(),
                                      pl.col("flops_hint").n_unique().alias("distinct"))
    assert set(per_op["name"]) == set(theirs)
    for name, n, f, distinct in per_op.iter_rows():
        assert distinct == 1, name  # every execution of an op has the same FLOPs
        assert n == n_theirs[name], name
        assert f == pytest.approx(theirs[name], rel=1e-2, abs=0.5), name
        assert f == round(theirs[name]), name  # integral: exact
    # 3 x 400 adds of f32[5,1024,1024,256], 12 all-reduces of the same size
    assert sum(theirs.values()) == pytest.approx(1626718863360, rel=1e-12)
    assert per_op["flops_hint"].sum() == 1626718863360 == (3 * 400 + 12) * 5 * 1024 * 1024 * 256


# --------------------------------------------------------------------------------------
# xla_phases on small frames
# --------------------------------------------------------------------------------------


def test_logical_name():
    # a remat copy and its forward twin share one logical name, however jax wrapped them
    assert logical_name("jit(f)/transpose(jvp(b))/jvp(b)/checkpoint/rematted_computation/mlp/dot_general") == \
        logical_name("jit(f)/jvp(b)/mlp/dot_general") == "jit(f)/b/mlp/dot_general"
    # jax 0.10.2: 'jvp()' components and einsum names inside jvp(...)
    assert logical_name("jit(step)/transpose(jvp(jvp()))/checkpoint/rematted_computation/dot_general") == \
        logical_name("jit(step)/jvp()/dot_general") == "jit(step)/dot_general"
    assert logical_name("jit(step)/transpose(jvp(jvp()))/checkpoint/rematted_computation/bhqd,bhkd->bhqk") == \
        logical_name("jit(step)/jvp(bhqd,bhkd->bhqk)") == "jit(step)/bhqd,bhkd->bhqk"


def _frame(rows):
    return pl.DataFrame(
        rows, schema={"name": pl.Utf8, "scope": pl.Utf8, "ts": pl.Float64, "dims": pl.Utf8, "types": pl.Utf8, "step": pl.Int64},
        orient="row",
    )


R = "jit(f)/transpose(jvp(b))/jvp(b)/checkpoint/rematted_computation/mlp/dot_general"
FWD = "jit(f)/jvp(b)/mlp/dot_general"
BWD = "jit(f)/transpose(jvp(b))/mlp/dot_general"


def test_tag_cse_stand_in_and_extra_copy():
    ops = _frame([
        ("dot.1", R, 1.0, "[[4,8]]", None, 0),  # CSE'd: the only execution of this logical op
        ("dot.2", BWD, 5.0, "[[4,8]]", None, 0),
        ("dot.3", FWD, 1.0, "[[4,16]]", None, 0),  # forward kept ...
        ("dot.4", R.replace("mlp", "mlp"), 6.0, "[[4,16]]", None, 0),  # ... so this copy is recompute
    ])
    assert tag(ops).to_list() == ["forward", "backward", "forward", "recompute"]


def test_tag_scan_counts_per_step():
    # Under scan the forward body runs L=3 times and the rematerialized body 3 times: all recompute.
    rows = [("dot.1", FWD, float(i), "[[4,8]]", None, 0) for i in range(3)]
    rows += [("dot.9", R, 10.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    assert tag(_frame(rows)).to_list() == ["forward"] * 3 + ["recompute"] * 3
    # Only rematerialized copies of one instruction, 3 times (CSE inside one loop): they are the forward.
    rows = [("dot.9", R, 10.0 + i, "[[4,8]]", None, 0) for i in range(3)]
    assert tag(_frame(rows)).to_list() == ["forward"] * 3
    # Two copies of the logical op and no forward: the earlier one stands in, the later is recompute.
    rows = [("dot.9", R, 2.0, "[[4,8]]", None, 0), ("dot.8", R, 1.0, "[[4,8]]", None, 0)]
    assert tag(_frame(rows)).to_list() == ["recompute", "forward"]


def test_tag_per_step_and_shapes():
    # The same name at another shape is another logical op; each step decides on its own.
    ops = _frame([
        ("dot.1", FWD, 1.0, "[[4,8]]", None, 0),
        ("dot.2", R, 2.0, "[[4,8]]", None, 0),
        ("dot.3", R, 3.0, "[[2,8]]", None, 0),
        ("dot.2", R, 12.0, "[[4,8]]", None, 1),
    ])
    assert tag(ops).to_list() == ["forward", "recompute", "forward", "forward"]


def test_tag_xla_remat_suffix_and_optimizer_and_nulls():
    ops = _frame([
        ("fusion.3", FWD, 1.0, "[[4,8]]", None, 0),
        ("fusion.3.remat", FWD, 5.0, "[[4,8]]", None, 0),
        ("fusion.4", BWD, 6.0, "[[4,8]]", None, 0),
        ("subtract.1", "jit(f)/sub", 7.0, None, None, 0),
        ("copy.2", None, 8.0, None, None, 0),
        ("add.1", "jit(g)/add", 9.0, None, None, 0),  # inference program: forward
    ])
    assert tag(ops).to_list() == ["forward", "recompute", "backward", "optimizer", None, "forward"]
