"""Speed and memory on a large trace, as ratios against peers measured in the same run.

    python benchmarks/bench_parse.py [--tiles 10] [--trace BIG.json] [--skip-hta] [--out results.json]

Builds BIG.json with ../shared/tools/tile_trace.py from the V100 transformer
fixture (K tiles; K=10 is about 476 MB and 2.16 M events) unless --trace is
given, then runs each contender in a fresh process and reports its wall time
and peak memory: the largest sum of RSS over the contender's whole process
tree (traceflops decodes with a helper process on large files), sampled every
10 ms.

  - orjson.loads of the file's bytes: the floor any dict-per-event tool pays;
  - traceflops parse (streaming, columnar);
  - `traceflops analyze --no-cache --format json`: parse, link, tag, FLOPs,
    partition and the JSON report, as a user runs it;
  - the same command with a cache, first and again (the second renders the kept
    report; a third with other options reuses only the parsed tables);
  - Holistic Trace Analysis' parse plus temporal breakdown (if installed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEFLOPS_FIXTURES", ROOT.parent / "shared" / "fixtures"))

_CLI = (
    "import contextlib, os, sys\n"
    "from traceflops.cli.main import main\n"
    "with open(os.devnull, 'w') as out, contextlib.redirect_stdout(out):\n"
    "    try:\n"
    "        main({args!r}, standalone_mode=False)\n"
    "    except SystemExit as e:\n"
    "        sys.exit(e.code)\n"
)


def cli(*args: str) -> str:
    return _CLI.format(args=["analyze", "PATH", "--quiet", "--format", "json", *args]).replace("'PATH'", "P")


HTA = (
    "import os, tempfile\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "d = tempfile.mkdtemp(); os.symlink(P, os.path.join(d, 'rank0.json'))\n"
    "TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", type=int, default=10)
    ap.add_argument("--trace")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    path = a.trace
    if not path:
        src = SHARED / "kineto" / "v100_transformer_rank1.json.gz"
        path = os.path.join(tempfile.gettempdir(), f"traceflops_bench_{a.tiles}.json")
        if not os.path.exists(path):
            subprocess.run([sys.executable, str(SHARED.parent / "tools" / "tile_trace.py"), str(src), str(a.tiles), path], check=True)
    cache = tempfile.mkdtemp(prefix="traceflops_bench_cache_")
    contenders = {
        "orjson.loads": "import orjson; orjson.loads(open(P, 'rb').read())",
        "traceflops parse": "from traceflops.run.load import load; load(P)",
        "traceflops analyze --no-cache": cli("--no-cache"),
        "traceflops analyze, first (writes the cache)": cli("--cache-dir", cache),
        "traceflops analyze, again (cached)": cli("--cache-dir", cache),
        "traceflops analyze, other options (parsed tables cached)": cli("--cache-dir", cache, "--exclude-step", "0"),
    }
    if not a.skip_hta:
        contenders["HTA parse + temporal breakdown"] = HTA
    results: dict = {"trace": path, "bytes": os.path.getsize(path)}
    for name, code in contenders.items():
        results[name] = run_isolated(code, path)
        print(f"{name:58s} {results[name]}", flush=True)
    ratios(results)
    print(json.dumps(results, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


def ratios(results: dict) -> None:
    ok = lambda name: "wall_s" in results.get(name, {}) and "error" not in results[name]  # noqa: E731
    base, hta = "orjson.loads", "HTA parse + temporal breakdown"
    for name in [n for n in results if n.startswith("traceflops")]:
        r = results[name]
        if ok(base):
            r["time_vs_orjson"] = r["wall_s"] / results[base]["wall_s"]
        if ok(hta):
            r["time_vs_hta"] = r["wall_s"] / results[hta]["wall_s"]
            r["memory_vs_hta"] = r["peak_tree_rss_mb"] / results[hta]["peak_tree_rss_mb"]
        r["memory_vs_file"] = r["peak_tree_rss_mb"] * 2**20 / results["bytes"]
    first, again = "traceflops analyze, first (writes the cache)", "traceflops analyze, again (cached)"
    if ok(first) and ok(again):
        results[again]["time_vs_first"] = results[again]["wall_s"] / results[first]["wall_s"]


def run_isolated(code: str, path: str) -> dict:
    """Wall time and the peak RSS summed over the process tree (sampled every 10 ms)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", f"P = {path!r}\n{code}\n"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t = time.perf_counter()
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.01)
    wall = time.perf_counter() - t
    err = proc.stderr.read()
    if proc.returncode:
        return {"error": err.strip().splitlines()[-1] if err.strip() else "failed", "wall_s": wall}
    return {"wall_s": round(wall, 3), "peak_tree_rss_mb": round(peak / 2**20, 1)}


if __name__ == "__main__":
    main()
