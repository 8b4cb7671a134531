"""Broken and hostile input at the command line: one line on stderr, a documented exit code, never a traceback.

Every failure must print exactly one line naming the file, what is wrong and
what to do (`error: PATH: WHAT; TODO`), and exit with the README's code:
2 the input cannot be read or the command line is wrong, 3 not a trace
traceflops understands, 4 an internal check failed. `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import CPU, Builder
from traceflops.cli.main import main
from traceflops.core.errors import EXIT_FORMAT, EXIT_INPUT

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89" + bytes(range(256))


def invoke(*args, env=None):
    return CliRunner().invoke(main, ["analyze", *[str(a) for a in args]], env=env)


def one_line(result, code: int, *needles: str, path: str | Path | None = None) -> str:
    """Assert the one-line failure contract; return the line."""
    err = result.stderr
    assert result.exit_code == code, (result.exit_code, err, result.exception)
    assert "Traceback" not in err and "Traceback" not in result.stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") and "; " in line, line  # what; what to do
    if path is not None:
        assert str(path) in line, line
    low = line.lower()
    for n in needles:
        assert n.lower() in low, (n, line)
    return line


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def small_gpu_trace() -> Builder:
    """Three steps of an mm on a device, with shapes: FLOPs known, analysis fast. The last ends at its last kernel and
    is left out of the totals, which cover two steps."""
    b = Builder()
    for s in range(3):
        t0 = 1000.0 * s
        b.annotation(f"ProfilerStep#{s}", t0, 900)
        b.op("aten::mm", t0 + 10, 50, **{"Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]})
        b.kernel("sgemm_64x16", t0 + 20, t0 + 100, 30)
    return b


def analyze_json(*args, env=None) -> dict:
    r = invoke(*args, "--format", "json", "--peak-tflops", 1, env=env)
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)


# ------------------------------------------------------------------ files that are not there


def test_missing_file_without_cache(tmp_path):
    p = tmp_path / "nope.json.gz"
    one_line(invoke(p, "--no-cache"), EXIT_INPUT, "no such file", path=p)


def test_missing_file_with_the_cache_on(tmp_path):
    p = tmp_path / "nope.json.gz"
    one_line(invoke(p), EXIT_INPUT, "no such file", path=p)


def test_directory_without_traces(tmp_path):
    d = tmp_path / "empty_dir"
    d.mkdir()
    one_line(invoke(d), EXIT_INPUT, "directory", path=d)


def test_glob_matching_nothing(tmp_path):
    one_line(invoke(tmp_path / "*.json.gz"), EXIT_INPUT, "matches no file")


# ------------------------------------------------------------------ files that are not traces


@pytest.mark.parametrize(
    "name,data,needle",
    [
        ("image.png", PNG, "unknown trace format"),
        ("image.json", PNG, "not a json object"),
        ("random.json", bytes(range(256)) * 7, "not a json object"),
        ("numbers.json", "[1, 2, 3]", "not a json object"),
        ("string.json", '"a trace"', "not a json object"),
        ("empty_object.json", "{}", "traceevents"),
        ("empty_file.json", "", ""),
        ("events_not_a_list.json", '{"traceEvents": 7}', "traceevents"),
        ("notes.txt", "hello, world\n", "unknown trace format"),
    ],
)
def test_not_a_trace_is_a_format_error(tmp_path, name, data, needle):
    p = write(tmp_path / name, data)
    one_line(invoke(p), EXIT_FORMAT, needle, path=p)


def test_unknown_extension_is_sniffed(tmp_path):
    """The format comes from the content when the name says nothing: a Kineto trace named .trace still analyses."""
    p = tmp_path / "run.trace"
    p.write_bytes(json.dumps(small_gpu_trace().doc()).encode())
    d = analyze_json(p)
    assert d["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16


def test_empty_trace(tmp_path):
    p = write(tmp_path / "empty.json", '{"traceEvents": []}')
    one_line(invoke(p), EXIT_FORMAT, "no host op or device activity", path=p)


def test_trace_of_only_unusable_events_names_why(tmp_path):
    p = write(tmp_path / "junk.json", json.dumps({"traceEvents": [1, "x", None, {"ph": "X"}, {"ph": "X", "name": "a", "cat": "cpu_op"}]}))
    one_line(invoke(p), EXIT_FORMAT, "no host op or device activity", path=p)


# ------------------------------------------------------------------ compression


def test_corrupt_gzip(tmp_path):
    good = gzip.compress(json.dumps(small_gpu_trace().doc()).encode())
    p = write(tmp_path / "corrupt.json.gz", good[:10] + bytes((i * 37 + 11) % 256 for i in range(4000)))
    one_line(invoke(p), EXIT_INPUT, "corrupt gzip", path=p)


def test_gzip_cut_short(tmp_path):
    """A gzip stream that stops mid-way: an input error, or the events that were complete (never a traceback)."""
    data = json.dumps(small_gpu_trace().doc()).encode()
    p = write(tmp_path / "cut.json.gz", gzip.compress(data)[: -40])
    r = invoke(p, "--format", "json", "--peak-tflops", 1)
    if r.exit_code != 0:
        one_line(r, r.exit_code, path=p)
        assert r.exit_code in (EXIT_INPUT, EXIT_FORMAT)


def _bomb(path: Path, prefix: bytes, size: int = 200 << 20) -> Path:
    """gzip of `prefix` + `size` bytes of filler, written in pieces: ~200 KB on disk, 200 MB inside."""
    filler = b" " if prefix else b"\0"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(prefix)
        block = filler * (1 << 20)
        for _ in range(size >> 20):
            f.write(block)
    assert path.stat().st_size < 1 << 20
    return path


_RSS_PROBE = """
import resource, sys
from traceflops.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=open(sys.argv[0] + '.rss', 'w'))
sys.exit(code)
"""


def _run_measured(tmp_path: Path, *args, env: dict) -> tuple[subprocess.CompletedProcess, int]:
    """Run the CLI in a fresh interpreter: (result, peak RSS in KiB)."""
    probe = tmp_path / "probe.py"
    probe.write_text(_RSS_PROBE)
    r = subprocess.run([sys.executable, str(probe), *map(str, args)], capture_output=True, text=True, env=env, timeout=300, check=False)
    rss = int((tmp_path / "probe.py.rss").read_text())
    return r, rss


def test_gzip_bomb_stops_at_the_limit_quickly_and_in_bounded_memory(tmp_path):
    """A trace-shaped bomb (a JSON prefix, then 200 MB of whitespace) against a 10 MB limit: exit 2, 'limit'."""
    bomb = _bomb(tmp_path / "bomb.json.gz", b'{"traceEvents": [')
    small = write(tmp_path / "small.json", json.dumps(small_gpu_trace().doc()))
    env = {**os.environ, "TRACEFLOPS_MAX_BYTES": str(10 << 20)}
    base, base_rss = _run_measured(tmp_path, "analyze", small, "--no-cache", "--peak-tflops", 1, env=env)
    assert base.returncode == 0, base.stderr
    r, rss = _run_measured(tmp_path, "analyze", bomb, "--no-cache", env=env)
    assert r.returncode == EXIT_INPUT, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(bomb) in lines[0] and ("limit" in lines[0] or "gzip bomb" in lines[0]), lines[0]
    # Never holds the 200 MB: the peak stays within the limit plus slack of the small trace's run.
    assert rss - base_rss < 100 << 10, (rss, base_rss)


def test_zeros_bomb_is_refused_quickly(tmp_path):
    """200 MB of zeros: refused at the limit, or as not JSON as soon as the first bytes are seen."""
    bomb = _bomb(tmp_path / "zeros.json.gz", b"")
    r = invoke(bomb, env={"TRACEFLOPS_MAX_BYTES": str(10 << 20)})
    one_line(r, r.exit_code, path=bomb)
    assert r.exit_code in (EXIT_INPUT, EXIT_FORMAT)
    assert "limit" in r.stderr or "gzip bomb" in r.stderr or "JSON" in r.stderr, r.stderr


def test_size_limit_applies_to_plain_files(tmp_path):
    p = write(tmp_path / "big.json", '{"traceEvents": [' + " " * (2 << 20) + "]}")
    one_line(invoke(p, env={"TRACEFLOPS_MAX_BYTES": str(1 << 20)}), EXIT_INPUT, "limit", path=p)


# ------------------------------------------------------------------ events that are broken


def test_events_with_missing_or_wrongly_typed_fields_are_counted_and_analysis_runs(tmp_path):
    doc = small_gpu_trace().doc()
    bad = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "dur": 3},  # no ts
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": "soon", "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": ["aten::add"], "pid": 100, "tid": 1, "ts": 5, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": 5, "dur": -3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": {"a": 1}, "tid": None, "ts": 5, "dur": 3, "args": [1, 2]},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 3, "args": {"device": "zero", "correlation": "x"}},
    ]
    doc["traceEvents"] = doc["traceEvents"] + bad
    p = write(tmp_path / "bad_events.json", json.dumps(doc))
    d = analyze_json(p)
    assert d["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16  # the good events still count
    w = " | ".join(d["warnings"])
    assert "'cpu_op' events without a numeric ts/dur or a name (skipped) (3)" in w and "negative duration" in w


def test_non_object_entries_are_each_counted(tmp_path):
    doc = small_gpu_trace().doc()
    doc["traceEvents"] = ["x", 1] + doc["traceEvents"] + ["not an event", 42, None, [1]]
    d = analyze_json(write(tmp_path / "scalars.json", json.dumps(doc)))
    assert "traceEvents entries that are not objects (skipped) (6)" in d["warnings"], d["warnings"]


def test_fractional_microsecond_timestamps_are_not_nanoseconds(tmp_path):
    """Kineto writes µs with ns fractions (1.7e12 + 0.001): fine, no unit warning."""
    b = small_gpu_trace()
    for e in b.events:
        e["ts"] = 1_700_000_000_000.0 + e["ts"] + 0.001
    d = analyze_json(write(tmp_path / "frac.json", json.dumps(b.doc())))
    assert d["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16
    assert not any("nanoseconds" in w for w in d["warnings"])


def test_nanosecond_timestamps_are_warned_about_not_rescaled(tmp_path):
    b = small_gpu_trace()
    for e in b.events:
        e["ts"] = 1.7e18 + e["ts"] * 1000.0
        e["dur"] = e["dur"] * 1000.0
    d = analyze_json(write(tmp_path / "ns.json", json.dumps(b.doc())))
    assert any("look like nanoseconds" in w for w in d["warnings"]), d["warnings"]
    assert d["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16
    assert d["totals"]["wall_us"] > 1e5  # 1000x the µs trace's windows: not rescaled


def test_duplicated_events_are_counted_once(tmp_path):
    b = small_gpu_trace()
    ref = analyze_json(write(tmp_path / "ref.json", json.dumps(b.doc())))
    doc = b.doc()
    doc["traceEvents"] = doc["traceEvents"] + doc["traceEvents"]
    d = analyze_json(write(tmp_path / "dup.json", json.dumps(doc)))
    assert d["totals"]["flops"] == ref["totals"]["flops"]
    assert d["totals"]["time_us"] == ref["totals"]["time_us"]
    assert any("duplicate" in w for w in d["warnings"])


# ------------------------------------------------------------------ command line


def test_model_flags_half_given_exit_2(tmp_path):
    r = invoke(CPU / "ns_eager_sdpa.json.gz", "--params", 1e9)
    assert r.exit_code == EXIT_INPUT and "Traceback" not in r.stderr
    assert "--layers" in r.stderr and "--model-config" in r.stderr


def test_model_flags_half_given_is_one_line(tmp_path):
    r = invoke(CPU / "ns_eager_sdpa.json.gz", "--params", 1e9)
    one_line(r, EXIT_INPUT, "--layers")


# ------------------------------------------------------------------ XLA profiles


def test_random_bytes_as_xplane(tmp_path):
    p = write(tmp_path / "junk.xplane.pb", bytes((i * 131 + 7) % 256 for i in range(5000)))
    one_line(invoke(p), EXIT_FORMAT, "xspace", path=p)


def test_truncated_real_xplane(tmp_path, shared):
    src = shared / "xplane" / "mi300_jax_gemm.xplane.pb"
    if not src.exists():
        pytest.skip(f"{src} not found")
    data = src.read_bytes()
    p = write(tmp_path / "cut.xplane.pb", data[: len(data) // 2])
    one_line(invoke(p), EXIT_FORMAT, "xspace", path=p)


def test_empty_xplane(tmp_path):
    p = write(tmp_path / "empty.xplane.pb", b"")
    r = invoke(p)
    one_line(r, r.exit_code, path=p)
    assert r.exit_code == EXIT_FORMAT


# ------------------------------------------------------------------ real stderr, --debug


def test_real_stderr_is_one_line_and_debug_shows_the_traceback(tmp_path):
    p = write(tmp_path / "empty.json", '{"traceEvents": []}')
    cmd = [sys.executable, "-m", "traceflops.cli.main", "analyze", str(p), "--no-cache"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == EXIT_FORMAT
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {p}: "), r.stderr
    assert r.stdout == ""
    r = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode != 0
    assert "Traceback" in r.stderr and "EmptyTraceError" in r.stderr


def test_debug_reraises_in_process(tmp_path):
    p = write(tmp_path / "numbers.json", "[1, 2, 3]")
    r = invoke(p, "--debug")
    assert r.exit_code != 0
    from traceflops.core.errors import FormatError

    assert isinstance(r.exception, FormatError)
