"""Per-op counts, bytes moved, kernel time and attention FLOPs against TraceLens' perf-report tables of the same traces.

The truth is TraceLens' own CSVs beside the shared fixtures (GEMM, InferenceAttention_fwd). Their known conventions,
moved into ours where they differ: "Data Moved (MB)" is MiB (2^20 bytes); a framework GEMM wrapper
(`aiter::gemm_a16w16`, `vllm::rocm_unquantized_gemm`) is listed beside the aten op it calls, where traceflops books
the one GEMM at the aten op; causal attention keeps sq²/2 of each context request's block where sq·(sq+1)/2 pairs
are computed (the diagonal's sq/2 per request is left out).
"""

from __future__ import annotations

import csv
import json

import orjson
import polars as pl
import pytest

from traceflops.run.load import analyze

SGLANG = ("kineto/mi300_sglang_qwen3_prefilldecode.json.gz", "reference/mi300_sglang_qwen3_prefilldecode")
VLLM = ("kineto/vllm_graphs_piecewise/graph_execution.json.gz", "reference/vllm_graphs_piecewise")
QWEN = ("kineto/h100_qwen_inference.json.gz", "reference/h100_qwen_inference.tracelens_GEMM.csv")
ATTENTION = {"aiter::mha_batch_prefill", "vllm::unified_attention_with_output"}


def _rows(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows, path
    return rows


def _per_op(a) -> pl.DataFrame:
    """The ops that ran, each with the summed duration of the device activities linked to it."""
    kt = a.kernels.group_by("op_row").agg(pl.col("dur").sum().alias("kernel_us"))
    return a.ops.filter(pl.col("ran")).join(kt, left_on="row", right_on="op_row", how="left")


def _matching(ops: pl.DataFrame, r: dict) -> pl.DataFrame:
    dims = orjson.dumps(json.loads(r["Input Dims_first"])).decode()
    return ops.filter((pl.col("name") == r["name"]) & (pl.col("dims") == dims))


def _compared(shared, trace: str, table) -> list[tuple[dict, pl.DataFrame]]:
    """Each TraceLens row of an aten GEMM or a framework attention op, with our ops of the same name and shapes."""
    ops = _per_op(analyze(str(shared / trace)))
    rows = [r for r in _rows(shared / table) if r["name"].startswith("aten::") or r["name"] in ATTENTION]
    return [(r, _matching(ops, r)) for r in rows]


CASES = [
    (QWEN[0], QWEN[1]),
    (SGLANG[0], f"{SGLANG[1]}/GEMM.csv"),
    (SGLANG[0], f"{SGLANG[1]}/InferenceAttention_fwd.csv"),
    (VLLM[0], f"{VLLM[1]}/GEMM.csv"),
    (VLLM[0], f"{VLLM[1]}/InferenceAttention_fwd.csv"),
]


@pytest.mark.parametrize(("trace", "table"), CASES, ids=lambda s: s.split("/")[-1])
def test_calls_bytes_and_kernel_time_agree(shared, trace, table):
    """Same calls per shape, the same bytes per call (the roofline's input), and the same device time linked to
    them (the link from op to kernel, graph replays included: vLLM's GEMMs and attention ran inside HIP graphs)."""
    compared = _compared(shared, trace, table)
    assert compared
    for r, ours in compared:
        what = (r["name"], r["Input Dims_first"])
        assert ours.height == int(r["name_count"]), what
        assert set(ours["bytes"]) == {round(float(r["Data Moved (MB)_first"]) * 2**20)}, what
        assert ours["kernel_us"].sum() == pytest.approx(float(r["Kernel Time (µs)_sum"]), rel=1e-6, abs=0.01), what


@pytest.mark.parametrize("case", [SGLANG, VLLM], ids=["sglang", "vllm"])
def test_causal_attention_flops_agree_but_for_the_diagonal(shared, case):
    """TraceLens keeps Σ(sq·sk − sq²/2) query-key pairs of a causal context (its c_sqsk − c_sqsq/2) and every pair
    of a one-query decode; the pairs computed are Σ(sq·sk − sq·(sq−1)/2), c_sq/2 more. Per pair 2·H_Q·(d_qk + d_v)."""
    (r,) = (r for r in _rows(shared / case[1] / "InferenceAttention_fwd.csv") if r["name"] in ATTENTION)
    ours = _matching(_per_op(analyze(str(shared / case[0]))), r)
    per_pair = 2 * round(float(r["param: H_Q"])) * (round(float(r["param: d_h_qk"])) + round(float(r["param: d_h_v"])))
    diagonal = per_pair * float(r["param: c_sq"]) / 2
    assert set(ours["mask"]) == {"causal"}
    assert set(ours["effective_flops"]) == {round(float(r["GFLOPS_first"]) * 1e9 + diagonal)}
    # and the full block, mask aside: every query against every key
    pairs = float(r["param: c_sqsk"]) + float(r["param: g_sqsk"])
    assert set(ours["flops"]) == {round(per_pair * pairs)}


def test_framework_gemm_wrappers_are_not_counted_twice(shared):
    """TraceLens lists `aiter::gemm_a16w16` and the `aten::mm` it calls as two GEMMs with the same kernels; the
    wrapper's device time is inside the aten op's, so traceflops links no device activity and no FLOPs to it."""
    a = analyze(str(shared / SGLANG[0]))
    ops = _per_op(a)
    wrapper = ops.filter(pl.col("name") == "aiter::gemm_a16w16")
    ref = [r for r in _rows(shared / SGLANG[1] / "GEMM.csv") if r["name"] == "aiter::gemm_a16w16"]
    assert wrapper.height == sum(int(r["name_count"]) for r in ref) > 0
    assert wrapper["kernel_us"].fill_null(0).sum() == 0
    assert (wrapper["flops"].fill_null(0) == 0).all()
    wrapped = float(sum(float(r["Kernel Time (µs)_sum"]) for r in ref))
    mm = ops.filter(pl.col("name") == "aten::mm")
    assert mm["kernel_us"].sum() > wrapped  # the wrappers' kernels are the aten ops' (one LM-head mm runs unwrapped)
    assert mm["kernel_us"].sum() - wrapped < 0.01 * wrapped
