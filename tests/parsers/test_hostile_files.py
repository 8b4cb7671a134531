"""Hostile files and paths (not their JSON): refused with one line and the README's exit code, never a hang or an OOM kill.

Pipes, devices and sockets are refused before anything reads them; the cache
never follows a link out of itself and notices a trace edited in place; a
summary is bounded and checked field by field. Runs that could hang or eat
memory on a regression go through a subprocess with a timeout and a memory cap.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import orjson
import polars as pl
import pytest
from click.testing import CliRunner

from tests.cli.test_bad_input import one_line, small_gpu_trace
from traceflops.cli.main import main
from traceflops.core.errors import EXIT_FORMAT, EXIT_INPUT

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 6 << 30  # a regression that reads /dev/zero dies of this, not the machine


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def analyze(*args, env=None):
    return cli("analyze", *args, "--peak-tflops", 1, "--quiet", env=env)


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_cli(*args, timeout=60, **kw) -> subprocess.CompletedProcess:
    """The command in a fresh process, killed after `timeout` seconds and capped in memory."""
    cmd = [sys.executable, "-m", "traceflops.cli", *[str(a) for a in args]]
    return subprocess.run(cmd, check=False, capture_output=True, timeout=timeout, cwd=ROOT, preexec_fn=_capped, **kw)


def refused(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    err = proc.stderr.decode(errors="replace").strip()
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and "; " in err, err
    for n in needles:
        assert n.lower() in err.lower(), (n, err)
    return err


@pytest.fixture
def trace(tmp_path) -> Path:
    return Path(small_gpu_trace().write(tmp_path / "t.json.gz"))


# ------------------------------------------------------------------ not regular files


@pytest.mark.parametrize("name", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_before_it_is_read(name, tmp_path):
    refused(run_cli("analyze", name, "--peak-tflops", 1, "--no-cache"), EXIT_INPUT, name, "not a regular file", "save it to a file")


def test_a_link_to_a_device_named_like_a_trace_is_refused(tmp_path):
    link = tmp_path / "zero.json.gz"
    link.symlink_to("/dev/zero")
    refused(run_cli("analyze", link, "--peak-tflops", 1, "--cache-dir", tmp_path / "c"), EXIT_INPUT, "not a regular file")


def test_a_fifo_without_a_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    refused(run_cli("analyze", fifo, "--peak-tflops", 1, "--no-cache", timeout=30), EXIT_INPUT, "pipe", "not a regular file")


def test_a_fifo_with_a_writer_is_refused(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"cat '{small_gpu_trace().write(tmp_path / 'w.json', gz=False)}' > '{fifo}'"])
    try:
        refused(run_cli("analyze", fifo, "--peak-tflops", 1, "--no-cache", timeout=30), EXIT_INPUT, "pipe")
    finally:
        writer.kill()
        writer.wait()


def test_a_socket_is_refused():
    folder = tempfile.mkdtemp(prefix="tf-sock-", dir="/tmp")  # a socket path must be short
    path = os.path.join(folder, "s.json")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(path)
        one_line(analyze(path, "--no-cache"), EXIT_INPUT, "socket", "not a regular file", path=path)
    finally:
        s.close()
        os.unlink(path)
        os.rmdir(folder)


def test_process_substitution_and_stdin_are_refused(trace):
    """`<(zcat t.json.gz)` and `cat t | traceflops analyze /dev/stdin` are pipes; `-` is not a file either."""
    r, w = os.pipe()
    os.write(w, b'{"traceEvents": []}')
    os.close(w)
    try:
        proc = run_cli("analyze", f"/dev/fd/{r}", "--peak-tflops", 1, "--no-cache", pass_fds=(r,), timeout=30)
    finally:
        os.close(r)
    refused(proc, EXIT_INPUT, "pipe", "save it to a file")
    piped = run_cli("analyze", "/dev/stdin", "--peak-tflops", 1, "--no-cache", input=trace.read_bytes(), timeout=30)
    refused(piped, EXIT_INPUT, "pipe", "not a regular file")
    one_line(analyze("-", "--no-cache"), EXIT_INPUT, "standard input", path="-")


def test_a_device_or_fifo_as_a_summary_is_refused(tmp_path):
    fifo = tmp_path / "r0.tfsum"
    os.mkfifo(fifo)
    refused(run_cli("merge", "/dev/zero", timeout=30), EXIT_INPUT, "not a regular file")
    refused(run_cli("merge", fifo, timeout=30), EXIT_INPUT, "not a regular file")


# ------------------------------------------------------------------ links, permissions, gzip, names


def test_a_symlink_loop_is_an_input_error(tmp_path):
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    one_line(analyze(tmp_path / "a.json", "--cache-dir", tmp_path / "c"), EXIT_INPUT, "link", path=tmp_path / "a.json")


def test_an_unreadable_trace_with_the_cache_on_is_an_input_error(trace, tmp_path, monkeypatch):
    """Permission denied on open, whoever opens it (root ignores chmod, so the denial is simulated)."""
    real_open, real_os_open = open, os.open

    def deny(path, *a, **k):
        if os.fspath(path) == str(trace):
            raise PermissionError(13, "Permission denied", str(path))
        return (real_os_open if a and isinstance(a[0], int) else real_open)(path, *a, **k)

    monkeypatch.setattr("builtins.open", deny)
    monkeypatch.setattr(os, "open", deny)
    one_line(analyze(trace, "--cache-dir", tmp_path / "c"), EXIT_INPUT, "permission denied", path=trace)


@pytest.mark.parametrize("tail", [b"x", b"garbage!", b"\0" * 512])
def test_gzip_with_trailing_garbage_is_one_input_error(trace, tail):
    trace.write_bytes(trace.read_bytes() + tail)
    one_line(analyze(trace, "--no-cache"), EXIT_INPUT, "trailing garbage", path=trace)


def test_a_non_utf8_file_name_is_analysed_and_escaped_in_json(trace, tmp_path):
    odd = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"tr\xffce.json.gz"))
    os.rename(trace, odd)
    for extra in (["--cache-dir", tmp_path / "c"], ["--cache-dir", tmp_path / "c"], ["--no-cache"]):  # cold, cached, uncached
        r = analyze(odd, "--format", "json", *extra)
        assert r.exit_code == 0, (r.stderr, r.exception)
        assert json.loads(r.stdout)["inputs"][0]["path"].endswith("tr\\xffce.json.gz")


# ------------------------------------------------------------------ the cache


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.tf*"))


@pytest.mark.parametrize("plant", ["link to /dev/zero", "fifo"])
def test_a_cache_entry_that_is_a_device_link_or_a_fifo_is_never_read(trace, tmp_path, plant):
    cache = tmp_path / "c"
    assert run_cli("analyze", trace, "--peak-tflops", 1, "--format", "json", "--cache-dir", cache).returncode == 0
    entries = _entries(cache)
    assert entries
    for e in entries:
        e.unlink()
        e.symlink_to("/dev/zero") if plant.startswith("link") else os.mkfifo(e)
    proc = run_cli("analyze", trace, "--peak-tflops", 1, "--format", "json", "--cache-dir", cache, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert all(not e.is_symlink() and e.is_file() for e in entries)  # replaced by fresh entries, never read


def test_a_cache_entry_linked_out_of_the_cache_is_a_miss(trace, tmp_path):
    """A link to another trace's valid entries elsewhere is not followed, nor written through: the numbers are this trace's."""
    cache, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    other = Path(small_gpu_trace().write(tmp_path / "other.json", gz=False))
    other.write_text(other.read_text().replace("[64, 32]", "[32, 32]"))
    mine, theirs = (analyze(t, "--format", "json", "--cache-dir", c) for t, c in ((trace, cache), (other, elsewhere)))
    assert mine.exit_code == theirs.exit_code == 0
    assert json.loads(mine.stdout)["totals"] != json.loads(theirs.stdout)["totals"]
    kept = {e.suffix: e for e in _entries(elsewhere)}
    for e in _entries(cache):
        e.unlink()
        e.symlink_to(kept[e.suffix])
    before = {e: e.read_bytes() for e in kept.values()}
    r = analyze(trace, "--format", "json", "--cache-dir", cache)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["totals"] == json.loads(mine.stdout)["totals"]
    assert all(not e.is_symlink() for e in _entries(cache))
    assert {e: e.read_bytes() for e in kept.values()} == before  # the links' targets are not written through


def test_a_trace_edited_in_place_with_size_and_mtime_restored_is_not_served_stale(tmp_path):
    """The edit is in the middle of a file of a few MiB: neither its size, its times, nor its first and last MiB change."""
    doc = small_gpu_trace().doc()
    pad = "x" * (3 << 20)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"padHead": pad, **doc, "padTail": pad}))
    cache = tmp_path / "c"

    def flops() -> int:
        r = analyze(path, "--format", "json", "--cache-dir", cache)
        assert r.exit_code == 0, r.stderr
        return sum(s["flops"]["executed"] for s in json.loads(r.stdout)["steps"])

    before = flops()
    assert before > 0
    st = os.stat(path)
    text = path.read_text()
    assert text.count("[64, 32]") == 3  # one mm per step
    path.write_text(text.replace("[64, 32]", "[32, 32]"))  # the same size: half the mm's M
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    assert flops() * 2 == before


# ------------------------------------------------------------------ TRACEFLOPS_MAX_BYTES


def test_max_bytes_in_exponent_notation_is_a_limit(trace):
    one_line(analyze(trace, "--no-cache", env={"TRACEFLOPS_MAX_BYTES": "1e2"}), EXIT_INPUT, "100-byte limit", path=trace)
    assert analyze(trace, "--no-cache", env={"TRACEFLOPS_MAX_BYTES": "1e9"}).exit_code == 0
    assert analyze(trace, "--no-cache", env={"TRACEFLOPS_MAX_BYTES": "1GiB"}).exit_code == 0


@pytest.mark.parametrize("value", ["-1", "abc", "0", "1.5"])
def test_a_bad_max_bytes_is_refused_naming_the_variable(trace, value):
    line = one_line(analyze(trace, "--no-cache", env={"TRACEFLOPS_MAX_BYTES": value}), EXIT_INPUT, value)
    assert line.startswith("error: TRACEFLOPS_MAX_BYTES"), line  # the variable is what is wrong, not the trace


# ------------------------------------------------------------------ names and folders


def test_an_existing_file_with_a_bracket_is_a_file_not_a_glob(tmp_path):
    path = Path(small_gpu_trace().write(tmp_path / "run[0].json.gz"))
    assert analyze(path, "--no-cache").exit_code == 0
    small_gpu_trace().write(tmp_path / "run1.json.gz")
    assert analyze(tmp_path / "run[1].json.gz", "--no-cache").exit_code == 0  # absent: a pattern, matching run1


def test_what_a_job_folder_leaves_out_is_a_warning(tmp_path, monkeypatch):
    """An unlistable subfolder and a trace-named pipe are named, not skipped in silence (denial simulated: root ignores chmod)."""
    from traceflops.run.inputs import expand, expand_with_warnings

    for d in ("a", "locked"):
        (tmp_path / d).mkdir()
        small_gpu_trace().write(tmp_path / d / "rank0.json.gz")
    os.mkfifo(tmp_path / "a" / "rank1.json")
    locked, real_scandir = str(tmp_path / "locked"), os.scandir

    def scandir(p="."):
        if os.fspath(p) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_scandir(p)

    monkeypatch.setattr(os, "scandir", scandir)
    paths, warnings = expand_with_warnings([str(tmp_path)])
    assert paths == [str(tmp_path / "a" / "rank0.json.gz")] == expand([str(tmp_path)])
    assert len(warnings) == 2
    assert any(locked in w and "cannot be read" in w for w in warnings), warnings
    assert any("rank1.json" in w and "pipe" in w for w in warnings), warnings


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 folder anyway")
def test_an_unreadable_job_subfolder_is_a_warning(tmp_path):
    from traceflops.run.inputs import expand_with_warnings

    for d in ("a", "locked"):
        (tmp_path / d).mkdir()
        small_gpu_trace().write(tmp_path / d / "rank0.json.gz")
    (tmp_path / "locked").chmod(0)
    try:
        _, warnings = expand_with_warnings([str(tmp_path)])
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert any("locked" in w for w in warnings), warnings


# ------------------------------------------------------------------ summaries


@pytest.fixture
def summary(trace, tmp_path) -> Path:
    out = tmp_path / "r0.tfsum"
    r = cli("summarize", trace, "-o", out, "--peak-tflops", 1, "--no-cache")
    assert r.exit_code == 0, r.stderr
    assert cli("merge", out).exit_code == 0
    return out


def _bundle(path: Path) -> tuple[dict[str, bytes], dict]:
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    return members, orjson.loads(members.pop("meta.json"))


def _rewrite(path: Path, members: dict[str, bytes], meta, compression=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("meta.json", orjson.dumps(meta))
        for n, data in members.items():
            z.writestr(n, data)
    return path


def test_a_summary_that_inflates_to_gigabytes_is_refused(summary, tmp_path):
    members, meta = _bundle(summary)
    bomb = tmp_path / "bomb.tfsum"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("meta.json", orjson.dumps(meta))
        for n, data in members.items():
            z.writestr(n, data)
        with z.open("padding.parquet", "w", force_zip64=True) as f:
            zeros = bytes(64 << 20)
            for _ in range(12):  # 768 MiB of zeros in under 1 MiB
                f.write(zeros)
    assert bomb.stat().st_size < 4 << 20
    refused(run_cli("merge", bomb, timeout=60), EXIT_FORMAT, "too large")


def test_a_summary_table_of_millions_of_run_length_rows_is_refused(summary, tmp_path):
    members, meta = _bundle(summary)
    buf = io.BytesIO()
    pl.DataFrame({"step": pl.zeros(20_000_000, dtype=pl.Int64, eager=True)}).write_parquet(buf, compression="zstd")
    assert len(buf.getvalue()) < 1 << 20
    members["idle.parquet"] = buf.getvalue()
    refused(run_cli("merge", _rewrite(tmp_path / "rle.tfsum", members, meta), timeout=60), EXIT_FORMAT, "rows")


def _empty_steps(members, meta):
    buf = io.BytesIO()
    pl.DataFrame().write_parquet(buf)
    return {**members, "steps.parquet": buf.getvalue()}, meta


@pytest.mark.parametrize(
    "tamper, needle",
    [
        (lambda m, meta: (m, {**meta, "rank": [0]}), "rank"),
        (lambda m, meta: (m, {k: v for k, v in meta.items() if k != "totals"}), "totals"),
        (lambda m, meta: (m, [meta]), "not a traceflops rank summary"),
        (lambda m, meta: (m, {**meta, "world_size": "8"}), "world_size"),
        (lambda m, meta: (m, {**meta, "hardware": "h100"}), "hardware"),
        (lambda m, meta: (m, {**meta, "warnings": [1, 2]}), "warnings"),
        (lambda m, meta: ({k: v for k, v in m.items() if k != "steps.parquet"}, meta), "steps"),
        (_empty_steps, "steps"),
    ],
    ids=["rank-list", "no-totals", "meta-array", "world-size-text", "hardware-text", "warnings-numbers", "no-steps", "empty-steps"],
)
def test_a_tampered_summary_is_a_format_error(summary, tmp_path, tamper, needle):
    members, meta = tamper(*_bundle(summary))
    bad = _rewrite(tmp_path / "bad.tfsum", members, meta)
    one_line(cli("merge", bad), EXIT_FORMAT, needle, path=bad)


# ------------------------------------------------------------------ every command, not only analyze


def test_summarize_refuses_a_fifo_without_hanging(tmp_path):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    refused(run_cli("summarize", fifo, "-o", tmp_path / "r.tfsum", timeout=30), EXIT_INPUT, "pipe")


def test_a_fifo_without_a_trace_suffix_is_refused_by_the_format_probe(tmp_path):
    fifo = tmp_path / "trace"
    os.mkfifo(fifo)
    refused(run_cli("analyze", fifo, "--no-cache", timeout=30), EXIT_INPUT, "pipe")


def test_what_a_job_folder_leaves_out_reaches_the_report(tmp_path):
    for rank in (0, 1):
        small_gpu_trace().write(tmp_path / f"rank{rank}.json.gz")
    os.mkfifo(tmp_path / "rank2.json")
    r = cli("analyze", tmp_path, "--format", "json", "--no-cache", "--quiet", "--peak-tflops", 1)
    assert r.exit_code == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    assert any("rank2.json" in w and "pipe" in w for w in warnings), warnings


def test_a_job_folder_with_a_name_that_is_not_utf8(tmp_path):
    folder = os.fsencode(tmp_path)
    for rank, name in ((0, b"rank0.json.gz"), (1, b"r\xffnk1.json.gz")):
        data = Path(small_gpu_trace().write(tmp_path / f"tmp{rank}.json.gz")).read_bytes()
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        os.unlink(tmp_path / f"tmp{rank}.json.gz")
    for fmt in ("json", "terminal"):
        r = cli("analyze", tmp_path, "--format", fmt, "--no-cache", "--quiet", "--peak-tflops", 1)
        assert r.exit_code == 0, (fmt, r.stderr)
        shown = [i["path"] for i in json.loads(r.stdout)["inputs"]] if fmt == "json" else [r.stdout]
        assert any("r\\xffnk1.json.gz" in s for s in shown), (fmt, shown)
