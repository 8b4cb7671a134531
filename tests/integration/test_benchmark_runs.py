"""The benchmark script keeps working (at one tile, so it is quick); its timings are not asserted."""

import json
import subprocess
import sys

from tests.builders import ROOT


def test_benchmark_runs_at_a_small_size(shared, tmp_path):
    out = tmp_path / "bench.json"
    trace = tmp_path / "one_tile.json"
    subprocess.run([sys.executable, str(shared.parent / "tools" / "tile_trace.py"), str(shared / "kineto" / "v100_transformer_rank1.json.gz"), "1", str(trace)], check=True)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_parse.py"), "--trace", str(trace), "--repeat", "1", "--out", str(out)],
                   check=True, capture_output=True, timeout=900)
    everything = json.loads(out.read_text())
    r = everything["trace"]
    for name in ("orjson.loads", "traceflops parse", "traceflops analyze --no-cache", "traceflops analyze, again (cached)"):
        assert "error" not in r[name] and r[name]["wall_s"] > 0 and r[name]["peak_tree_rss_mb"] > 0, name
        assert r[name]["cpu_s"] > 0 and r[name]["runs"] == 1, name
        assert 0 <= r[name]["sys_s"] <= r[name]["cpu_s"] and r[name]["minor_faults"] > 0, name
    for when in ("start", "end"):
        assert set(everything["machine"][when]) == {"page_fault_us", "python_loop_ns"}
        assert all(v > 0 for v in everything["machine"][when].values()), when
    assert "time_vs_orjson" in r["traceflops analyze --no-cache"] and "cpu_vs_orjson" in r["traceflops analyze --no-cache"]
    assert "time_vs_first" in r["traceflops analyze, again (cached)"]
    try:
        import hta  # noqa: F401
    except ImportError:
        return
    assert "time_vs_hta" in r["traceflops analyze --no-cache"]


def test_decode_floor_runs_on_a_small_trace(shared, tmp_path):
    out = tmp_path / "floor.json"
    trace = shared / "kineto" / "dlrm_8rank" / "rank0.json.gz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_floor.py"), "--trace", str(trace), "--repeat", "1", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    r = json.loads(out.read_text())
    for name in ("orjson.loads", "msgspec typed decode (structs only)", "traceflops parse (one process)", "traceflops analysis of the parsed trace"):
        assert r[name] > 0, name
    for name in ("start: import the CLI and the analysis", "start: traceflops analyze of a 0.4 MB gzipped trace"):
        assert r[name]["wall_s"] > 0 and r[name]["cpu_s"] > 0, name
    assert r["peers (NDJSON copy)"]["polars read_ndjson"] > 0  # polars is a dependency: always measured


def test_annotate_ratio_runs_a_before_checkouts_annotate_beside(tmp_path):
    """`--annotate-ratio --before`: the other checkout's package is the one its annotate runs, in the command's
    process and in the process that reads the trace beside the analysis (both leave a mark), alternated with this
    checkout's analyze and annotate; the ratios are given."""
    import shutil

    before = tmp_path / "before"
    shutil.copytree(ROOT / "traceflops", before / "traceflops", ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "marks.txt"
    init = before / "traceflops" / "__init__.py"
    init.write_text(f"import os as _os\nopen({str(marks)!r}, 'a').write(str(_os.getpid()) + '\\n')\n" + init.read_text())
    out = tmp_path / "ratio.json"
    trace = ROOT / "fixtures" / "cpu" / "ns_ckpt_partial.json.gz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_parse.py"), "--trace", str(trace), "--annotate-ratio",
                    "--before", str(before), "--repeat", "1", "--out", str(out)], check=True, capture_output=True, timeout=600)
    r = json.loads(out.read_text())["trace"]
    for name in ("traceflops analyze --no-cache", "traceflops annotate --no-cache", "traceflops annotate --no-cache (before)"):
        assert "error" not in r[name] and r[name]["runs"] == 1 and r[name]["wall_s"] > 0, name
    assert r["annotate_after_vs_before_wall"] > 0 and r["annotate_after_vs_before_cpu"] > 0
    # a warm-up and a timed run, each a command and its reader process: four processes imported the other package
    assert len(set(marks.read_text().split())) == 4


