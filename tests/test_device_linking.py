"""Linking and tagging on synthetic device traces with known answers."""

import polars as pl

from traceflops.run.load import analyze
from synth import Builder

M, K, N = 48, 80, 24  # non-square on purpose


def build(tmp_path):
    b = Builder()
    b.kernel("void at::native::elementwise_kernel<warmup>", 5, 40, 3)  # before the first step: outside
    b.annotation("ProfilerStep#7", 50, 950)
    b.op("aten::linear", 100, 60)
    b.op("aten::addmm", 110, 40, **{"Input Dims": [[N], [M, K], [K, N]], "Input type": ["c10::BFloat16"] * 3, "Concrete Inputs": ["", "", "", "1", "1"]})
    b.kernel("Memset (Device)", 112, 200, 2, cat="gpu_memset", bytes=4)
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 120, 210, 30)
    # backward on the autograd thread, outside the step's nesting but inside its span
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 300, 100, tid=2)
    b.op("AddmmBackward0", 301, 98, tid=2)
    b.op("aten::mm", 310, 20, tid=2, **{"Input Dims": [[M, N], [N, K]], "Input type": ["c10::BFloat16"] * 2})
    b.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", 315, 400, 20, tid=2)
    b.op("aten::mm", 340, 20, tid=2, **{"Input Dims": [[N, M], [M, K]], "Input type": ["c10::BFloat16"] * 2})
    b.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", 345, 420, 20, tid=2)
    b.op("record_param_comms", 370, 10, tid=2)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 372, 430, 70, stream=20)
    b.annotation("Optimizer.step#AdamW.step", 600, 100)
    b.op("aten::_foreach_add_", 610, 20)
    b.kernel("void at::native::multi_tensor_apply_kernel<adam>", 612, 700, 20)
    # a CUDA graph: one launch, two kernels sharing its correlation
    b.op("aten::mm", 800, 20, **{"Input Dims": [[M, K], [K, N]], "Input type": ["c10::BFloat16"] * 2})
    corr = b.kernel("sm90_xmma_gemm_graph_part1", 805, 750, 10, launch="cudaGraphLaunch")
    b.events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_graph_part2", "pid": 0, "tid": 7, "ts": 760, "dur": 30, "args": {"device": 0, "stream": 7, "correlation": corr}})
    return b.write(tmp_path / "synth.json.gz")


