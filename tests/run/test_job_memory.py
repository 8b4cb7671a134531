"""A job's memory stays flat in its number of ranks, and the benchmark measures it honestly (no timings asserted).

Rank workers start with an allocator that hands freed pages back at once (else each
rank's leftovers pad the next one's peak) and glibc's large blocks on huge pages; the benchmark sums PSS as well as RSS over
the process tree; its job folder is one rank per file for HTA as for traceflops.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from tests.builders import ROOT
from traceflops.core.results import ModelOptions
from traceflops.run import ranks
from traceflops.run.ranks import summarize_all

CONF = "_RJEM_MALLOC_CONF"
TUNABLES = "GLIBC_TUNABLES"


def conf_after_cli_start(user: str | None) -> str:
    """The allocator setting as this process holds it once the CLI has loaded polars (the user's own, if any)."""
    env = {k: v for k, v in os.environ.items() if k != CONF} | ({CONF: user} if user else {})
    code = f"import os, traceflops.cli.main, polars; print(os.environ[{CONF!r}])"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def last_values(conf: str) -> dict[str, str]:
    """jemalloc reads `key:value,...` left to right: the last value of a key wins."""
    return dict(item.split(":", 1) for item in conf.split(",") if ":" in item)


class RecordingWorker:
    """A stand-in rank worker: what the allocator setting is as a worker process would start."""

    seen: ClassVar[list[str | None]] = []
    tunables: ClassVar[list[str | None]] = []  # glibc's, as each worker would start

    def __init__(self):
        RecordingWorker.seen.append(os.environ.get(CONF))
        RecordingWorker.tunables.append(os.environ.get(TUNABLES))

    def summarize(self, work):
        return object()

    def stop(self, at_once):
        pass


def workers_conf(monkeypatch, parent: str | None) -> list[str | None]:
    if parent is None:
        monkeypatch.delenv(CONF, raising=False)
    else:
        monkeypatch.setenv(CONF, parent)
    RecordingWorker.seen = []
    RecordingWorker.tunables = []
    monkeypatch.setattr(ranks, "_Worker", RecordingWorker)
    monkeypatch.setattr(ranks, "_attempt", lambda work: object())  # the ranks this process takes itself
    got = summarize_all(["a.json", "b.json"], ModelOptions(), jobs=2)
    assert len(got) == 2
    return RecordingWorker.seen


def test_rank_workers_hand_freed_pages_back_at_once(monkeypatch):
    parent = conf_after_cli_start(None)
    seen = workers_conf(monkeypatch, parent)
    for conf in seen:
        assert conf is not None and conf.startswith(parent)
        assert last_values(conf)["dirty_decay_ms"] == "0" and last_values(conf)["muzzy_decay_ms"] == "0", conf
    assert os.environ[CONF] == parent  # this process's environment as it was


def test_rank_workers_without_any_setting_still_purge_and_the_environment_is_left_unset(monkeypatch):
    seen = workers_conf(monkeypatch, None)
    assert all(last_values(c or "").get("dirty_decay_ms") == "0" for c in seen), seen
    assert CONF not in os.environ


def test_a_users_own_allocator_setting_reaches_the_workers_unchanged(monkeypatch):
    parent = conf_after_cli_start("dirty_decay_ms:2000")
    assert set(workers_conf(monkeypatch, parent)) == {parent}


def test_rank_workers_start_with_glibcs_large_blocks_on_huge_pages_unless_the_user_set_glibcs_tunables(monkeypatch):
    monkeypatch.delenv(TUNABLES, raising=False)
    workers_conf(monkeypatch, None)
    assert RecordingWorker.tunables == ["glibc.malloc.hugetlb=1"]  # one worker beside this process
    assert TUNABLES not in os.environ  # this process's environment as it was
    monkeypatch.setenv(TUNABLES, "glibc.malloc.arena_max=2")
    workers_conf(monkeypatch, None)
    assert RecordingWorker.tunables == ["glibc.malloc.arena_max=2"]


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else None


def anon_huge_kib(env: dict) -> int:
    """A process started with `env` touches 32 MiB in one block: how much of its memory is on huge pages."""
    code = (
        "b = b'x' * (32 << 20)\n"
        "print(next(l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')).split()[1])"
    )
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)


def test_a_worker_started_in_the_workers_environment_gets_huge_pages_where_the_kernel_gives_them_on_request(
    monkeypatch,
):
    import platform

    if platform.libc_ver()[0] != "glibc" or _thp_mode() != "madvise":
        import pytest

        pytest.skip(f"needs glibc and transparent huge pages in madvise mode (here: {_thp_mode()})")
    monkeypatch.delenv(TUNABLES, raising=False)
    plain = dict(os.environ)
    with ranks._worker_environment():
        started = dict(os.environ)
    assert anon_huge_kib(started) >= 16 << 10
    assert anon_huge_kib(plain) == 0  # the same block, started without it


def bench():
    spec = importlib.util.spec_from_file_location("bench_parse", ROOT / "benchmarks" / "bench_parse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_counts_a_grandchild_in_the_trees_rss_and_pss():
    child = "import time; b = b'x' * (64 << 20); time.sleep(1.0)"  # 64 MiB touched in a grandchild
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    r = bench().run_isolated(code, "unused")
    assert "error" not in r, r
    assert r["peak_tree_pss_mb"] >= 64, r
    assert r["peak_tree_rss_mb"] >= r["peak_tree_pss_mb"], r


def test_the_benchmarks_job_folder_is_one_rank_per_file_for_hta_and_traceflops(shared, tmp_path):
    folder = bench().job_folder(3, shared / "kineto" / "mi250_toy_train.json.gz", tmp_path)
    paths = sorted(str(p) for p in folder.iterdir())
    assert [s.rank for s in summarize_all(paths, ModelOptions())] == [0, 1, 2]
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return
    assert sorted(TraceAnalysis(trace_dir=str(folder)).t.traces) == [0, 1, 2]


def test_a_summary_held_packed_comes_back_the_same():
    """A job holds each rank's summary packed (its `.tfsum` bytes) until the merge: it comes back equal; an error stays
    as it is."""
    import dataclasses

    import polars as pl

    from traceflops.core.errors import NotATraceError
    from traceflops.run.load import analyze
    from traceflops.views.job import summarize

    summary = summarize(analyze(str(ROOT / "fixtures" / "dist" / "tp" / "rank0.json.gz")))  # a rank with collectives
    held = ranks.packed(summary)
    assert isinstance(held, ranks.Packed) and held.blob.startswith(b"PK")  # a zip of parquet and JSON: no pickle
    back = ranks.unpacked(held)
    for f in dataclasses.fields(summary):
        a, b = getattr(summary, f.name), getattr(back, f.name)
        assert a.equals(b) if isinstance(a, pl.DataFrame) else a == b, f.name
    error = NotATraceError("x.json", "not JSON", "give a trace")
    assert ranks.packed(error) is error and ranks.unpacked(error) is error