def test_the_job_case_alternates_a_before_checkouts_job_with_this_ones(shared, tmp_path):
    """`--job N --before`: the other checkout's package runs that job, in the command's process and its worker
    (both leave a mark), alternated with this checkout's; the after / before ratios are given."""
    import importlib.util
    import shutil

    before = tmp_path / "before"
    shutil.copytree(ROOT / "traceflops", before / "traceflops", ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "marks.txt"
    init = before / "traceflops" / "__init__.py"
    init.write_text(f"import os as _os\nopen({str(marks)!r}, 'a').write(str(_os.getpid()) + '\\n')\n" + init.read_text())
    spec = importlib.util.spec_from_file_location("bench_parse", ROOT / "benchmarks" / "bench_parse.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (tmp_path / "job").mkdir()
    folder = bench.job_folder(2, shared / "kineto" / "mi250_toy_train.json.gz", tmp_path / "job")
    r = bench._job_results(folder, 2, True, 1, str(before))
    before_job = "traceflops analyze DIR --jobs 2 (before)"
    for name in ("traceflops analyze DIR --jobs 2", before_job):
        assert "error" not in r[name] and r[name]["runs"] == 1 and r[name]["peak_tree_pss_mb"] > 0, name
    assert r["job_after_vs_before_wall"] > 0 and r["job_after_vs_before_cpu"] > 0
    # a warm-up and a timed run, each a command and its one worker: four processes imported the other package
    assert len(set(marks.read_text().split())) == 4
    alone = bench._job_results(folder, 2, True, 1)  # without --before: the same timing, one contender
    assert alone["traceflops analyze DIR --jobs 2"]["runs"] == 1 and alone["traceflops analyze DIR --jobs 2"]["cpu_s"] > 0
    assert before_job not in alone and "job_after_vs_before_wall" not in alone


def test_a_run_timed_unsampled_reports_no_peaks_and_its_errors(tmp_path):
    """Timed runs have nothing sampling beside them: only wall and CPU come back (no peaks to mistake for measured
    ones); a failing contender still names its last stderr line, read while it was waited for."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_parse
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    ok = bench_parse.run_isolated("sum(range(10**6))", str(tmp_path), sample=False)
    assert set(ok) == {"wall_s", "cpu_s", "sys_s", "minor_faults"} and ok["cpu_s"] > 0
    # the contender's own faults, not this process's: each page of 64 MiB touched once is one
    touched = bench_parse.run_isolated("import mmap; m = mmap.mmap(-1, 64 << 20); m.madvise(mmap.MADV_NOHUGEPAGE)\n"
                                       "m[::4096] = bytes(16384)", str(tmp_path), sample=False)  # 4 KiB pages (Linux)
    assert touched["minor_faults"] - ok["minor_faults"] >= 16384 * 0.9
    sampled = bench_parse.run_isolated("x = bytearray(64 << 20); sum(range(10**7))", str(tmp_path))
    assert sampled["peak_tree_rss_mb"] >= 64  # the 64 MiB it held, seen by the sampler
    bad = bench_parse.run_isolated("import sys; print('x' * 200000, file=sys.stderr); raise SystemExit('no trace here')",
                                   str(tmp_path), sample=False)
    assert bad["error"] == "no trace here"  # 200 kB of stderr before it: read as it went, no pipe left full


def test_the_analysis_cpu_part_runs_both_checkouts(tmp_path):
    """`--analysis-cpu --before`: each checkout's analysis timed in turn, with its polars queries counted."""
    out = tmp_path / "acpu.json"
    trace = ROOT / "fixtures" / "cpu" / "ns_ckpt_partial.json.gz"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_parse.py"), "--trace", str(trace), "--analysis-cpu",
                    "--before", str(ROOT), "--repeat", "1", "--out", str(out)], check=True, capture_output=True, timeout=600)
    r = json.loads(out.read_text())
    for head in ("after", "before"):
        assert r[head]["cpu_s"] > 0 and len(r[head]["cpu_s_all"]) == 2 and r[head]["polars_queries"] > 0, head
    assert r["queries_after_vs_before"] == 1.0  # the same checkout twice
    assert r["machine"]["start"]["python_loop_ns"] > 0 and r["machine"]["end"]["page_fault_us"] > 0
