"""Many tiny steps: an inference loop calling `profiler.step()` per request.

    python benchmarks/bench_steps.py [--steps 200000] [--kind event|kernel|both] [--repeat 3] [--out results.json]

Writes the trace itself (no fixture needed): `--steps` ProfilerStep#N
annotations back to back, each holding one CPU op (`event`, about 120 bytes of
JSON a step) or one CPU op launching one kernel (`kernel`: the op, its runtime
launch and the kernel on stream 7). Then runs `traceflops analyze --no-cache
--format json` on it in a fresh process, once to warm the page cache and
`--repeat` times: the median wall and CPU seconds and the largest peak RSS /
PSS of the process tree (`bench_parse.run_isolated`, sampled every 10 ms).
The cost should grow with the events, not the steps: 216 k events in 5 steps
and 200 k one-event steps should take about as long.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parse import cli, compile_package, timed


def write_trace(path: Path, steps: int, kind: str) -> None:
    """`steps` ProfilerStep#N windows of 10 µs, each with one op (and, for `kernel`, its launch and kernel)."""
    head = {"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816, "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        sep = ""
        for i in range(steps):
            ts = 1000.0 + 10.0 * i
            ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 100, "tid": 1, "ts": ts, "dur": 9.0,
                   "args": {"External id": 3 * i + 1}},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": ts + 1.0, "dur": 4.0,
                   "args": {"External id": 3 * i + 2}}]
            if kind == "kernel":
                ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": ts + 2.0, "dur": 2.0,
                        "args": {"correlation": i + 1, "External id": 3 * i + 2}},
                       {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 7, "ts": ts + 4.0, "dur": 3.0,
                        "args": {"device": 0, "stream": 7, "correlation": i + 1, "External id": 3 * i + 2}}]
            for e in ev:
                f.write(sep + json.dumps(e))
                sep = ",\n"
        f.write("\n]}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--kind", choices=("event", "kernel", "both"), default="both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    compile_package()
    results = {}
    with tempfile.TemporaryDirectory(prefix="traceflops_bench_steps_") as d:
        for kind in ("event", "kernel") if args.kind == "both" else (args.kind,):
            path = Path(d) / f"steps_{kind}_{args.steps}.json"
            write_trace(path, args.steps, kind)
            r = timed(cli("--no-cache"), str(path), args.repeat)
            r["bytes"] = path.stat().st_size
            r["steps"] = args.steps
            results[f"{args.steps} one-{kind} steps"] = r
            print(f"{args.steps} one-{kind} steps ({r['bytes'] / 1e6:.1f} MB): {r}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
