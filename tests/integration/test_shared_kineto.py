"""Real traces from other projects: parse all, and agree with peer tools where they have outputs."""

import csv
import json

import orjson
import polars as pl
import pytest

from traceflops.run.load import analyze


def kineto_files(shared):
    return sorted((shared / "kineto").rglob("*.json.gz"))


def test_every_shared_kineto_trace_parses_and_accounts_for_its_kernels(shared):
    files = kineto_files(shared)
    assert len(files) >= 17
    for f in files:
        a = analyze(str(f))
        k = a.kernels
        # every device activity has exactly one class and a phase
        assert k["cls"].null_count() == 0 and k["phase"].null_count() == 0, f.name
        in_steps = int((k["step"] >= 0).sum())
        outside = (a.outside_steps or {}).get("kernels", 0)
        assert in_steps + outside == k.height, f.name
        t = a.totals
        if t["matmul_flops_unknown_count"]:
            assert any("FLOPs" in w for w in a.warnings), f.name


def test_mi300_recomputed_convolutions_are_tagged_recompute(shared):
    """Fixture facts: per step 20 forward convolutions and 19 recomputed ones, 57 over 3 steps."""
    a = analyze(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"))
    conv = a.ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("name").str.contains("convolution") & ~pl.col("name").str.contains("backward"))
    by_phase = dict(conv.group_by("phase").len().iter_rows())
    assert by_phase["recompute"] == 57
    assert by_phase["forward"] == 60
    # the recomputed ones run inside ReluBackward0 nodes
    assert set(conv.filter(pl.col("phase") == "recompute")["node"].unique()) == {"ReluBackward0"}
    # their kernels are tagged too
    rk = a.kernels.filter((pl.col("phase") == "recompute") & (pl.col("cls") == "matmul"))
    assert rk.height >= 57


def test_qwen_gemm_flops_agree_with_tracelens(shared):
    """TraceLens reports 2·M·N·K (+ M·N when the GEMM adds a bias); traceflops counts 2·M·N·K only,
    as FlopCounterMode does. Compare after removing TraceLens' bias term, per shape and count."""
    ref_path = shared / "reference" / "h100_qwen_inference.tracelens_GEMM.csv"
    a = analyze(str(shared / "kineto" / "h100_qwen_inference.json.gz"))
    ops = a.ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("name").is_in(["aten::mm", "aten::addmm", "aten::bmm"]))
    ours = {}
    for name, dims, flops in ops.select("name", "dims", "flops").iter_rows():
        ours.setdefault((name, dims), []).append(flops)
    with open(ref_path) as f:
        rows = list(csv.DictReader(f))
    assert rows
    for r in rows:
        dims = orjson.dumps(json.loads(r["Input Dims_first"])).decode()
        m, n, k = int(r["param: M"]), int(r["param: N"]), int(r["param: K"])
        bias = r["param: bias"] == "True"
        ref = round(float(r["GFLOPS_first"]) * 1e9) - (m * n if bias else 0)
        got = ours[(r["name"], dims)]
        assert len(got) == int(r["name_count"])
        assert set(got) == {ref} == {2 * m * n * k}


def test_qwen_inference_report(shared):
    a = analyze(str(shared / "kineto" / "h100_qwen_inference.json.gz"))
    assert a.model["mode"] == "inference"
    assert a.hardware["name"].startswith("NVIDIA H100 SXM")
    assert a.hardware["precision"] == "bf16"
    assert a.hardware["peak_flops"] == pytest.approx(989.4e12, rel=1e-3)
    assert a.totals["matmul_count"]["backward"] == 0
    assert 0 < a.totals["mfu"] <= a.totals["hfu"] < 1


def test_legacy_2021_trace_never_assumes_stride(shared):
    """No Concrete Inputs: forward convolution FLOPs come from the consuming op's input shape."""
    a = analyze(str(shared / "kineto" / "v100_resnet50_legacy2021.json.gz"))
    conv = a.ops.filter(pl.col("matmul") & (pl.col("name") == "aten::cudnn_convolution"))
    stem = conv.filter(pl.col("dims").str.starts_with("[[32,3,224,224],[64,3,7,7]")).row(0, named=True)
    # ResNet-50 stem: 7x7 stride 2 → 112x112 output; stride 1 would give 4x the FLOPs.
    assert stem["flops"] == 2 * 32 * 64 * 112 * 112 * 3 * 7 * 7


def test_legacy_2021_weight_gradients_match_forward_convolutions(shared):
    """Two independent derivations agree: forward FLOPs from the consuming op's shape, weight-gradient
    FLOPs from the backward's own grad_output and the parent's weight shape. For every convolution
    the weight gradient costs exactly its forward."""
    a = analyze(str(shared / "kineto" / "v100_resnet50_legacy2021.json.gz"))
    m = a.ops.filter(pl.col("matmul"))
    fwd = m.filter(pl.col("name") == "aten::cudnn_convolution")
    wgrad = m.filter(pl.col("name") == "aten::cudnn_convolution_backward_weight")
    assert fwd.height == wgrad.height > 0
    assert fwd["flops"].null_count() == 0 and wgrad["flops"].null_count() == 0
    assert fwd["flops"].sum() == wgrad["flops"].sum()
    assert a.totals["flops_coverage"] == 1.0


