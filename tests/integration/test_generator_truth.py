"""Cheap tests of fixtures/cpu/truth.json itself (no traceflops import).

The expectations are written by hand from the model dimensions; one small
variant is re-run in-process to check the counting machinery against a plain
torch FlopCounterMode.
"""
import gzip
import importlib.util
import json
import os

import pytest

from tests.builders import CPU, FIXTURES

TRUTH_PATH = os.path.join(CPU, "truth.json")

SHAPES = ("ns", "sq")
VARIANTS = (
    "eager_manual", "eager_sdpa", "ckpt_reentrant", "ckpt_nonreentrant",
    "ckpt_nonreentrant_noearlystop", "ckpt_partial", "sac", "compiled",
    "compiled_ckpt", "double_backward",
)
PHASES = ("forward", "backward", "recompute", "optimizer", "other")


@pytest.fixture(scope="module")
def truth():
    with open(TRUTH_PATH) as f:
        return json.load(f)


def dims(entry):
    s = entry["shape"]
    return s["B"], s["T"], s["d"], s["H"], s["Q"], s["f"], s["vocab"], s["L"]


def linear_shapes(entry):
    """(in, out) of each Linear of one block, in forward order."""
    B, T, d, H, Q, f, V, L = dims(entry)
    fused = entry["model"]["qkv"] == "fused"
    attn_in = [(d, 3 * d)] if fused else [(d, d)] * 3
    return attn_in + [(d, d), (d, f), (f, d)]


def per_mb(entry, key, step=0, field="flops"):
    v = entry["steps"][step][field][key]
    mb = entry["microbatches"]
    assert v % mb == 0
    return v // mb


def block_forward_flops(entry):
    """Forward FLOPs of one block for one micro-batch: (per-linear list, sdpa)."""
    B, T, d, H, Q, f, V, L = dims(entry)
    tok = B * T
    lin = [2 * tok * i * o for i, o in linear_shapes(entry)]
    sdpa = 4 * B * H * T * T * Q
    return lin, sdpa


def test_all_stems_present_and_well_formed(truth):
    for sh in SHAPES:
        for v in VARIANTS:
            e = truth[f"{sh}_{v}"]
            assert e["variant"] == v
            assert e["attention"] == ("manual" if v in ("eager_manual", "double_backward")
                                      else "sdpa")
            B, T, d, H, Q, f, V, L = dims(e)
            assert Q * H == d
            m = e["model"]
            assert (m["layers"], m["heads"], m["head_dim"], m["seq_len"]) == (L, H, Q, T)
            assert m["tokens_per_step"] == B * T * e["microbatches"]
            assert len(e["steps"]) == 2
            for st in e["steps"]:
                assert st["wall_us"] > 0
                for k in ("flops", "matmul_count"):
                    assert set(st[k]) == set(PHASES)
                    assert all(isinstance(x, int) and x >= 0 for x in st[k].values())
                assert isinstance(st["sdpa_score_recompute_flops"], int)
                assert st["flops"]["optimizer"] == st["flops"]["other"] == 0
                assert st["matmul_count"]["optimizer"] == st["matmul_count"]["other"] == 0
            # the two profiled steps do identical work
            assert e["steps"][0]["flops"] == e["steps"][1]["flops"]
            assert e["steps"][0]["matmul_count"] == e["steps"][1]["matmul_count"]
            assert os.path.getsize(os.path.join(CPU, f"{sh}_{v}.json.gz")) < 2 * 2**20


def test_params_and_square_case(truth):
    for sh in SHAPES:
        e = truth[f"{sh}_eager_manual"]
        B, T, d, H, Q, f, V, L = dims(e)
        n = sum(i * o for i, o in linear_shapes(e)) * L + d * V
        assert e["model"]["params_matmul"] == n
    e = truth["sq_eager_manual"]
    B, T, d, H, Q, f, V, L = dims(e)
    assert B * T == d == f == V  # every projection's (M,N,K) is (64,64,64)
    assert linear_shapes(e) == [(d, d)] * 6


@pytest.mark.parametrize("sh", SHAPES)
def test_eager_manual_closed_form(truth, sh):
    e = truth[f"{sh}_eager_manual"]
    B, T, d, H, Q, f, V, L = dims(e)
    N = e["model"]["params_matmul"]
    tok = e["model"]["tokens_per_step"]
    fl = e["steps"][0]["flops"]
    assert fl["forward"] + fl["backward"] == 6 * N * tok + 12 * L * H * Q * T * tok
    assert fl["forward"] == 2 * N * tok + 4 * L * H * Q * T * tok
    assert fl["recompute"] == 0
    assert e["steps"][0]["sdpa_score_recompute_flops"] == 0
    # counts: per micro-batch each Linear is one addmm/mm forward and two mm
    # backward; each of the 2 attention matmuls is one bmm forward, two backward
    n_lin = len(linear_shapes(e))
    mc = e["steps"][0]["matmul_count"]
    mb = e["microbatches"]
    assert mc["forward"] == mb * (L * (n_lin + 2) + 1)
    assert mc["backward"] == 2 * mc["forward"]
    assert mc["recompute"] == 0


@pytest.mark.parametrize("sh", SHAPES)
def test_eager_sdpa(truth, sh):
    e = truth[f"{sh}_eager_sdpa"]
    m = truth[f"{sh}_eager_manual"]
    B, T, d, H, Q, f, V, L = dims(e)
    mb = e["microbatches"]
    for ph in ("forward", "backward"):
        assert per_mb(e, ph) == per_mb(m, ph)
    score = 2 * B * H * T * T * Q  # per attention backward
    assert e["steps"][0]["sdpa_score_recompute_flops"] == score * L * mb
    assert e["steps"][0]["flops"]["recompute"] == score * L * mb
    mc = e["steps"][0]["matmul_count"]
    n_lin = len(linear_shapes(e))
    assert mc["forward"] == mb * (L * (n_lin + 1) + 1)
    assert mc["backward"] == mb * (2 * (L * n_lin + 1) + L)
    assert mc["recompute"] == 0


