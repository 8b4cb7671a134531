"""What the tests build: synthetic Kineto traces and frames with known answers, and where the repository's files are.

One function per concept:
  ROOT, FIXTURES, CPU, DATA, shared_fixtures()  where files are, from the repository root (not the working directory)
  Builder                                       a Kineto GPU trace, event by event
  write_doc(doc, path)                          a trace document written as (gzipped) JSON
  scenario_trace(where, name, **params)         a named scenario (SCENARIOS) written as a Kineto trace file
  rank_traces(where, ranks=None, **params)      the RANKS job's rank scenarios, one file each
  shapes(dims, types)                           an op's recorded Input Dims / Input type
  ops(*rows), kernels(*rows), launches(*rows)   trace frames from tuples
  steps(*windows)                               a step-windows frame from (start, window) pairs
  trace(ops=..., kernels=..., ...)              a Trace from frames

The scenarios' dimensions and known quantities are the namespaces LINKING, MODULES,
ROOFLINE and RANKS, so a test asserts on the numbers the trace was built from.
Nothing here imports traceflops at module level (some tests stay free of it) or torch.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
CPU = FIXTURES / "cpu"
DATA = ROOT / "tests" / "data"

BF16 = "c10::BFloat16"
EVAL = "autograd::engine::evaluate_function: "


def shared_fixtures() -> Path:
    """The shared real traces: beside the checkout, or where TRACEFLOPS_FIXTURES points."""
    env = os.environ.get("TRACEFLOPS_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures"


# ------------------------------------------------------------------ Kineto documents


def write_doc(doc: dict, path, gz: bool = True) -> str:
    """The document as JSON at `path`, gzipped unless gz=False; the path as text."""
    data = json.dumps(doc).encode()
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(data)
    return str(path)


def shapes(dims: list, types: list | None = None) -> dict:
    """An op's recorded shapes: `types` default to bf16 for every operand."""
    return {"Input Dims": dims, "Input type": types or [BF16] * len(dims)}


@dataclass
class Builder:
    """A synthetic Kineto GPU trace: host ops and annotations, runtime launches and their device activities."""

    pid: int = 100
    main_tid: int = 1
    bwd_tid: int = 2
    device: int = 0
    events: list = field(default_factory=list)
    _ext: int = 1
    _corr: int = 1000
    device_properties: list = field(default_factory=lambda: [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
    ])
    distributed: dict | None = None

    def op(self, name, ts, dur, tid=None, cat="cpu_op", **args):
        a = {"External id": self._ext}
        self._ext += 1
        a.update(args)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid or self.main_tid, "ts": ts, "dur": dur, "args": a})
        return a["External id"]

    def annotation(self, name, ts, dur, tid=None):
        return self.op(name, ts, dur, tid=tid, cat="user_annotation")

    def kernel(self, name, launch_ts, start, dur, stream=7, tid=None, launch="cudaLaunchKernel", cat="kernel", **kargs):
        """A runtime launch on the host thread and its device activity, linked by correlation."""
        corr = self._corr
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": self.pid, "tid": tid or self.main_tid, "ts": launch_ts, "dur": 2.0, "args": {"correlation": corr}})
        args = {"device": self.device, "stream": stream, "correlation": corr}
        args.update(kargs)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream, "ts": start, "dur": dur, "args": args})
        return corr

    def doc(self):
        d = {"schemaVersion": 1, "deviceProperties": self.device_properties, "traceEvents": self.events}
        if self.distributed:
            d["distributedInfo"] = self.distributed
        return d

    def write(self, path, gz=True):
        return write_doc(self.doc(), path, gz)


# ------------------------------------------------------------------ scenarios

LINKING = SimpleNamespace(M=48, K=80, N=24)  # non-square on purpose
MODULES = SimpleNamespace(M=64, K=32, K2=128, N=16)
ROOFLINE = SimpleNamespace(M=4096, K=2048, N=8192, S=4096)  # S: the elementwise add's [S, S] tensors
RANKS = SimpleNamespace(
    WORLD=4,
    OFFSET={0: 0.0, 1: 1_000.0, 2: -2_500.0, 3: 7_000.0},  # each rank's clock error, µs
    SLOW=2,  # this rank computes LATE µs longer before each all-reduce
    LATE=300.0,
    M=64, K=96, N=32,
)