def test_qwen_inference_with_a_model_description(shared):
    """Qwen1.5-0.5B, described by the weight shapes its own GEMMs show (hidden 1024, MLP 2816,
    24 layers, 16 heads of 64): forward-only model FLOPs 2N + 4·L·H·Q·T per token, with the
    tokens (16 × 559) read from the input embedding. The captured step holds no LM-head GEMM
    (TraceLens' GEMM table agrees), so N here is the decoder's weights only."""
    from click.testing import CliRunner

    from traceflops.cli.main import main

    d, f, layers, heads, q, seq = 1024, 2816, 24, 16, 64, 559
    n = layers * (4 * d * d + 3 * d * f)
    r = CliRunner().invoke(main, ["analyze", str(shared / "kineto" / "h100_qwen_inference.json.gz"), "--format", "json",
                                  "--params", str(n), "--layers", str(layers), "--heads", str(heads),
                                  "--head-dim", str(q), "--seq-len", str(seq)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    m = rep["model"]
    assert m["mode"] == "inference" and m["tokens_per_step"] == 16 * 559
    assert m["flops_per_step"] == (2 * n + 4 * layers * heads * q * seq) * 16 * 559
    assert m["flops_per_step_no_attention"] == 2 * n * 16 * 559
    assert m["band"] is None  # bands are for dense training
    hw = rep["hardware"]
    assert hw["precision"] == "bf16" and hw["peak_flops"] == pytest.approx(989.4e12, rel=1e-3) and hw["sparse"] is False
    s = rep["steps"][0]
    assert s["mfu"] == pytest.approx(m["flops_per_step"] / (s["dur_us"] * 1e-6 * hw["peak_flops"]))
    # PaLM's formula and the executed GEMMs agree to the FLOP: the only other matmul is the
    # rotary embedding's [1,32,1]x[1,1,559] bmm (2·32·559 FLOPs), which is not weight work.
    assert s["flops"]["executed"] - m["flops_per_step"] == 2 * 32 * 559
    assert not any("exceeds HFU" in w for w in rep["warnings"])
    # terminal output carries the labels
    r = CliRunner().invoke(main, ["analyze", str(shared / "kineto" / "h100_qwen_inference.json.gz"),
                                  "--params", str(n), "--layers", str(layers), "--heads", str(heads),
                                  "--head-dim", str(q), "--seq-len", str(seq)])
    assert "inference" in r.output and "bf16" in r.output and "MFU" in r.output


def test_dlrm_all_to_alls_are_not_pipeline_transfers(shared):
    """DLRM's embedding all-to-alls run as NCCL SendRecv kernels under `nccl:all_to_all`, with no collective name in
    their `record_param_comms`: all-to-alls, so the job shows no pipeline (it has no stages to show)."""
    from traceflops.views.collectives import collectives
    from traceflops.views.job import job_view, summarize

    runs = [analyze(str(shared / "kineto" / "dlrm_8rank" / f"rank{r}.json.gz")) for r in range(8)]
    for a in runs:
        c = collectives(a)
        sendrecv = c.filter(pl.col("name").str.contains("SendRecv"))
        assert sendrecv.height > 0 and set(sendrecv["kind"]) == {"all_to_all"}
        assert set(c.filter(pl.col("name").str.contains("AllReduce"))["kind"]) == {"allreduce"}
    assert job_view([summarize(a) for a in runs]).pipeline is None


def test_symmetric_memory_all_reduces_move_their_ops_input(shared):
    """vLLM on B200 all-reduces through `symm_mem::multimem_all_reduce_` (no NCCL, no recorded message size): each
    of its 73 kernels moves its op's one input tensor, counted from the raw file as elements x 2 bytes (bf16)."""
    import gzip

    from traceflops.views.collectives import collectives

    path = shared / "kineto" / "b200_inference_rank0.json.gz"
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    by_hand = []
    for e in events:
        if e.get("name") == "symm_mem::multimem_all_reduce_":
            (n,), *_ = e["args"]["Input Dims"]
            assert e["args"]["Input type"][0] == "c10::BFloat16"
            by_hand.append(n * 2)
    c = collectives(analyze(str(path))).filter(pl.col("name").str.contains("multimem_all_reduce"))
    assert len(by_hand) == c.height == 73
    assert sorted(c["bytes"]) == sorted(by_hand) and set(c["kind"]) == {"allreduce"}


def test_legacy_2021_external_ids_read_in_their_old_spelling(shared):
    """Before 2022 Kineto spelled a device activity's and a runtime call's `External id` as `external id`; the ops
    have the new spelling. Both are read: every device activity keeps the id the file gives it."""
    import gzip

    path = shared / "kineto" / "v100_resnet50_legacy2021.json.gz"
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    device = [e for e in events if e.get("cat") in ("Kernel", "Memset", "Memcpy") and e.get("ph") == "X"]
    assert device and all("external id" in e["args"] and "External id" not in e["args"] for e in device)
    a = analyze(str(path))
    assert sorted(a.kernels["ext_id"].to_list()) == sorted(e["args"]["external id"] for e in device)
