"""Linking and tagging on synthetic device traces with known answers."""

import polars as pl

from tests.builders import LINKING, scenario_trace
from traceflops.run.load import analyze

M, K, N = LINKING.M, LINKING.K, LINKING.N


def test_kernels_take_the_phase_of_their_launching_op(tmp_path):
    a = analyze(scenario_trace(tmp_path, "linking"))
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
    a = analyze(scenario_trace(tmp_path, "linking"))
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
        # random spans overlap partially as often as not; 0.001 and 1.001 end where a later start plus the slack lies
        dur = rng.choice([0, 0.0005, 0.001, 1, 1.001, 2, 5, 20, 60], n)
        order = np.lexsort((-dur, ts, thread))
        thread, ts, dur = thread[order], ts[order], dur[order]
        assert (nesting(thread, ts, ts + dur) == _nesting_by_stack(thread, ts, ts + dur)).all()


def test_nesting_out_of_order_or_with_a_missing_time_climbs_as_the_stack_walk_does():
    import numpy as np

    from traceflops.stages.link import _nesting_by_jumping, nesting

    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(2, 300))
        thread = np.sort(rng.integers(0, 3, n))
        ts = rng.choice(np.arange(0, 50, 0.5), n)
        dur = rng.choice([0, 0.0005, 0.001, 1, 1.001, 2, 5, 20, 60], n)
        order = np.lexsort((-dur, ts, thread))
        thread, ts, dur = thread[order], ts[order], dur[order]
        assert (_nesting_by_jumping(thread, ts, ts + dur) == _nesting_by_stack(thread, ts, ts + dur)).all()
        shuffled = rng.permutation(n)
        by_thread = np.argsort(thread[shuffled], kind="stable")  # threads together, starts out of order
        t2, s2, d2 = thread[shuffled][by_thread], ts[shuffled][by_thread], dur[shuffled][by_thread]
        assert (nesting(t2, s2, s2 + d2) == _nesting_by_jumping(t2, s2, s2 + d2)).all()
        s2 = ts.copy()
        s2[rng.integers(0, n)] = np.nan
        assert (nesting(thread, s2, s2 + dur) == _nesting_by_jumping(thread, s2, s2 + dur)).all()


def _climbed(parent, mask) -> list[int]:
    """Per op, the nearest ancestor-or-self marked in `mask` (-1: none), found parent by parent."""
    want = []
    for i in range(len(parent)):
        j = i
        while j >= 0 and not mask[j]:
            j = parent[j]
        want.append(int(j))
    return want


def test_nearest_marked_ancestor_equals_climbing_one_by_one():
    import numpy as np

    from traceflops.stages.link import nearest

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        mask = rng.random(n) < rng.choice([0.0, 0.05, 0.2, 1.0])  # none marked and all marked included
        want = _climbed(parent, mask)
        assert (nearest(parent, mask) == np.array(want)).all()
        at = rng.choice(n, size=int(rng.integers(0, n + 1)))  # some rows, in any order, repeats included
        assert nearest(parent, mask, at).tolist() == [want[i] for i in at.tolist()]


def test_nearest_for_several_masks_at_once_equals_climbing_one_by_one():
    """One climb for several masks finds, for each, what climbing parent by parent finds (masks marking nothing, all
    or a few, in any mix)."""
    import numpy as np
    import pytest

    from traceflops.stages.link import nearest_each

    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        masks = [rng.random(n) < rng.choice([0.0, 0.01, 0.05, 0.2, 1.0]) for _ in range(int(rng.integers(1, 9)))]
        got = nearest_each(parent, masks)
        assert len(got) == len(masks)
        for mask, found in zip(masks, got):
            assert found.tolist() == _climbed(parent, mask)
    with pytest.raises(ValueError):
        nearest_each(np.array([-1]), [np.array([True])] * 9)


def test_depth_counts_the_ancestors_climbed_one_by_one():
    import numpy as np

    from traceflops.stages.link import _depth

    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(0, 200))
        parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)], dtype=np.int64)[:n]
        want = []
        for i in range(n):
            d, j = 0, parent[i]
            while j >= 0:
                d, j = d + 1, parent[j]
            want.append(d)
        assert _depth(parent).tolist() == want


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
        # Each thread in order, the threads interleaved (as most traces write them): the cheap path's case
        thread = want.select(pl.struct("pid", "tid").rank("dense")).to_series().to_numpy()
        slots = rng.permutation(thread)  # which thread each position takes, each thread's rows in their order
        at = np.empty(n, dtype=np.int64)
        for t in np.unique(thread):
            at[slots == t] = np.flatnonzero(thread == t)
        mixed = want[at]
        assert thread_order(mixed).equals(want)


def test_layout_and_copy_kernels_under_a_matmul_op_are_not_matmul_time(tmp_path):
    """cuDNN and MIOpen run a convolution as transposes around a GEMM: the transposes move data, so they are
    other compute, and the GEMM kernel carries the op's FLOPs (2·M·K·N by the formula) alone. An op that
    launched no kernel but such a helper keeps it as its matmul kernel, so its FLOPs are not lost."""
    from tests.builders import Builder

    m, k, n = 48, 40, 24
    shapes = {"Input Dims": [[m, k], [k, n]], "Input type": ["float", "float"]}
    b = Builder()
    b.annotation("ProfilerStep#0", 0, 1000)
    b.op("aten::mm", 10, 50, **shapes)
    b.kernel("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>", 11, 100, 30)
    b.kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8", 12, 130, 10)
    b.kernel("batched_transpose_32x32_half", 13, 140, 20)
    b.op("aten::mm", 100, 20, **shapes)
    b.kernel("void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>", 101, 200, 5)
    a = analyze(b.write(tmp_path / "t.json.gz"))
    got = {r["name"].split("<")[0].split("(")[0]: (r["cls"], r["flops"]) for r in a.kernels.iter_rows(named=True)}
    assert got["void cudnn::ops::nchwToNhwcKernel"] == ("other_compute", None)
    assert got["batched_transpose_32x32_half"] == ("other_compute", None)
    assert got["sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8"] == ("matmul", 2 * m * k * n)
    assert got["void cudnn::ops::nhwcToNchwKernel"] == ("matmul", 2 * m * k * n)  # its op's only kernel
    assert a.kernels["flops"].sum() == a.totals["flops"]["executed"] == 2 * 2 * m * k * n


def test_a_nameless_kernel_under_a_matmul_op_stays_matmul_beside_a_data_mover():
    """A kernel without a name is not known to only move data, so it keeps its share of the op's FLOPs."""
    from traceflops.stages.count import classify_kernels

    k = pl.DataFrame({"name": [None, "void cudnn::ops::nchwToNhwcKernel<float>", "sm80_xmma_gemm_f32"],
                      "kind": ["compute"] * 3, "op_row": [0, 0, 0], "dur": [1.0, 1.0, 2.0]})
    ops = pl.DataFrame({"parent": [-1], "matmul": [True], "flops": [6.0], "row": [0]})
    got = classify_kernels(k, ops).select("cls", "flops").rows()
    assert got == [("matmul", 2.0), ("other_compute", None), ("matmul", 4.0)]
