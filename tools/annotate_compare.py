#!/usr/bin/env python3
"""`traceflops annotate` of another checkout against this one, on every fixture trace: the outputs' JSON compared.

    python tools/annotate_compare.py --before /tmp/before_d [--jobs 2] [--keep DIR] [TRACE ...]

The annotated trace written by the annotate code of `--before` (its `traceflops/export/` and
`traceflops/core/redact.py`, over this checkout's other modules, so both sides annotate the same analysis)
is compared with this checkout's, parsed as JSON: equal documents pass whatever their bytes. With no TRACE,
every `fixtures/**/*.json.gz` of the repository and every Kineto JSON under `$TRACEFLOPS_FIXTURES/kineto`.
A trace that neither side annotates (not a trace, refused) passes when both refuse it with the same message.
Exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEFLOPS_FIXTURES", ROOT.parent / "shared" / "fixtures"))
ANNOTATE_CODE = ("traceflops/export", "traceflops/core/redact.py", "traceflops/cli/reports.py")


def traces() -> list[Path]:
    found = sorted((ROOT / "fixtures").rglob("*.json.gz"))
    kineto = SHARED / "kineto"
    if kineto.is_dir():
        found += sorted(p for p in kineto.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    return found


def before_tree(before: Path, into: Path) -> Path:
    """This checkout's package with the annotate code of `before` in place of its own."""
    shutil.copytree(ROOT / "traceflops", into / "traceflops", ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ANNOTATE_CODE:
        src, dst = before / rel, into / rel
        if dst.is_dir():
            shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    return into


def annotate(pythonpath: Path, trace: Path, out: Path) -> tuple[float, str]:
    """Run `traceflops annotate` of the package in `pythonpath`; (seconds, error line or '').

    Run from `pythonpath` itself: `python -c` puts the working folder first on the path, so run from a checkout it
    would import that checkout's package whatever PYTHONPATH says (both sides would then be the same code). The child
    refuses to run a package from anywhere else.
    """
    import time

    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    code = (
        "import sys, traceflops\n"
        f"assert traceflops.__file__.startswith({str(pythonpath.resolve()) + os.sep!r}), traceflops.__file__\n"
        "from traceflops.cli.main import main\nsys.exit(main(sys.argv[1:], standalone_mode=False) or 0)\n"
    )
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "annotate", str(trace.resolve()), "-o", str(out.resolve()), "--no-cache"],
        env=env,
        cwd=pythonpath,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if done.returncode:
        lines = [x for x in done.stderr.strip().splitlines() if x.strip()]
        return wall, (lines[-1] if lines else f"exit {done.returncode}")
    return wall, ""


def differences(a: dict, b: dict, limit: int = 5) -> list[str]:
    """Where two annotated documents differ: top-level keys, then events by position."""
    out = []
    for k in sorted(set(a) | set(b)):
        if k != "traceEvents" and a.get(k) != b.get(k):
            out.append(f"top-level {k!r}: {str(a.get(k))[:300]} != {str(b.get(k))[:300]}")
    ea, eb = a.get("traceEvents") or [], b.get("traceEvents") or []
    if len(ea) != len(eb):
        out.append(f"{len(ea)} events != {len(eb)} events")
    bad = [i for i, (x, y) in enumerate(zip(ea, eb)) if x != y]
    if bad:
        out.append(f"{len(bad)} events differ, first at {bad[:5]}")
        for i in bad[:limit]:
            out.append(f"  [{i}] {str(ea[i])[:400]}\n  [{i}] {str(eb[i])[:400]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout whose annotate code is compared with this one's")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="write the outputs here (else a temporary folder, removed)")
    ap.add_argument("trace", nargs="*")
    a = ap.parse_args()
    paths = [Path(t) for t in a.trace] or traces()
    work = Path(a.keep or tempfile.mkdtemp(prefix="annotate_compare_"))
    work.mkdir(parents=True, exist_ok=True)
    old = before_tree(Path(a.before), work / "before")

    def one(k_trace: tuple[int, Path]) -> tuple[Path, list[str], float, float]:
        k, trace = k_trace
        outs = (work / f"{k}.before.json", work / f"{k}.after.json")
        for o in outs:
            o.unlink(missing_ok=True)
        t_old, err_old = annotate(old, trace, outs[0])
        t_new, err_new = annotate(ROOT, trace, outs[1])
        if err_old or err_new:
            same = err_old == err_new
            return trace, [] if same else [f"before: {err_old or 'ok'}", f"after: {err_new or 'ok'}"], t_old, t_new
        docs = [orjson.loads(o.read_bytes()) for o in outs]
        if not a.keep:
            for o in outs:
                o.unlink()
        return trace, differences(*docs), t_old, t_new

    failed = 0
    with ThreadPoolExecutor(a.jobs) as pool:
        for trace, diff, t_old, t_new in pool.map(one, enumerate(paths)):
            name = os.path.relpath(trace, ROOT) if trace.is_relative_to(ROOT) else str(trace)
            print(f"{'DIFF' if diff else 'same'}  {t_old:6.2f}s {t_new:6.2f}s  {name}", flush=True)
            for line in diff:
                print("      " + line)
            failed += bool(diff)
    print(f"{len(paths)} traces, {failed} with differences")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