def _expected_region_recompute(e):
    """Forward FLOPs / matmul ops re-executed per micro-batch by checkpointing."""
    B, T, d, H, Q, f, V, L = dims(e)
    lin, sdpa = block_forward_flops(e)
    v = e["variant"]
    full = (sum(lin) + sdpa, len(lin) + 1)
    fc1, fc2 = lin[-2], lin[-1]
    if v in ("ckpt_reentrant", "ckpt_nonreentrant_noearlystop"):
        per_block = full
    elif v == "ckpt_nonreentrant":
        # early stop fires when fc2's inputs are saved: fc2 never runs
        per_block = (full[0] - fc2, full[1] - 1)
    elif v == "ckpt_partial":
        per_block = (fc1, 1)  # MLP region: fc1 runs, fc2 early-stopped
    elif v == "sac":
        per_block = (sdpa, 1)  # mm/addmm are cache hits; SDPA recomputed
    elif v == "compiled_ckpt":
        # inductor recomputes every block fully except the fc2 whose output
        # is the next checkpoint's (saved) input
        return L * full[0] - (L - 1) * fc2, L * full[1] - (L - 1)
    else:
        return 0, 0
    return L * per_block[0], L * per_block[1]


@pytest.mark.parametrize("sh", SHAPES)
@pytest.mark.parametrize("v", ["ckpt_reentrant", "ckpt_nonreentrant",
                               "ckpt_nonreentrant_noearlystop", "ckpt_partial",
                               "sac", "compiled", "compiled_ckpt"])
def test_checkpointed_and_compiled(truth, sh, v):
    e = truth[f"{sh}_{v}"]
    plain = truth[f"{sh}_eager_sdpa"]
    for ph in ("forward", "backward"):
        assert per_mb(e, ph) == per_mb(plain, ph), ph
        assert per_mb(e, ph, field="matmul_count") == \
            per_mb(plain, ph, field="matmul_count"), ph
    score = per_mb(plain, "recompute")  # SDPA in-kernel score recompute
    exp_flops, exp_count = _expected_region_recompute(e)
    assert per_mb(e, "recompute") == score + exp_flops
    assert per_mb(e, "recompute", field="matmul_count") == exp_count
    mb = e["microbatches"]
    assert e["steps"][0]["sdpa_score_recompute_flops"] == score * mb


@pytest.mark.parametrize("sh", SHAPES)
def test_double_backward(truth, sh):
    e = truth[f"{sh}_double_backward"]
    m = truth[f"{sh}_eager_manual"]
    F = per_mb(m, "forward")
    assert per_mb(e, "forward") == F
    # autograd.grad(create_graph=True): 2F; the second backward goes through
    # the forward graph again (2F) and through the recorded backward graph,
    # whose every matmul has two differentiable operands (2 * 2F).  The
    # gradient-norm penalty and softmax/mask double-backward add no matmuls.
    assert per_mb(e, "backward") == 8 * F
    assert e["steps"][0]["flops"]["recompute"] == 0


def test_trace_events_vs_truth(truth):
    """Matmul-class op events in the trace = executed ops + known phantoms."""
    for stem, e in truth.items():
        for st in e["steps"]:
            assert st["trace_matmul_events"] == \
                sum(st["matmul_count"].values()) + e["phantom_matmul_events_per_step"]


def test_trace_has_required_fields():
    with gzip.open(os.path.join(CPU, "sq_ckpt_reentrant.json.gz"), "rt") as f:
        tr = json.load(f)
    keys = set()
    names = []
    for ev in tr["traceEvents"]:
        keys.update(ev.get("args", {}).keys())
        names.append(ev.get("name"))
    for k in ("Input Dims", "Input type", "Concrete Inputs", "Sequence number",
              "Fwd thread id"):
        assert k in keys
    assert [n for n in names if n and n.startswith("ProfilerStep#")] == \
        ["ProfilerStep#1", "ProfilerStep#2"]


# ---------------------------------------------------------------------------
# re-run one small variant in-process
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gen():
    torch = pytest.importorskip("torch")  # noqa: F841
    spec = importlib.util.spec_from_file_location(
        "generate_cpu", os.path.join(FIXTURES, "generate_cpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("stem", ["sq_sac"])
def test_rerun_matches_truth_and_plain_flop_counter(truth, gen, stem):
    from torch.utils.flop_counter import FlopCounterMode

    sh, v = stem.split("_", 1)
    job = gen.Job(sh, v)
    job.step(0)
    # phase-split counting nested with a plain FlopCounterMode
    with FlopCounterMode(display=False) as plain:
        with gen.PhaseFlopMode() as pm:
            job.step(1)
    assert sum(pm.flops.values()) == plain.get_total_flops()
    # a plain FlopCounterMode alone over another step
    with FlopCounterMode(display=False) as alone:
        job.step(2)
    assert alone.get_total_flops() == plain.get_total_flops()
    st = truth[stem]["steps"][0]
    assert pm.flops == st["flops"]
    assert pm.counts == st["matmul_count"]
    assert pm.score_recompute == st["sdpa_score_recompute_flops"]
    if v == "sac":
        # only the SDPA forwards are recomputed: mm/addmm were cache hits
        L, mb = truth[stem]["shape"]["L"], truth[stem]["microbatches"]
        names = [n for ph, n, _, _ in pm.log if ph == "recompute"]
        assert len(names) == L * mb
        assert all("scaled_dot_product" in n for n in names)
