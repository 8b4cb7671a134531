"""Parse and analyse speed and memory on a large trace, as ratios against peers, in one run.

    python benchmarks/bench_parse.py [--tiles 10] [--trace BIG.json] [--skip-hta]

Builds BIG.json with ../shared/tools/tile_trace.py from the V100 transformer
fixture (K tiles; K=10 is about 476 MB and 2.16 M events) unless --trace is
given, then runs each contender in a fresh subprocess and reports wall time and
peak RSS (ru_maxrss of the child):
  - orjson.loads of the file's bytes (the floor any dict-based tool pays),
  - traceflops' parse (streaming, columnar) and its full analysis,
  - Holistic Trace Analysis' parse plus temporal breakdown (if installed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEFLOPS_FIXTURES", ROOT.parent / "shared" / "fixtures"))

CONTENDERS = {
    "orjson.loads": "import orjson; orjson.loads(open(P, 'rb').read())",
    "traceflops parse": "from traceflops.parsers import load; load(P)",
    "traceflops analyze": "from traceflops.analysis import analyze; analyze(P)",
    "HTA parse + temporal breakdown": (
        "import os, shutil, tempfile\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "d = tempfile.mkdtemp(); os.symlink(P, os.path.join(d, 'rank0.json'))\n"
        "TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)"
    ),
}


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
    size = os.path.getsize(path)
    results = {"trace": path, "bytes": size}
    names = [n for n in CONTENDERS if not (a.skip_hta and n.startswith("HTA"))]
    # One child per contender, each in its own process so peak RSS is its own: run them
    # in increasing expected memory (ru_maxrss of children is a running maximum).
    for name in names:
        results[name] = run_isolated(CONTENDERS[name], path)
        print(f"{name:34s} {results[name]}", flush=True)
    base = results["orjson.loads"].get("wall_s")
    for name in names:
        r = results[name]
        if "wall_s" in r and base and "error" not in r:
            r["time_vs_orjson"] = r["wall_s"] / base
    hta = results.get("HTA parse + temporal breakdown", {})
    for name in ("traceflops parse", "traceflops analyze"):
        if "wall_s" in hta and "error" not in hta:
            results[name]["time_vs_hta"] = results[name]["wall_s"] / hta["wall_s"]
            results[name]["memory_vs_hta"] = results[name]["peak_rss_mb"] / hta["peak_rss_mb"]
    print(json.dumps(results, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


def run_isolated(code: str, path: str) -> dict:
    """Run in a grandchild via a wrapper that reports its own child's ru_maxrss."""
    wrapper = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run([sys.executable, '-c', sys.argv[1]], capture_output=True, text=True)\n"
        "w = time.perf_counter() - t\n"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'wall_s': w, 'peak_rss_mb': r, 'rc': p.returncode, 'err': p.stderr[-300:]}))\n"
    )
    p = subprocess.run([sys.executable, "-c", wrapper, f"P = {path!r}\n{code}\n"], capture_output=True, text=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r.pop("rc"):
        return {"error": r["err"].strip().splitlines()[-1] if r["err"].strip() else "failed", "wall_s": r["wall_s"]}
    r.pop("err")
    return r


if __name__ == "__main__":
    main()
