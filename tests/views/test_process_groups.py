"""Process groups on synthetic traces with known answers: pg_config, a collective's group (NCCL args, a gloo
thread), its kind, bytes and role, matching across ranks by group, clocks aligned through other ranks, and a CPU
thread blocked in a collective counted as exposed communication."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from tests.builders import EVAL, Builder
from traceflops.run.load import analyze
from traceflops.views.collectives import collectives, group_role, thread_groups
from traceflops.views.job import job_view, summarize

F32 = ["float", "float", "", "Scalar", "Scalar"]
MAIN = 10
WORLD = 4
# a 2x2 init_device_mesh(("dp", "tp")): rank = 2 * dp_index + tp_index
DP = {0: ("1", [0, 2]), 2: ("1", [0, 2]), 1: ("2", [1, 3]), 3: ("2", [1, 3])}
TP = {0: ("3", [0, 1]), 1: ("3", [0, 1]), 2: ("4", [2, 3]), 3: ("4", [2, 3])}
OFFSET = {0: 0.0, 1: 1_500.0, 2: -2_000.0, 3: 4_000.0}  # each rank's clock error, µs
N, M = 1024, 3072  # an all-gather's shard; the TP all-reduce's elements


def cpu_builder(rank: int | None = None, groups: list | None = None) -> Builder:
    b = Builder(pid=100 + (rank or 0), main_tid=MAIN, device_properties=[])
    if rank is not None:
        b.distributed = {"backend": "gloo", "rank": rank, "world_size": WORLD,
                         **({"pg_config": groups} if groups is not None else {})}
    return b


def mesh_groups(rank: int) -> list[dict]:
    cfg = lambda name, desc, ranks: {"pg_name": name, "pg_desc": desc, "backend_config": "cpu:gloo,cuda:gloo",
                                     "pg_size": len(ranks), "ranks": ranks}
    return [cfg("0", "default_pg", [0, 1, 2, 3]), cfg(DP[rank][0], "mesh_dp", DP[rank][1]), cfg(TP[rank][0], "mesh_tp", TP[rank][1])]


def gloo(b: Builder, name: str, tid: int, ts: float, end: float, dims: list, dtype: str = "float"):
    b.op(name, ts, end - ts, tid=tid, cat="user_annotation", **{"Input Dims": dims, "Input type": [dtype]})


def mesh_rank(rank: int, steps: int = 2) -> Builder:
    """One rank of a 2x2 mesh, per step: FSDP's all-gather and reduce-scatter and an int64 all-reduce on dp (runloop
    threads 500, 501), the TP all-reduce on tp (thread 521, created after dp's); each ends at the same true instant
    on its group's ranks, rank r arriving 10·r µs after rank 0."""
    b = cpu_builder(rank, mesh_groups(rank))
    o = OFFSET[rank]
    for i in range(steps):
        t0 = 10_000.0 + 1_000.0 * i + o
        late = 10.0 * rank
        b.annotation(f"ProfilerStep#{i}", t0, 999.0)
        b.op("c10d::_allgather_base_", t0 + 10, 5, **{"Input Dims": [[2 * N], [N], [], [], []], "Input type": F32})
        gloo(b, "gloo:all_gather", 500, t0 + 20 + late, t0 + 300, [[N]])
        b.op("c10d::allreduce_", t0 + 400, 5, **{"Input Dims": [[[32, 96]], [], [], [], [], []],
                                                  "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})
        gloo(b, "gloo:all_reduce", 521, t0 + 405 + late, t0 + 600, [[32, 96]])
        b.op("c10d::allreduce_", t0 + 650, 5, **{"Input Dims": [[[1]], [], [], [], [], []],
                                                  "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})
        gloo(b, "gloo:all_reduce", 501, t0 + 655 + late, t0 + 700, [[1]], "long int")
        b.op("c10d::_reduce_scatter_base_", t0 + 720, 5, **{"Input Dims": [[N], [2 * N], [], [], [], []],
                                                             "Input type": ["float", "float", "", "", "Scalar", "Scalar"]})
        gloo(b, "gloo:all_reduce", 500, t0 + 725 + late, t0 + 800, [[2 * N]])
    return b


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    d = tmp_path_factory.mktemp("mesh")
    return [analyze(mesh_rank(r).write(Path(d) / f"rank{r}.json.gz")) for r in range(WORLD)]


# ------------------------------------------------------------------ pg_config


def test_pg_config_is_read_and_hostile_entries_are_counted(tmp_path):
    b = cpu_builder(0, mesh_groups(0) + [
        {"pg_name": "9", "pg_size": -1},                          # a size out of range
        {"pg_name": "10", "pg_size": 2, "ranks": [0, -5]},         # a rank out of range
        {"pg_name": "11", "pg_size": 3, "ranks": [0, 1]},          # ranks that do not number its size
        {"pg_desc": "no name", "pg_size": 2},                      # no name
        {"pg_name": "x" * 1000, "pg_size": 2},                     # a name past the bound
        "not an entry",
        {"pg_name": "12", "pg_size": 2, "ranks": "[0, 1]"},        # ranks as JSON text: kept
    ])
    b.annotation("ProfilerStep#0", 0, 100)
    a = analyze(b.write(tmp_path / "rank0.json.gz"))
    got = a.meta["process_groups"]
    assert [(g["name"], g["desc"], g["size"], g["ranks"]) for g in got] == [
        ("0", "default_pg", 4, [0, 1, 2, 3]), ("1", "mesh_dp", 2, [0, 2]), ("3", "mesh_tp", 2, [0, 1]), ("12", None, 2, [0, 1])]
    assert any("pg_config entries without a usable name, size or ranks" in w and "(6)" in w for w in a.warnings)


def test_a_group_role_comes_from_its_description():
    # DeviceMesh dimensions, torchtitan's (dp_shard, dp_replicate, dp_shard_cp are data parallel; a name of one's own
    # stays itself) and Megatron-Core's group descriptions (a combined group has no one role)
    assert [group_role(d) for d in ("default_pg", "mesh_dp", "mesh_tp", "mesh_pp", "mesh_ep", "mesh_cp", "mesh_dp_shard",
                                    "mesh_dp_replicate", "mesh_dp_shard_cp", "mesh_experts", "undefined", None)] == \
        ["world", "dp", "tp", "pp", "ep", "cp", "dp", "dp", "dp", "experts", None, None]
    assert [group_role(d) for d in ("TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP",
                                    "DATA_PARALLEL_GROUP_WITH_CP_GLOO", "CONTEXT_PARALLEL_GROUP", "EXPERT_MODEL_PARALLEL_GROUP",
                                    "EXPERT_TENSOR_PARALLEL_GROUP", "MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP")] == \
        ["tp", "pp", "dp", "dp", "cp", "ep", "tp", None, None]


# ------------------------------------------------------------------ a gloo work's group, kind and bytes


def test_thread_groups_follow_creation_order_and_size_hints():
    # rank 0 of the mesh: default (4), dp (2), tp (2); dp's threads all-gather over 2 ranks, tp's all-reduce
    assert thread_groups([9863, 9864, 9870], [{2}, {2}, set()], [4, 2, 2]) == [1, 1, 2]
    # a thread whose work gathers over 4 ranks is the world's; a thread far from it, without a hint, goes to the
    # latest group (the world group is made first, a parallelism API's groups after it)
    assert thread_groups([100, 101, 120], [{4}, set(), set()], [4, 2, 2]) == [0, 0, 2]
    # threads far apart are different groups; close ones one group
    assert thread_groups([100, 101, 120, 121, 140], [set()] * 5, [4, 2, 2]) == [0, 0, 1, 1, 2]
    assert thread_groups([5], [{4}], [2, 2]) is None  # no group of that size


def test_every_gloo_collective_carries_its_group(mesh):
    for rank, a in enumerate(mesh):
        c = collectives(a)
        dp, tp = DP[rank], TP[rank]
        got = {(r["name"], r["bytes"]): (r["pg"], r["role"], r["group_size"], r["group_ranks"]) for r in c.iter_rows(named=True)}
        dp_row = (dp[0], "dp", 2, str(dp[1]).replace(" ", ""))
        assert got[("gloo:all_gather", 2 * N * 4)] == dp_row
        assert got[("gloo:all_reduce", 32 * 96 * 4)] == (tp[0], "tp", 2, str(tp[1]).replace(" ", ""))
        assert got[("gloo:all_reduce", 8)] == dp_row  # int64: 8-byte elements
        assert got[("gloo:all_reduce", 2 * N * 4)] == dp_row
        assert c.filter(pl.col("pg") == dp[0])["seq"].to_list() == list(range(6))


def test_a_reduce_scatter_run_as_an_all_reduce_takes_its_calls_kind(mesh):
    c = collectives(mesh[0])
    assert c.filter(pl.col("bytes") == 2 * N * 4).sort("ts")["kind"].to_list() == ["allgather", "reduce_scatter"] * 2
    assert set(c.filter(pl.col("bytes") == 8)["kind"]) == {"allreduce"}


def test_send_and_recv_are_sendrecv_and_their_wait_is_communication(tmp_path):
    b = cpu_builder(0, mesh_groups(0)[:1])
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("c10d::send", 100, 300, **{"Input Dims": [[[10]], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]})
    gloo(b, "gloo:send", MAIN, 110, 380, [[10]], "long int")  # run on the calling thread, inside its call
    b.op("c10d::recv_", 500, 300, **{"Input Dims": [[[10]], [], [], []], "Input type": ["TensorList", "", "Scalar", "Scalar"]})
    gloo(b, "gloo:recv", MAIN, 510, 780, [[10]], "c10::Half")
    a = analyze(b.write(tmp_path / "rank0.json.gz"))
    c = collectives(a)
    assert c["kind"].to_list() == ["sendrecv", "sendrecv"]
    assert c["bytes"].to_list() == [80, 20]
    assert set(c["pg"]) == {"0"} and set(c["role"]) == {"world"}
    s = a.steps.row(0, named=True)
    assert s["time_communication_exposed"] == pytest.approx(270 + 270)
    assert s["time_other_compute"] == pytest.approx(2 * (10 + 20))


# ------------------------------------------------------------------ NCCL args and pg_config


def test_nccl_group_args_and_pg_config_fill_a_collective(tmp_path):
    b = Builder(distributed={"backend": "nccl", "rank": 1, "world_size": 4, "pg_config": [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "6", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [1, 3]}]})
    b.annotation("ProfilerStep#0", 0, 2000)
    tp = {"Collective name": "allreduce", "In msg nelems": 100, "Out msg nelems": 100, "dtype": "Long", "Process Group Name": "5",
          "Process Group Description": "mesh_tp", "Process Group Ranks": "[0, 1]", "Group size": 2}
    b.kernel("ncclDevKernel_AllReduce_Sum_i64_RING_LL", 10, 100, 50, stream=20, **tp, Seq=41)
    b.kernel("ncclDevKernel_AllReduce_Sum_i64_RING_LL", 20, 200, 50, stream=20, **tp, Seq=42)
    b.kernel("ncclDevKernel_AllGather_RING_LL", 30, 300, 50, stream=21, **{"Collective name": "_allgather_base",
             "In msg nelems": 10, "Out msg nelems": 20, "dtype": "BFloat16", "Process Group Name": "6"})
    a = analyze(b.write(tmp_path / "rank1.json.gz"))
    c = collectives(a).sort("ts")
    assert c.select("pg", "seq", "role", "group_size", "group_ranks", "bytes").rows() == [
        ("5", 41, "tp", 2, "[0,1]", 800), ("5", 42, "tp", 2, "[0,1]", 800), ("6", 0, "dp", 2, "[1,3]", 40)]


@pytest.mark.parametrize("dtype, size", [("long int", 8), ("long", 8), ("Long", 8), ("int64", 8), ("int", 4), ("short int", 2),
                                         ("Short", 2), ("signed char", 1), ("unsigned char", 1), ("bool", 1), ("double", 8),
                                         ("c10::Half", 2), ("BFloat16", 2), ("c10::complex<float>", 8), ("ComplexDouble", 16),
                                         ("long unsigned int", 8), ("unsigned long", 8), ("UInt16", 2), ("short unsigned int", 2)])
def test_every_element_type_spelling_has_its_size(dtype, size):
    from traceflops.core.dtypes import collective_itemsize

    assert collective_itemsize(dtype) == size


# ------------------------------------------------------------------ the job


def test_matching_is_by_group_among_its_members(mesh):
    j = job_view([summarize(a) for a in mesh])
    c = j.collectives
    # per step: 3 dp collectives in each dp group, 1 tp in each tp group; 2 steps
    assert c.group_by("pg").len().sort("pg").rows() == [("1", 6), ("2", 6), ("3", 2), ("4", 2)]
    assert set(c["ranks"]) == {2} and set(c["group_size"]) == {2}
    assert j.totals["collectives_matched"] == 16
    # the bus factor for 2 ranks: an all-reduce moves 2(n-1)/n = 1, a gather or scatter (n-1)/n = 1/2
    assert dict(c.select("kind", "bus_factor").unique().iter_rows()) == {"allgather": 0.5, "reduce_scatter": 0.5, "allreduce": 1.0}
    assert set(c["role"]) == {"dp", "tp"}
    assert not [w for w in j.warnings if "share no matched collective" in w or "recorded different" in w]


def test_clocks_align_through_other_ranks(mesh):
    """Rank 3 shares no group with rank 0: it is aligned through ranks 1 and 2. Collectives end together in true
    time, so every offset is recovered exactly."""
    j = job_view([summarize(a) for a in mesh])
    for r in range(WORLD):
        assert j.clock["offsets_us"][str(r)] == pytest.approx(OFFSET[0] - OFFSET[r], abs=1e-6)
    assert j.clock["residual_skew_us"] == pytest.approx(0.0, abs=1e-6)
    # arrival skew: rank r arrives 10·r µs after rank 0; the last member is the higher rank
    first = j.collectives.filter((pl.col("pg") == "1") & (pl.col("seq") == 0)).row(0, named=True)
    assert first["arrival_skew_us"] == pytest.approx(20.0) and first["last_rank"] == 2


def test_a_rank_no_collective_reaches_is_a_warning(mesh):
    # ranks 0 and 1 share tp; rank 3 keeps only its tp group's collectives, whose other member (2) is not given
    three = summarize(mesh[3])
    three = replace(three, collectives=three.collectives.filter(pl.col("pg") == "4"))
    j = job_view([summarize(mesh[0]), summarize(mesh[1]), three])
    assert any("ranks [3] share no matched collective" in w for w in j.warnings)
    assert j.clock["offsets_us"]["3"] == 0.0


def test_members_that_recorded_different_numbers_are_a_warning(mesh, tmp_path):
    short = analyze(mesh_rank(2, steps=1).write(tmp_path / "rank2.json.gz"))
    j = job_view([summarize(mesh[0]), summarize(short)])
    assert any(w.startswith("group 1: its ranks recorded different numbers") for w in j.warnings)


def test_without_pg_config_a_gloo_collective_keeps_the_unknown_group(tmp_path):
    b = cpu_builder(0)
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("c10d::allreduce_", 10, 5, **{"Input Dims": [[[4]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})
    gloo(b, "gloo:all_reduce", 500, 20, 100, [[4]])
    c = collectives(analyze(b.write(tmp_path / "rank0.json.gz")))
    assert c.select("pg", "group_size", "pg_desc", "role", "group_ranks", "bytes").rows() == [("?", WORLD, None, None, None, 16)]


# ------------------------------------------------------------------ a CPU thread blocked in a collective


def test_a_functional_wait_is_exposed_communication_by_phase(tmp_path):
    """Step [0, 1000): an all-reduce call [50, 60) whose work runs [55, 300) on the backend thread; aten::gelu
    [100, 600) blocks in `_c10d_functional::wait_tensor` [200, 500) (forward); a backward node [700, 900) blocks in
    another wait [720, 820). Compute: 10 + 100 + 100 + 20 + 80 = 310; exposed communication: [60, 100) and
    [200, 500) and [720, 820) = 440; idle the rest, 250."""
    b = cpu_builder(0, mesh_groups(0)[:1])
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("c10d::allreduce_", 50, 10, **{"Input Dims": [[[4]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]})
    gloo(b, "gloo:all_reduce", 500, 55, 300, [[4]])
    b.op("aten::gelu", 100, 500)
    b.op("_c10d_functional::wait_tensor", 200, 300, **{"Input Dims": [[4]], "Input type": ["float"]})
    b.op(EVAL + "MmBackward0", 700, 200)
    b.op("_c10d_functional::wait_tensor", 720, 100, **{"Input Dims": [[4]], "Input type": ["float"]})
    a = analyze(b.write(tmp_path / "rank0.json.gz"))
    s = a.steps.row(0, named=True)
    assert s["window"] == pytest.approx(1000.0)
    assert s["time_other_compute"] == pytest.approx(310.0)
    assert s["time_communication_exposed"] == pytest.approx(440.0)
    assert s["time_idle"] == pytest.approx(250.0)
    waits = a.ops.filter(pl.col("name") == "_c10d_functional::wait_tensor").sort("ts")
    assert waits["phase"].to_list() == ["forward", "backward"]


def test_unreadable_group_ranks_are_unknown_not_wrong(tmp_path):
    b = Builder(distributed={"backend": "nccl", "rank": 0, "world_size": 2})
    b.annotation("ProfilerStep#0", 0, 2000)
    common = {"Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4, "dtype": "Float", "Group size": 2}
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 100, 50, stream=20, **common,
             **{"Process Group Name": "7", "Process Group Ranks": "[0, x]"})
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 200, 50, stream=20, **common,
             **{"Process Group Name": "8", "Process Group Ranks": [0, 1]})  # a list, not its text
    c = collectives(analyze(b.write(tmp_path / "rank0.json.gz"))).sort("ts")
    assert c.select("pg", "group_ranks", "role", "group_size").rows() == [("7", None, None, 2), ("8", "[0,1]", None, 2)]


# ------------------------------------------------------------------ NCCL kinds: what was asked, not the kernel's name


def _nccl_rank(tmp_path, rank: int, old_all_to_all: bool) -> str:
    """One rank of a 2-rank NCCL job, as PyTorch records it: a send (`nccl:send` > `record_param_comms` with
    Collective name "send" > an `ncclDevKernel_SendRecv`), then an all-to-all, which NCCL also runs as SendRecv
    kernels; an older PyTorch (the shared DLRM traces) names it only by the call, `nccl:all_to_all`."""
    b = Builder(pid=100 + rank, device=rank, distributed={"backend": "nccl", "rank": rank, "world_size": 2})
    b.device_properties = [dict(b.device_properties[0], id=rank)]
    b.annotation("ProfilerStep#0", 1000, 2000)
    p2p = "send" if rank == 0 else "recv"
    b.op(f"nccl:{p2p}", 1100, 50)
    b.op("record_param_comms", 1105, 40, **{"Collective name": p2p, "In msg nelems": 1024, "Out msg nelems": 1024,
                                            "dtype": "BFloat16", "Process Group Name": "0", "Group size": 2})
    b.kernel("ncclDevKernel_SendRecv", 1110, 1200, 100, stream=21)
    b.op("nccl:all_to_all", 1500, 50)
    named = {} if old_all_to_all else {"Collective name": "all_to_all", "In msg nelems": 64, "Out msg nelems": 64,
                                        "dtype": "Float", "Process Group Name": "0", "Group size": 2}
    b.op("record_param_comms", 1505, 40, **named)
    b.kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 1510, 1600, 60, stream=21)
    return b.write(tmp_path / f"rank{rank}.json.gz")


@pytest.mark.parametrize("old_all_to_all", [False, True], ids=["named", "by_its_call"])
def test_nccl_send_recv_and_all_to_all_kinds(tmp_path, old_all_to_all):
    """A send named "send" is P2P (the name alone matched no kind: it left the pipeline view); an all-to-all run as
    SendRecv kernels is an all-to-all, however it is named (by its kernel it was P2P, and a pipeline's bubble)."""
    paths = [_nccl_rank(tmp_path, r, old_all_to_all) for r in (0, 1)]
    runs = [analyze(p) for p in paths]
    for a in runs:
        assert collectives(a).sort("ts")["kind"].to_list() == ["sendrecv", "all_to_all"]
    p = job_view([summarize(a) for a in runs]).pipeline  # the send's 100 µs on each rank, not the all-to-all's 60
    assert p is not None and p.sort("rank")["p2p_us"].to_list() == [100.0, 100.0]


def test_collective_names_map_to_their_kinds():
    """The names PyTorch records (ProcessGroupNCCL's collective names and its `nccl:*` calls), NCCL's kernels and XLA's
    collective opcodes."""
    from traceflops.views.collectives import kind_of

    want = {
        "send": "sendrecv", "recv": "sendrecv", "nccl:send": "sendrecv", "nccl:recv": "sendrecv",
        "recv_any_source": "sendrecv", "ncclDevKernel_SendRecv": "sendrecv", "gloo:send": "sendrecv",
        "gather": "gather", "nccl:gather": "gather", "scatter": "scatter",
        "allgather": "allgather", "_allgather_base": "allgather", "allgather_into_tensor_coalesced": "allgather",
        "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
        "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "nccl:all_to_all": "all_to_all",
        "allreduce": "allreduce", "nccl:all_reduce_barrier": "allreduce", "broadcast": "broadcast",
        "reduce": "reduce", "nccl:reduce": "reduce", "ncclDevKernel_Reduce_Sum_f32_RING_LL": "reduce",
        "ncclKernel_ReduceScatter_RING_LL_Sum_float": "reduce_scatter",
        "barrier": None, "coalesced": None, "sendfile": None, "reduced": None,
        # XLA's HLO opcodes, async ones as -start ... -done
        "all-reduce": "allreduce", "all-reduce-start": "allreduce", "all-gather-done": "allgather",
        "reduce-scatter": "reduce_scatter", "all-to-all": "all_to_all", "ragged-all-to-all": "all_to_all",
        "collective-broadcast": "broadcast", "collective-permute-start": "collective_permute",
        "recv-done": "sendrecv", "send-start": "sendrecv", "copy-start": None,
    }
    got = pl.DataFrame({"n": list(want)}).select(kind_of(pl.col("n")))[:, 0].to_list()
    assert dict(zip(want, got)) == want


def _nccl_pipeline_rank(tmp_path, rank: int, m: int, peers: bool = True) -> str:
    """One stage of a 2-stage GPipe step of m micro-batches over NCCL, as PyTorch records a transfer
    (torch/csrc/profiler/util.cpp): `record_param_comms` with Collective name send / recv and the peer's global rank as
    text (`Dst Rank` of a send, `Src Rank` of a receive), its kernel an `ncclDevKernel_SendRecv`. Stage 0 sends m
    activations to rank 1 then receives m gradients; stage 1 the other way round."""
    b = Builder(pid=100 + rank, device=rank, distributed={"backend": "nccl", "rank": rank, "world_size": 2})
    b.device_properties = [dict(b.device_properties[0], id=rank)]
    b.annotation("ProfilerStep#0", 1000, 5000)
    b.annotation("ProfilerStep#1", 6000, 5000)
    first, then = ("send", "recv") if rank == 0 else ("recv", "send")
    for step in (0, 1):
        for i, kind in enumerate([first] * m + [then] * m):
            t = 1100 + 5000 * step + 400 * i
            peer = {"Dst Rank": "1" if rank == 0 else "0"} if kind == "send" else {"Src Rank": "1" if rank == 0 else "0"}
            b.op(f"nccl:{kind}", t, 50)
            b.op("record_param_comms", t + 5, 40, **{"Collective name": kind, "In msg nelems": 4096, "Out msg nelems": 4096,
                                                     "dtype": "BFloat16", "Process Group Name": "1", "Group size": 2,
                                                     "Process Group Ranks": "[0, 1]", **(peer if peers else {})})
            b.kernel("ncclDevKernel_SendRecv", t + 10, t + 100, 150 + 10 * rank, stream=21)
    return b.write(tmp_path / f"rank{rank}.json.gz")


def test_a_device_pipeline_reads_its_transfers_directions_and_peers(tmp_path):
    """Stages, micro-batches and the ideal bubble from NCCL's recorded directions and peers, as from gloo's calls."""
    runs = [analyze(_nccl_pipeline_rank(tmp_path, r, m=3)) for r in (0, 1)]
    c = collectives(runs[0]).sort("ts")
    assert c["p2p"].to_list() == (["send"] * 3 + ["recv"] * 3) * 2 and set(c["peer"]) == {1}
    assert c["phase"].to_list() == (["forward"] * 3 + ["backward"] * 3) * 2
    p = job_view([summarize(a) for a in runs]).pipeline.sort("rank", "step")
    assert p["stage"].to_list() == [0, 0, 1, 1] and set(p["stages"]) == {2} and set(p["microbatches"]) == {3}
    assert p["ideal_bubble"].to_list() == [(2 - 1) / (3 + 2 - 1)] * 4
    assert set(p["sends"]) == set(p["recvs"]) == {3} and set(p["matched"]) == {6}
    assert set(p["forward_p2p"]) == set(p["backward_p2p"]) == {3}
    assert p["p2p_us"].to_list() == [6 * 150.0] * 2 + [6 * 160.0] * 2 and set(p["bubble_source"]) == {"p2p_time"}


def test_a_device_pipeline_without_recorded_peers_keeps_its_directions_only(tmp_path):
    """An older PyTorch names the transfers but not their peers: sends and receives are counted, stages unknown."""
    runs = [analyze(_nccl_pipeline_rank(tmp_path, r, m=2, peers=False)) for r in (0, 1)]
    p = job_view([summarize(a) for a in runs]).pipeline
    assert set(p["sends"]) == set(p["recvs"]) == {2} and p["stage"].null_count() == p.height
    assert set(p["matched"]) == {0} and p["ideal_bubble"].null_count() == p.height


def _old_nccl_rank(tmp_path, pg_config: bool) -> str:
    """One rank of a 4-rank NCCL job recorded by a PyTorch without `In msg nelems` (the shared DLRM traces' form): each
    collective's sizes are only in its `nccl:*` call's Input Dims, which are the collective's input tensors."""
    smaller = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
               {"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]
    b = Builder(distributed={"backend": "nccl", "rank": 0, "world_size": 4, **({"pg_config": smaller} if pg_config else {})})
    b.annotation("ProfilerStep#0", 0, 3000)
    calls = [  # name, Input Dims, Input type, kernel
        ("nccl:all_reduce", [[1000, 3]], ["float"], "ncclKernel_AllReduce_RING_LL_Sum_float"),
        ("nccl:_all_gather_base", [[250]], ["c10::BFloat16"], "ncclKernel_AllGather_RING_LL_Sum_int8_t"),
        ("nccl:all_to_all", [[96]], ["long int"], "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"),
        ("nccl:all_reduce", [[8], [8]], ["float", "float"], "ncclKernel_AllReduce_RING_LL_Sum_float"),  # coalesced
        ("nccl:gather", [[64]], ["float"], "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"),  # root and others differ
    ]
    for i, (name, dims, types, kernel) in enumerate(calls):
        t = 100 + 500 * i
        b.op(name, t, 50, cat="user_annotation", **{"Input Dims": dims, "Input type": types})
        b.op("record_param_comms", t + 5, 40, **{"Input Dims": [[], []], "Input type": ["TensorList", "Scalar"]})
        b.kernel(kernel, t + 10, t + 100, 60, stream=21)
    # a collective that records its own sizes keeps them, whatever its call's shapes say
    b.op("nccl:all_reduce", 2600, 50, cat="user_annotation", **{"Input Dims": [[7]], "Input type": ["float"]})
    b.op("record_param_comms", 2605, 40, **{"Collective name": "allreduce", "In msg nelems": 5, "Out msg nelems": 5,
                                            "dtype": "Float", "Process Group Name": "0"})
    b.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 2610, 2700, 60, stream=21)
    return b.write(tmp_path / f"rank0_{pg_config}.json.gz")


@pytest.mark.parametrize("pg_config", [False, True], ids=["world_only", "a_smaller_group"])
def test_an_old_traces_message_sizes_come_from_its_calls_input(tmp_path, pg_config):
    """Bytes by hand from the call's input: an all-reduce's 1000 x 3 floats, an all-to-all's 96 longs; an all-gather's
    250 bf16 are one rank's share of the world's 4 (its message is 4 x 250 x 2 bytes), unknown where the rank is in a
    smaller group too (the all-gather names no group); a call of two tensors (coalesced) is unknown, not one of them,
    and so is a gather's (its input is not its message); a recorded size wins over the call's shapes."""
    c = collectives(analyze(_old_nccl_rank(tmp_path, pg_config))).sort("ts")
    assert c["kind"].to_list() == ["allreduce", "allgather", "all_to_all", "allreduce", "gather", "allreduce"]
    gathered = None if pg_config else 4 * 250 * 2
    assert c["bytes"].to_list() == [1000 * 3 * 4, gathered, 96 * 8, None, None, 5 * 4]


@pytest.mark.parametrize("dims, types, expected", [
    ('[[4, 5]]', '["float"]', (20, "float")),
    ('[[], [6], []]', '["Scalar", "c10::Half", ""]', (6, "c10::Half")),
    ('[[6]]', None, (6, None)),
    ('[[2], [3]]', '["float", "float"]', (None, None)),  # two tensors: which is the message is not told
    ('[[[2], [3]]]', '["TensorList"]', (None, None)),  # a tensor list
    ('[[-4]]', '["float"]', (None, None)),
    ('[[true, 2]]', '["float"]', (None, None)),
    ('[[4294967296, 4294967296]]', '["float"]', (None, None)),  # 2^64 elements: no device holds it
    ('[[1.5]]', '["float"]', (None, None)),
    ('{"a": 1}', '["float"]', (None, None)),
    ('[[4]]', '[7]', (4, None)),
    ('not json', '["float"]', (None, None)),
    (None, None, (None, None)),
])
def test_a_calls_input_is_one_plausible_tensor_or_unknown(dims, types, expected):
    from traceflops.views.collectives import call_payload

    assert call_payload(dims, types) == expected


def test_a_job_says_how_many_collectives_have_no_size_and_how_to_record_it(tmp_path):
    """The all-to-all of an older PyTorch whose call recorded no shapes has no size (the send has its own): one of the
    job's two matched collectives, and the warning says what to record."""
    runs = [analyze(_nccl_rank(tmp_path, r, old_all_to_all=True)) for r in (0, 1)]
    j = job_view([summarize(a) for a in runs])
    assert j.collectives.height == 2 and j.collectives["bytes"].null_count() == 1
    (w,) = [w for w in j.warnings if "no message size" in w]
    assert w.startswith("1 matched collectives") and "record_shapes=True" in w