def _linking() -> Builder:
    """One step of forward, backward (autograd thread), a collective, the optimizer and a CUDA graph; a kernel before the step."""
    M, K, N = LINKING.M, LINKING.K, LINKING.N
    b = Builder()
    b.kernel("void at::native::elementwise_kernel<warmup>", 5, 40, 3)  # before the first step: outside
    b.annotation("ProfilerStep#7", 50, 950)
    b.op("aten::linear", 100, 60)
    b.op("aten::addmm", 110, 40, **shapes([[N], [M, K], [K, N]]), **{"Concrete Inputs": ["", "", "", "1", "1"]})
    b.kernel("Memset (Device)", 112, 200, 2, cat="gpu_memset", bytes=4)
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 120, 210, 30)
    # backward on the autograd thread, outside the step's nesting but inside its span
    b.op(EVAL + "AddmmBackward0", 300, 100, tid=2)
    b.op("AddmmBackward0", 301, 98, tid=2)
    b.op("aten::mm", 310, 20, tid=2, **shapes([[M, N], [N, K]]))
    b.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", 315, 400, 20, tid=2)
    b.op("aten::mm", 340, 20, tid=2, **shapes([[N, M], [M, K]]))
    b.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", 345, 420, 20, tid=2)
    b.op("record_param_comms", 370, 10, tid=2)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 372, 430, 70, stream=20)
    b.annotation("Optimizer.step#AdamW.step", 600, 100)
    b.op("aten::_foreach_add_", 610, 20)
    b.kernel("void at::native::multi_tensor_apply_kernel<adam>", 612, 700, 20)
    # a CUDA graph: one launch, two kernels sharing its correlation
    b.op("aten::mm", 800, 20, **shapes([[M, K], [K, N]]))
    corr = b.kernel("sm90_xmma_gemm_graph_part1", 805, 750, 10, launch="cudaGraphLaunch")
    b.events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_graph_part2", "pid": 0, "tid": 7, "ts": 760, "dur": 30, "args": {"device": 0, "stream": 7, "correlation": corr}})
    return b


def _gemms() -> Builder:
    """Four GEMM shapes on an H100; kernel µs chosen so each one's share is known.

    1024² (K 512) twice, 50 µs each; 2048² (K 512) 200 µs; 3072² (K 1024) 745 µs;
    a bmm of 4 × 256² (K 64) 5 µs, 16 tiles: a near-empty wave whose time does not matter.
    Total matmul time 1050 µs.
    """
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 10000)
    t = 10

    def gemm(name, dims, dur, types=None):
        nonlocal t
        b.op("aten::linear", t, 30)
        b.op(name, t + 1, 28, **shapes(dims, types))
        b.kernel(f"sm90_xmma_gemm_{name[6:]}_{t}", t + 2, 1000 + 25 * t, dur)  # 1000 µs apart
        t += 40

    gemm("aten::mm", [[1024, 512], [512, 1024]], 50)
    gemm("aten::mm", [[1024, 512], [512, 1024]], 50)
    gemm("aten::addmm", [[2048], [2048, 512], [512, 2048], [], []], 200, [BF16, BF16, BF16, "Scalar", "Scalar"])
    gemm("aten::mm", [[3072, 1024], [1024, 3072]], 745)
    gemm("aten::bmm", [[4, 256, 64], [4, 64, 256]], 5)
    return b


