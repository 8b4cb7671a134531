"""Numbers a hostile or corrupt trace must not bend: FLOP counters that would wrap, ranks given twice, links no profiler writes.

Each case fails loudly (a clean error) or is counted in `warnings`; none may
print a negative or inflated FLOP count with exit 0.
"""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

from tests.builders import FIXTURES, Builder, shared_fixtures
from traceflops.cli.main import main
from traceflops.core.errors import EXIT_FORMAT, EXIT_INPUT

M, K, N = 48, 80, 24  # a sane mm: 2·M·K·N FLOPs
SANE = 2 * M * K * N


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def report(*args) -> dict:
    r = run("analyze", *args, "--format", "json", "--no-cache", "--peak-tflops", 1)
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    return json.loads(r.stdout)


def one_line(r, code: int, *needles: str) -> str:
    assert r.exit_code == code, (r.exit_code, r.stderr, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def mm_trace(dims_per_step: list[list], steps: int = 3) -> Builder:
    """Each step: a sane mm, then one mm per entry of `dims_per_step` (its recorded Input Dims), each with a kernel.
    The last step ends at its last kernel and is left out of the totals: they cover steps - 1."""
    b = Builder()
    for s in range(steps):
        t0 = 100_000.0 * s
        b.annotation(f"ProfilerStep#{s}", t0, 90_000)
        for i, dims in enumerate([[[M, K], [K, N]], *dims_per_step]):
            b.op("aten::mm", t0 + 10 + 100 * i, 50, **{"Input Dims": dims, "Input type": ["float", "float"]})
            b.kernel("sgemm_nn", t0 + 20 + 100 * i, t0 + 30 + 100 * i, 30)
    return b


# ------------------------------------------------------------------ FLOP counters


@pytest.mark.parametrize("side", [3_000_000, 1 << 21])  # 5.4e19 (beyond int64) and 2^64 FLOPs (wraps to 0)
def test_an_op_beyond_any_real_one_is_left_out_and_said(tmp_path, side):
    path = mm_trace([[[side, side], [side, side]]]).write(tmp_path / "t.json.gz")
    d = report(path)
    assert d["totals"]["flops"]["executed"] == 2 * SANE  # the sane mm of each step, nothing wrapped
    assert d["totals"]["hfu"] > 0
    assert any("more than" in w and "in one op" in w and "3 of them" in w for w in d["warnings"]), d["warnings"]  # one per step


def test_ops_whose_sum_would_wrap_are_a_format_error(tmp_path):
    # 40 ops of 2^57 FLOPs per step, 2 steps: 80 · 2^57 > 2^63. Each is within the per-op bound; the sum is not.
    side = 1 << 19
    path = mm_trace([[[side, side], [side, side // 2]]] * 40).write(tmp_path / "t.json.gz")
    one_line(run("analyze", path, "--no-cache"), EXIT_FORMAT, str(path), "FLOPs in all")


def test_embedding_dims_beyond_int64_do_not_make_tokens(tmp_path):
    b = mm_trace([])
    b.op("aten::embedding", 5, 2, **{"Input Dims": [[50_000, 64], [1 << 62, 1 << 62]], "Input type": ["float", "long int"]})
    path = b.write(tmp_path / "t.json.gz")
    d = report(path, "--params", 1e6, "--layers", 2, "--heads", 4, "--head-dim", 16, "--seq-len", 32)
    assert d["model"]["tokens_per_step"] is None
    assert any("tokens per step unknown" in w for w in d["warnings"]), d["warnings"]
    assert d["totals"]["flops"]["executed"] == 2 * SANE


# ------------------------------------------------------------------ duplicate ranks

DDP = FIXTURES / "dist" / "ddp"


def job(*paths, extra=()):
    r = run("analyze", *paths, "--format", "json", "--no-cache", "--quiet", "--peak-tflops", 1, *extra)
    return r


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    r = job(DDP / "rank0.json.gz", DDP / "rank1.json.gz")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_rank_given_twice_is_counted_once(two_ranks):
    r = job(DDP / "rank0.json.gz", DDP / "rank1.json.gz", DDP / "rank0.json.gz")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["totals"]["hfu"] == pytest.approx(two_ranks["totals"]["hfu"], rel=1e-12)
    assert d["totals"]["world_size"] == 2
    assert any("counted once" in w for w in d["warnings"]), d["warnings"]


def test_a_rank_beside_its_gzip_is_counted_once(tmp_path, two_ranks):
    for rank in (0, 1):
        shutil.copy(DDP / f"rank{rank}.json.gz", tmp_path / f"rank{rank}.json.gz")
    (tmp_path / "rank0.json").write_bytes(gzip.decompress((DDP / "rank0.json.gz").read_bytes()))
    r = job(tmp_path)
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["totals"]["hfu"] == pytest.approx(two_ranks["totals"]["hfu"], rel=1e-12)
    assert d["totals"]["wall_us"] == pytest.approx(two_ranks["totals"]["wall_us"], rel=1e-12)
    assert d["totals"]["world_size"] == 2 and len(d["ranks"]) == 2


def test_conflicting_traces_of_one_rank_are_an_error_naming_both(tmp_path):
    shutil.copy(DDP / "rank0.json.gz", tmp_path / "rank0.json.gz")
    shutil.copy(FIXTURES / "dist" / "fsdp2" / "rank0.json.gz", tmp_path / "rank0_again.json.gz")
    line = one_line(job(tmp_path / "rank0.json.gz", tmp_path / "rank0_again.json.gz"), EXIT_INPUT, "rank 0")
    assert "rank0.json.gz" in line and "rank0_again.json.gz" in line


def test_a_huge_world_size_is_counted_not_enumerated():
    from traceflops.views.ranks import missing_ranks

    count, first = missing_ranks(30_000_000, [0, 1, 5])
    assert count == 30_000_000 - 3
    assert first == [2, 3, 4, *range(6, 23)]
    assert missing_ranks(2, [0, 1]) is None


# ------------------------------------------------------------------ one bad rank, whatever runs the ranks


@pytest.mark.parametrize("how", [("--jobs", "1"), ("--jobs", "2"), ("--executor", "ray")])
def test_one_bad_rank_is_the_same_clean_error_everywhere(tmp_path, how):
    if how[0] == "--executor":
        pytest.importorskip("ray")
    for rank in (0, 1):
        shutil.copy(DDP / f"rank{rank}.json.gz", tmp_path / f"rank{rank}.json.gz")
    (tmp_path / "rank2.json").write_text('{"traceEvents": []}')  # a trace with nothing in it: an error, not a stray file
    one_line(run("analyze", tmp_path, "--no-cache", "--quiet", *how), EXIT_FORMAT, "rank2.json", "no host op")


@pytest.mark.parametrize("how", [("--jobs", "1"), ("--jobs", "2")])
def test_a_file_that_is_no_trace_beside_the_ranks_is_left_out_and_named(tmp_path, how, two_ranks):
    for rank in (0, 1):
        shutil.copy(DDP / f"rank{rank}.json.gz", tmp_path / f"rank{rank}.json.gz")
    (tmp_path / "hparams.json").write_text('{"lr": 0.1, "batch": 32}')
    r = run("analyze", tmp_path, "--format", "json", "--no-cache", "--quiet", "--peak-tflops", 1, *how)
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["ranks"]) == 2 and d["totals"]["hfu"] == pytest.approx(two_ranks["totals"]["hfu"], rel=1e-12)
    assert any("hparams.json" in w and "left out" in w for w in d["warnings"]), d["warnings"]
    # Alone, it is still an error.
    one_line(run("analyze", tmp_path / "hparams.json", "--no-cache"), EXIT_FORMAT, "no traceEvents")


def test_errors_survive_pickling():
    import pickle

    from traceflops.core.errors import (
        ConservationError,
        EmptyTraceError,
        FormatError,
        InputError,
        OptionsError,
    )

    for e in (InputError("p", "what", "todo"), FormatError(None, "w", "t"), EmptyTraceError("p", "w", "t"), OptionsError(None, "w", "t")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.line() == e.line() and back.exit_code == e.exit_code
    c = pickle.loads(pickle.dumps(ConservationError("loss budget", "off by 3%")))
    assert (c.what, str(c)) == ("loss budget", "off by 3%")


# ------------------------------------------------------------------ links no profiler writes


def test_launches_sharing_a_correlation_id_are_counted(tmp_path):
    b = mm_trace([])
    for e in b.events:
        if e.get("cat") in ("cuda_runtime", "kernel"):
            e["args"]["correlation"] = 7
    d = report(b.write(tmp_path / "t.json.gz"))
    assert any("share a correlation id" in w for w in d["warnings"]), d["warnings"]  # 2 launches, 1 shared: no count shown


def test_a_kernel_long_before_its_launch_is_counted(tmp_path):
    b = mm_trace([])
    kernels = [e for e in b.events if e.get("cat") == "kernel"]
    kernels[1]["ts"] -= 1e9  # 1000 s before its launch
    d = report(b.write(tmp_path / "t.json.gz"))
    assert any("before the launch" in w for w in d["warnings"]), d["warnings"]


@pytest.mark.parametrize("name", ["a100_ddp_resnet_rank0.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz",
                                  "v100_resnet50_legacy2021.json.gz"])
def test_real_gpu_traces_raise_no_link_warning(name):
    path = shared_fixtures() / "kineto" / name
    if not path.exists():
        pytest.skip(f"shared fixture {path} absent (set TRACEFLOPS_FIXTURES)")
    d = report(path)
    assert not any("correlation id" in w for w in d["warnings"]), d["warnings"]