def test_kernels_take_the_phase_of_their_launching_op(tmp_path):
    a = analyze(build(tmp_path))
    k = {r["name"]: r for r in a.kernels.iter_rows(named=True)}
    assert k["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"]["phase"] == "forward"
    assert k["Memset (Device)"]["phase"] == "forward"
    assert k["nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN"]["phase"] == "backward"
    assert k["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]["kind"] == "communication"
    assert k["void at::native::multi_tensor_apply_kernel<adam>"]["phase"] == "optimizer"
    assert k["sm90_xmma_gemm_graph_part2"]["cls"] == "matmul"
    # memset under a GEMM op is not matmul time; the GEMM kernel is
    assert k["Memset (Device)"]["cls"] == "memset"
    assert k["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"]["cls"] == "matmul"


def test_flops_counts_and_outside_work(tmp_path):
    a = analyze(build(tmp_path))
    t = a.totals
    mm = 2 * M * N * K
    assert t["flops"]["forward"] == mm * 2  # the addmm and the graph-launched mm
    assert t["flops"]["backward"] == 2 * mm
    assert t["matmul_count"] == {"forward": 2, "backward": 2, "recompute": 0, "optimizer": 0, "other": 0}
    assert a.outside_steps["kernels"] == 1
    # graph kernels split their op's FLOPs by duration and keep the total
    g = a.kernels.filter(pl.col("name").str.starts_with("sm90_xmma_gemm_graph"))
    assert g["flops"].sum() == mm
    assert abs(g.filter(pl.col("dur") == 30)["flops"][0] - 0.75 * mm) < 1e-6
    # the one step's device window runs from its first to its last device activity
    s = a.steps.row(0, named=True)
    assert s["start"] == 200 and s["window"] == 790 - 200  # the graph kernel ends last and s["last"]


def test_launch_op_is_the_innermost_enclosing_op_by_definition():
    """`enclosing_op` against the definition: the latest-starting op on the thread whose span contains the instant."""
    import numpy as np

    from traceflops.stages.link import _EPS_US, enclosing_op, nesting

    rng = np.random.default_rng(7)
    # properly nested spans on three threads, built recursively
    starts, ends, threads = [], [], []

    def spans(t, lo, hi, depth):
        x = lo
        while x < hi - 2 and depth < 5:
            w = rng.uniform(1, (hi - x))
            starts.append(x), ends.append(x + w), threads.append(t)
            spans(t, x + rng.uniform(0, 0.2 * w), x + w * 0.9, depth + 1)
            x += w + rng.uniform(0, 3)

    for t in range(3):
        spans(t, 0.0, 400.0, 0)
    order = np.lexsort((-(np.array(ends) - np.array(starts)), np.array(starts), np.array(threads)))
    ts, end, thread = np.array(starts)[order], np.array(ends)[order], np.array(threads)[order]
    parent = nesting(thread, ts, end)
    q_thread = rng.integers(0, 4, 2000)  # thread 3 has no ops
    q_ts = rng.uniform(-5, 410, 2000)
    got = enclosing_op(parent, thread, ts, end, q_thread, q_ts)
    for qt, qs, g in zip(q_thread, q_ts, got):
        inside = np.flatnonzero((thread == qt) & (ts <= qs) & (end > qs + _EPS_US))
        want = inside.max() if len(inside) else -1
        assert g == want


def _nesting_by_stack(thread, ts, end):
    """The reference: a stack walk per thread, popping what ended by the next start."""
    import numpy as np

    from traceflops.stages.link import _EPS_US

    parent, stack, prev = [], [], None
    for th, t, i in zip(thread.tolist(), ts.tolist(), range(len(ts))):
        if th != prev:
            stack, prev = [], th
        while stack and end[stack[-1]] <= t + _EPS_US:
            stack.pop()
        parent.append(stack[-1] if stack else -1)
        stack.append(i)
    return np.asarray(parent, dtype=np.int64)


def test_vectorized_nesting_equals_the_stack_walk_with_ties_zero_durations_and_partial_overlaps():
    import numpy as np

    from traceflops.stages.link import nesting

    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 400))
        thread = np.sort(rng.integers(0, 3, n))
        ts = rng.choice(np.arange(0, 50, 0.5), n)
        dur = rng.choice([0, 0.0005, 1, 2, 5, 20, 60], n)  # random spans overlap partially as often as not
        order = np.lexsort((-dur, ts, thread))
        thread, ts, dur = thread[order], ts[order], dur[order]
        assert (nesting(thread, ts, ts + dur) == _nesting_by_stack(thread, ts, ts + dur)).all()


def test_nearest_marked_ancestor_equals_climbing_one_by_one():
    import numpy as np

    from traceflops.stages.link import nearest

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        mask = rng.random(n) < 0.2
        want = []
        for i in range(n):
            j = i
            while j >= 0 and not mask[j]:
                j = parent[j]
            want.append(j)
        assert (nearest(parent, mask) == np.array(want)).all()


def test_thread_order_check_agrees_with_polars_sort_nulls_included():
    import numpy as np
    import polars as pl

    from traceflops.core.trace import OP_ORDER, in_thread_order, thread_order

    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        text = lambda vals: pl.Series(list(rng.choice(vals, n)), dtype=pl.Utf8).replace("x", None)  # noqa: E731
        df = pl.DataFrame({"pid": text(["1", "2", "x"]), "tid": text(["7", "8", "x"]), "ts": rng.choice([1.0, 2.0, 3.0], n),
                           "dur": rng.choice([0.0, 1.0, 5.0], n), "op_id": rng.permutation(n)})
        want = df.sort(OP_ORDER[0], descending=OP_ORDER[1])
        assert in_thread_order(want)
        assert in_thread_order(df) == want.equals(df)
        assert thread_order(df).equals(want)