def _modules() -> Builder:
    """Two annotated modules, checkpointed (reentrant): forward, recompute and backward kernels.

    µs of kernel time, FLOPs (F_ATTN = 2·M·K·N, F_MLP = 2·M·K2·N):
      attn: forward gemm 30 (F_ATTN), recompute gemm 30 (F_ATTN), backward gemm 40 (F_ATTN)
      mlp:  forward gemm 50 (F_MLP) + relu 5, recompute gemm 50 (F_MLP), backward gemm 20 (F_MLP)
      aten::add_ (optimizer, no module): 7
    """
    M, K, K2, N = MODULES.M, MODULES.K, MODULES.K2, MODULES.N
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 3000)
    b.annotation("attn", 100, 100)
    b.op("aten::mm", 110, 40, **shapes([[M, K], [K, N]]), **{"Sequence number": 10})
    b.kernel("gemm_a", 115, 1000, 30)
    b.annotation("mlp", 200, 100)
    b.op("aten::mm", 210, 40, **shapes([[M, K2], [K2, N]]), **{"Sequence number": 11})
    b.kernel("gemm_m", 215, 1040, 50)
    b.op("aten::relu", 260, 10, **shapes([[M, N]]), **{"Sequence number": 12})
    b.kernel("relu_kernel", 262, 1100, 5)
    # backward, on the autograd thread
    t = 2
    b.op(EVAL + "CheckpointFunctionBackward", 500, 400, tid=t, **{"Sequence number": 13})
    b.op("CheckpointFunctionBackward", 501, 398, tid=t)
    b.annotation("attn", 510, 50, tid=t)  # the recomputed forward re-runs its annotations
    b.op("aten::mm", 515, 30, tid=t, **shapes([[M, K], [K, N]]), **{"Sequence number": 20})
    b.kernel("gemm_a", 520, 1200, 30, tid=t)
    b.annotation("mlp", 570, 50, tid=t)
    b.op("aten::mm", 575, 30, tid=t, **shapes([[M, K2], [K2, N]]), **{"Sequence number": 21})
    b.kernel("gemm_m", 580, 1240, 50, tid=t)
    # backward nodes carry the sequence number of the op that made them: the recomputed
    # attn mm (20) and, to exercise both lookups, the forward mlp mm (11)
    b.op(EVAL + "MmBackward0", 650, 50, tid=t, **{"Sequence number": 20})
    b.op("MmBackward0", 651, 48, tid=t)
    b.op("aten::mm", 660, 20, tid=t, **shapes([[M, N], [N, K]]))
    b.kernel("gemm_a_bwd", 665, 1300, 40, tid=t)
    b.op(EVAL + "MmBackward0", 720, 50, tid=t, **{"Sequence number": 11})
    b.op("MmBackward0", 721, 48, tid=t)
    b.op("aten::mm", 730, 20, tid=t, **shapes([[K2, M], [M, N]]))
    b.kernel("gemm_m_bwd", 735, 1350, 20, tid=t)
    b.annotation("Optimizer.step#SGD.step", 1500, 100)
    b.op("aten::add_", 1510, 20, **shapes([[N], [N], []], [BF16, BF16, "Scalar"]))
    b.kernel("add_kernel", 1512, 1600, 7)
    b.kernel("orphan", 3500, 3600, 3)  # no launching op
    return b


def _roofline() -> Builder:
    """A bf16 GEMM, two elementwise adds, an in-place mul over two kernels, a tensor-list cat and an orphan launch."""
    M, K, N, S = ROOFLINE.M, ROOFLINE.K, ROOFLINE.N, ROOFLINE.S
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.op("aten::mm", 100, 50, **shapes([[M, K], [K, N]]))
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 105, 100, 250)
    add = shapes([[S, S], [S, S], []], [BF16, BF16, "Scalar"])
    b.op("aten::add", 200, 20, **add)
    b.kernel("elementwise_add", 205, 400, 100)
    b.op("aten::add", 230, 20, **add)
    b.kernel("elementwise_add", 235, 520, 80)
    # in place, two kernels: bytes and FLOPs split 3:1 by duration
    b.op("aten::mul_", 300, 20, **shapes([[1024, 1024], [1024, 1024]], ["float", "float"]))
    b.kernel("mul_part", 302, 700, 30)
    b.kernel("mul_part", 304, 740, 10)
    # a tensor list: its dtype is not recorded, so nothing is guessed
    b.op("aten::cat", 400, 20, **shapes([[[8, 8], [8, 8]], []], ["TensorList", "Scalar"]))
    b.kernel("cat_kernel", 402, 800, 5)
    # a launch under no op at all
    b.kernel("orphan_kernel", 2500, 2600, 10)
    return b


