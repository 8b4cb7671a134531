"""Save every included and shared fixture's JSON, terminal and HTML reports (and some diffs), or compare two saved sets.

A change meant to move code without changing a number is checked by saving the
reports before it and comparing after: JSON keys must match exactly, numbers to a
relative 1e-12 (polars' parallel sums may differ in the last bit); the terminal
(at a fixed width) and HTML reports must match character for character.

    python tools/report_snapshot.py save DIR
    python tools/report_snapshot.py compare BEFORE_DIR AFTER_DIR

`SNAPSHOT_ONLY=a,b` saves only the traces whose path holds one of the words (and no
diffs); compare then reads only the reports the AFTER folder has.

`save` always runs the traceflops of the checkout this file is in (its folder first on
PYTHONPATH): without that, an editable install would answer for both checkouts.
"""

from __future__ import annotations

import json
import math
import re
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEFLOPS_FIXTURES", ROOT.parent / "shared" / "fixtures"))  # as the tests and benchmarks read it
MODEL = ["--params", "1.2e6", "--layers", "2", "--heads", "4", "--head-dim", "12", "--seq-len", "40",
         "--tokens-per-step", "160"]
VARIANTS = {"plain": [], "peak": ["--peak-tflops", "1"], "model": MODEL, "model_peak": [*MODEL, "--peak-tflops", "1"]}
REL = 1e-12
OWN = {"PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
TERMINAL = {"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"}


def traces() -> list[Path]:
    found = sorted((ROOT / "fixtures").rglob("*.json.gz")) + sorted((ROOT / "fixtures").rglob("*.xplane.pb"))
    found += sorted(d for d in (ROOT / "fixtures" / "dist").iterdir() if d.is_dir())  # jobs: every rank at once
    if SHARED.is_dir():
        found += sorted(SHARED.rglob("*.json.gz")) + sorted(SHARED.rglob("*.xplane.pb"))
        found += [d for d in [SHARED / "kineto" / "dlrm_8rank"] if d.is_dir()]  # a job: every rank at once
    only = [w for w in os.environ.get("SNAPSHOT_ONLY", "").split(",") if w]
    return [t for t in found if any(w in str(t) for w in only)] if only else found


def save(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache:
        for t in traces() if not os.environ.get("SNAPSHOT_DIFFS_ONLY") else ():
            for variant, flags in VARIANTS.items():
                name = f"{t.relative_to(t.parents[1]).as_posix().replace('/', '__')}.{variant}.json"
                # Run from the fixtures' folder with a relative path: reports saved from two checkouts name the same
                # files alike, and no checkout in the caller's folder shadows the traceflops on PYTHONPATH.
                here = t.parents[1]
                r = subprocess.run([sys.executable, "-c", "from traceflops.cli.main import main; main()", "analyze",
                                    t.relative_to(here).as_posix(), "--format", "json", "--no-cache", "--cache-dir", cache, *flags],
                                   capture_output=True, text=True, cwd=here, env={**os.environ, **OWN})
                (out / name).write_text(json.dumps({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-2000:]}))
                print(r.returncode, name, flush=True)
                if variant in ("plain", "model"):  # the terminal report at a fixed width, and the HTML page
                    page = Path(cache) / "page.html"
                    page.unlink(missing_ok=True)
                    r = subprocess.run([sys.executable, "-c", "from traceflops.cli.main import main; main()", "analyze",
                                        t.relative_to(here).as_posix(), "--quiet", "--no-cache", "--cache-dir", cache,
                                        "--html", str(page), *flags],
                                       capture_output=True, text=True, cwd=here, env={**os.environ, **OWN, **TERMINAL})
                    text = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-2000:],
                            "html": page.read_text() if page.exists() else None}
                    (out / f"{name[: -len('.json')]}.text").write_text(json.dumps(text))
        for i, (before, after) in enumerate(zip(traces(), traces()[1:]) if not os.environ.get("SNAPSHOT_ONLY") else ()):
            if i % 4 or before.suffix == after.suffix == "" or not (before.is_file() and after.is_file()):
                continue
            for form in ("json", "terminal", "html"):
                r = subprocess.run([sys.executable, "-c", "from traceflops.cli.main import main; main()", "diff",
                                    str(before), str(after), "--format", form, "--no-cache", "--cache-dir", cache],
                                   capture_output=True, text=True, cwd=ROOT.parent, env={**os.environ, **OWN, **TERMINAL})
                name = f"diff{i:03d}.{form}.text"
                (out / name).write_text(json.dumps({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-2000:]}))
                print(r.returncode, name, flush=True)


def _diff(a, b, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            out.append(f"{where}: keys {sorted(a.keys() ^ b.keys())}")
        for k in a.keys() & b.keys():
            _diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= REL * max(abs(a), abs(b))):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif a != b:
        out.append(f"{where}: {repr(a)[:200]} vs {repr(b)[:200]}")


def _masked(text):
    """A report with the run's own temporary folder (where its page was written) masked."""
    return re.sub(r"/tmp/[^/\s]+/", "/TMP/", text) if isinstance(text, str) else text


def compare(before: Path, after: Path) -> int:
    bad = 0
    partial = bool(os.environ.get("SNAPSHOT_ONLY"))  # only what the AFTER folder has
    names = sorted(p.name for p in before.glob("*.json") if not partial or (after / p.name).exists())
    for name in names:
        x = json.loads((before / name).read_text())
        y = json.loads((after / name).read_text()) if (after / name).exists() else None
        if y is None:
            print("missing", name)
            bad += 1
            continue
        out: list[str] = []
        if x["rc"] != y["rc"]:
            out.append(f"exit {x['rc']} vs {y['rc']}")
        if x["stdout"] or y["stdout"]:
            try:
                _diff(json.loads(x["stdout"] or "null"), json.loads(y["stdout"] or "null"), "", out)
            except ValueError:
                _diff(x["stdout"], y["stdout"], "stdout", out)
        else:
            _diff(x["stderr"].strip().splitlines()[-1:], y["stderr"].strip().splitlines()[-1:], "stderr", out)
        if out:
            bad += 1
            print(name, *out[:10], sep="\n  ")
    texts = sorted(p.name for p in before.glob("*.text") if not partial or (after / p.name).exists())
    for name in texts:  # terminal and HTML: character for character
        x = json.loads((before / name).read_text())
        y = json.loads((after / name).read_text()) if (after / name).exists() else {}
        differ = [k for k in x if _masked(x[k]) != _masked(y.get(k))]
        if differ:
            bad += 1
            print(name, "differs in", ", ".join(differ))
    print(f"{len(names) + len(texts)} reports compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["save"]:
        save(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