def _rank(rank: int, steps: int = 2, p2p_us: float = 0.0, late_us: float = RANKS.LATE) -> Builder:
    """One rank of RANKS.WORLD: steps of 1000 µs true time, a GEMM, then an all-reduce that ends at the same true instant on all ranks.

    Each rank's clock is off by RANKS.OFFSET[rank]; rank RANKS.SLOW computes late_us (RANKS.LATE) longer.
    p2p_us > 0 adds a send/recv of that length after each all-reduce.
    """
    M, K, N, world = RANKS.M, RANKS.K, RANKS.N, RANKS.WORLD
    b = Builder(pid=100 + rank, device=rank, distributed={"backend": "nccl", "rank": rank, "world_size": world})
    b.device_properties = [dict(b.device_properties[0], id=rank)]
    o = RANKS.OFFSET[rank]
    for i in range(steps):
        t0 = 10_000.0 + 1_000.0 * i
        b.annotation(f"ProfilerStep#{i}", t0 + o, 999.0)
        b.op("aten::mm", t0 + 5 + o, 20, **shapes([[M, K], [K, N]]))
        gemm = 400.0 + (late_us if rank == RANKS.SLOW else 0.0)
        b.kernel("sm90_xmma_gemm_bf16", t0 + 10 + o, t0 + 50 + o, gemm)
        start = t0 + 50 + gemm + 10  # arrives when its compute is done
        end = t0 + 900.0  # all ranks finish together (true time)
        b.op("record_param_comms", t0 + 30 + o, 5, **{"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
                                                       "dtype": "BFloat16", "Process Group Name": "0", "Group size": world})
        b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t0 + 31 + o, start + o, end - start, stream=20)
        if p2p_us:
            b.kernel("ncclDevKernel_SendRecv", t0 + 40 + o, end + 5 + o, p2p_us, stream=21)
    return b


SCENARIOS = {"linking": _linking, "gemms": _gemms, "modules": _modules, "roofline": _roofline, "rank": _rank}


def scenario_trace(where, name: str, **params) -> str:
    """Scenario `name` (SCENARIOS, with its params) written as a gzipped Kineto trace in the folder `where`.

    The file is `rank{rank}.json.gz` for a rank of a distributed job, else `{name}.json.gz`; its path as text.
    """
    b = SCENARIOS[name](**params)
    rank = (b.distributed or {}).get("rank")
    return b.write(Path(where) / (f"rank{rank}.json.gz" if rank is not None else f"{name}.json.gz"))


def rank_traces(where, ranks=None, **params) -> list[str]:
    """Every rank's trace of the RANKS job (or those in `ranks`), written in `where`."""
    return [scenario_trace(where, "rank", rank=r, **params) for r in (range(RANKS.WORLD) if ranks is None else ranks)]


# ------------------------------------------------------------------ frames


def _frame(records: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(records, schema=schema) if records else pl.DataFrame(schema=schema)


def ops(*rows) -> pl.DataFrame:
    """Host op rows (name, tid, ts, dur, ext_id) as a trace ops frame (OPS_SCHEMA), op_id numbering the rows."""
    from traceflops.core.trace import OPS_SCHEMA

    return _frame([{"op_id": i, "name": n, "cat": "cpu_op", "pid": "1", "tid": t, "ts": ts, "dur": d, "ext_id": e}
                   for i, (n, t, ts, d, e) in enumerate(rows)], OPS_SCHEMA)


def launches(*rows) -> pl.DataFrame:
    """Runtime call rows (name, tid, ts, dur[, correlation]) as a trace launches frame (LAUNCHES_SCHEMA)."""
    from traceflops.core.trace import LAUNCHES_SCHEMA

    return _frame([{"name": n, "pid": "1", "tid": t, "ts": ts, "dur": d, "correlation": corr[0] if corr else None}
                   for n, t, ts, d, *corr in rows], LAUNCHES_SCHEMA)


# the columns linking and classification add to the trace's kernels, and their defaults
LINKED = {"launch_name": pl.Utf8, "launch_ts": pl.Float64, "launch_dur": pl.Float64, "cls": pl.Utf8, "phase": pl.Utf8,
          "step": pl.Int64, "flops": pl.Float64}
_LINKED_DEFAULTS = {"launch_name": "cudaLaunchKernel", "launch_dur": 2.0, "phase": "forward", "step": 0}


def kernels(*rows, linked: bool = False) -> pl.DataFrame:
    """Device activity rows as a kernels frame (KERNELS_SCHEMA); kernel_id and correlation number the rows from 0.

    A row is a tuple (name, device, stream, ts, dur[, correlation]) or a dict of the columns that
    differ from name 'k', device 0, stream '7', kind 'compute'. linked=True adds the columns
    linking and classification give (LINKED: launch_ts null, launch_dur 2, launch_name
    cudaLaunchKernel, phase forward, step 0, cls null) and 1e9 FLOPs on a matmul row that gives none.
    """
    from traceflops.core.trace import KERNELS_SCHEMA

    schema = {**KERNELS_SCHEMA, **LINKED} if linked else KERNELS_SCHEMA
    records = []
    for i, r in enumerate(rows):
        if isinstance(r, tuple):
            name, dev, stream, ts, dur, *corr = r
            r = {"name": name, "device": dev, "stream": stream, "ts": ts, "dur": dur, **({"correlation": corr[0]} if corr else {})}
        row = {"kernel_id": i, "name": "k", "kind": "compute", "device": 0, "stream": "7", "correlation": i,
               **(_LINKED_DEFAULTS if linked else {}), **r}
        if linked and row.get("cls") == "matmul" and "flops" not in r:
            row["flops"] = 1e9
        records.append(row)
    return _frame(records, schema)


def steps(*windows: tuple[float, float]) -> pl.DataFrame:
    """A steps frame from (start, window) pairs, steps numbered 0, 1, ... (host span = device window)."""
    n = len(windows)
    return pl.DataFrame(
        {
            "step": list(range(n)),
            "name": [f"ProfilerStep#{i}" for i in range(n)],
            "start": [float(s) for s, _ in windows],
            "window": [float(w) for _, w in windows],
            "ts": [float(s) for s, _ in windows],
            "dur": [float(w) for _, w in windows],
        }
    )


def trace(ops=None, kernels=None, launches=None, path: str = "t.json"):
    """A Trace of these frames (empty where not given), no markers or steps, meta {'path': path}."""
    from traceflops.core.trace import (
        KERNELS_SCHEMA,
        LAUNCHES_SCHEMA,
        MARKERS_SCHEMA,
        OPS_SCHEMA,
        STEPS_SCHEMA,
        Trace,
        Warnings,
        empty,
    )

    def given(frame, schema):
        return frame if frame is not None else empty(schema)

    return Trace(given(ops, OPS_SCHEMA), given(kernels, KERNELS_SCHEMA), given(launches, LAUNCHES_SCHEMA),
                 empty(MARKERS_SCHEMA), empty(STEPS_SCHEMA), {"path": path}, Warnings())


def gemm_trace_file(path, m: int, n: int, k: int, dur: float, dtype: str = BF16,
                    kernel: str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", step_us: float = 5000) -> str:
    """One step of `step_us`, one m×k·k×n mm of `dtype` operands and its kernel of `dur` µs: the trace written to `path`."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, step_us)
    b.op("aten::mm", 10, 30, **shapes([[m, k], [k, n]], [dtype, dtype]))
    b.kernel(kernel, 12, 100, dur)
    return b.write(path)


# ------------------------------------------------------------------ protobuf (hand-made XLA profiles)


def pb_varint(v: int) -> bytes:
    """A protobuf varint (two's complement for negatives, as int64 fields write them)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(num: int, value) -> bytes:
    """Field `num` with a bytes/str (length-delimited), float (fixed64 double) or int (varint) value."""
    import struct

    if isinstance(value, bytes):
        return pb_varint(num << 3 | 2) + pb_varint(len(value)) + value
    if isinstance(value, str):
        return pb_field(num, value.encode())
    if isinstance(value, float):
        return pb_varint(num << 3 | 1) + struct.pack("<d", value)
    return pb_varint(num << 3) + pb_varint(value)


def union_us(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of the spans clipped to [lo, hi]: an independent sweep, for tests' truths."""
    total, end = 0.0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi):
        if e > end:
            total += e - max(s, end)
            end = e
    return total
