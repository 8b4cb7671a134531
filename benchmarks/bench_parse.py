"""Speed and memory on a large trace, as ratios against peers measured in the same run.

    python benchmarks/bench_parse.py [--tiles 10] [--trace BIG.json] [--skip-hta] [--out results.json]

Builds BIG.json with ../shared/tools/tile_trace.py from the V100 transformer
fixture (K tiles; K=10 is about 476 MB and 2.16 M events) unless --trace is
given, then runs each contender in a fresh process and reports its wall time
and peak memory over the contender's whole process tree (traceflops decodes
with a helper process on large files; a job runs worker processes), sampled
every 10 ms: the largest sum of RSS (`peak_tree_rss_mb`, a library's pages
counted once in each process) and of PSS (`peak_tree_pss_mb`, shared pages
split among the processes that map them: the figure to quote for a tree).

  - orjson.loads of the file's bytes: the floor any dict-per-event tool pays;
  - traceflops parse (streaming, columnar);
  - `traceflops analyze --no-cache --format json`: parse, link, tag, FLOPs,
    partition and the JSON report, as a user runs it;
  - the same command with a cache, first and again (the second renders the kept
    report; a third with other options reuses only the parsed tables);
  - `traceflops annotate --no-cache`: the analysis, then the trace streamed
    back out with what was found;
  - Holistic Trace Analysis' parse plus temporal breakdown (if installed).

Each contender runs once to warm the page cache, its memory sampled, then
`--repeat` times (3 by default) with nothing sampling beside it; the report
gives the median wall time and the median CPU seconds of the whole process tree
(user + system, helpers included) of the unsampled runs, and the sampled run's
peaks. The sampler walks /proc every 10 ms on the same two cores: beside
`analyze` of the 476 MB trace it added 0.2-0.5 s to a 4.4 s wall time (three
pairs alternated), more than beside a one-process contender such as HTA.
`--tiles 1,3,10` runs every size in one go; `--annotate-ratio` runs only `annotate`
against `analyze` (alternated, the machine's load recorded), for their ratio, and with `--before CHECKOUT` that
checkout's `annotate` alternated with them (after / before ratios of one run); `--job 32` adds a job of that many
ranks (copies of the V100 transformer rank) analysed with `--jobs 2`, against
HTA on the same folder (HTA without a warm-up there: it takes minutes), and with `--before CHECKOUT` that checkout's
job alternated with it.

The package is byte-compiled first (`compileall`), as an installed wheel is:
a checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every
module on every run (about 0.1 s of each).
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

# A command as the `traceflops` script runs it (its exit included); a checkout from before the script's own entry
# (`run`) ran `main`.
_CLI = (
    "import contextlib, os, sys\n"
    "try:\n"
    "    from traceflops.cli.main import run\n"
    "except ImportError:\n"
    "    from traceflops.cli.main import main as run\n"
    "sys.argv = ['traceflops', *{args!r}]\n"
    "with open(os.devnull, 'w') as out, contextlib.redirect_stdout(out):\n"
    "    run()\n"
)


def cli(*args: str) -> str:
    return _CLI.format(args=["analyze", "PATH", "--quiet", "--format", "json", *args]).replace("'PATH'", "P")


# A new output each run (annotate refuses to overwrite), removed as the process exits (the command's exit ends it).
ANNOTATE = ("import atexit, os, tempfile\n"
            "dest = os.path.join(tempfile.mkdtemp(prefix='traceflops_bench_annotate_'), 'annotated.json.gz')\n"
            "atexit.register(lambda: (os.path.exists(dest) and os.unlink(dest), os.rmdir(os.path.dirname(dest))))\n"
            + _CLI.format(args=["annotate", "PATH", "-o", "OUT", "--no-cache"]).replace("'PATH'", "P").replace("'OUT'", "dest"))

# HTA reads a folder: the trace linked into a new one, removed after the run (its own cache files included).
HTA = (
    "import os, tempfile\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "with tempfile.TemporaryDirectory(prefix='traceflops_bench_hta_') as d:\n"
    "    os.symlink(P, os.path.join(d, 'rank0.json'))\n"
    "    TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="10", help="tile counts, comma-separated (e.g. 1,3,10)")
    ap.add_argument("--trace")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per contender after one warm-up")
    ap.add_argument("--job", type=int, default=0, help="also a job of this many ranks (0: none)")
    ap.add_argument("--job-repeat", type=int, help="timed runs per job contender (default: --repeat; HTA takes a minute a run on 32 ranks)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--annotate-ratio", action="store_true",
                    help="only `annotate` against `analyze` on each trace, their runs alternated (the same load on both)")
    ap.add_argument("--analysis-cpu", action="store_true",
                    help="only the analysis after the parse (pipeline.analyze_trace on a parsed trace), see analysis_after_parse")
    ap.add_argument("--before", help="with --analysis-cpu, --annotate-ratio or --job: a checkout to compare with (its "
                    "traceflops), alternated in one run")
    ap.add_argument("--memory", action="store_true", help="only the memory ratios (job vs one rank, big trace vs file)")
    ap.add_argument("--memory-ranks", type=int, default=32, help="ranks of --memory's job")
    ap.add_argument("--memory-tiles", type=int, default=57, help="tiles of --memory's big trace (57: 1.85 GB)")
    a = ap.parse_args()
    if a.analysis_cpu:
        path = a.trace or tiled(int(str(a.tiles).split(",")[-1]))
        report(probed(lambda: analysis_after_parse(path, a.before, a.repeat)), a.out)
        return
    compile_package()
    if a.memory:
        report(probed(lambda: memory_ratios(a.memory_ranks, a.memory_tiles, a.repeat)), a.out)
        return
    runs = [(a.trace, "trace")] if a.trace else [(tiled(int(k)), f"{int(k)} tiles") for k in str(a.tiles).split(",")]

    def sizes() -> dict:  # one key per size, "repeat", the job
        everything: dict = {"repeat": a.repeat}
        for path, label in runs:
            everything[label] = (annotate_ratio(path, a.repeat, a.before) if a.annotate_ratio
                                 else one_size(path, a.skip_hta, a.repeat))
        if a.job:
            everything[f"job of {a.job} ranks"] = job_case(a.job, a.skip_hta, a.job_repeat or a.repeat, a.before)
        return everything

    report(probed(sizes), a.out)


def probed(run) -> dict:
    """`run()`'s results, with the machine's speed before and after it (`machine_probe`) as "machine"."""
    start = machine_probe()
    got = run()
    got["machine"] = {"start": start, "end": machine_probe()}
    return got


def report(got: dict, out: str | None) -> None:
    """The results printed, and written to `out` if given."""
    print(json.dumps(got, indent=2))
    if out:
        Path(out).write_text(json.dumps(got, indent=2))


def compile_package() -> None:
    """Byte-compile traceflops as an installed wheel is: a checkout run with PYTHONDONTWRITEBYTECODE would otherwise
    compile every module in every fresh process (about 0.1 s of each)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "traceflops")], check=True, stdout=subprocess.DEVNULL)


def tiled(k: int) -> str:
    src = SHARED / "kineto" / "v100_transformer_rank1.json.gz"
    path = os.path.join(tempfile.gettempdir(), f"traceflops_bench_{k}.json")
    if not os.path.exists(path):
        subprocess.run([sys.executable, str(SHARED.parent / "tools" / "tile_trace.py"), str(src), str(k), path], check=True)
    return path


def one_size(path: str, skip_hta: bool, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="traceflops_bench_cache_") as cache:
        return _one_size(path, skip_hta, repeat, cache)


def _one_size(path: str, skip_hta: bool, repeat: int, cache: str) -> dict:
    contenders = {
        "orjson.loads": "import orjson; orjson.loads(open(P, 'rb').read())",
        "traceflops parse": "from traceflops.run.load import load; load(P)",
        "traceflops analyze --no-cache": cli("--no-cache"),
        "traceflops analyze, first (writes the cache)": cli("--cache-dir", cache),
        "traceflops analyze, again (cached)": cli("--cache-dir", cache),
        "traceflops analyze, other options (parsed tables cached)": cli("--cache-dir", cache, "--exclude-step", "0"),
        "traceflops annotate --no-cache": ANNOTATE,
    }
    if not skip_hta:
        contenders["HTA parse + temporal breakdown"] = HTA
    results: dict = {"trace": path, "bytes": os.path.getsize(path)}
    for name, code in contenders.items():
        if name == "traceflops analyze, first (writes the cache)":
            results[name] = timed(code, path, 1, fresh=cache)  # each run starts from an empty cache
        elif name == "traceflops analyze, other options (parsed tables cached)":
            results[name] = timed(code, path, repeat, drop_reports=cache)  # the parsed tables kept, no finished report
        else:
            results[name] = timed(code, path, repeat)
        print(f"{name:58s} {results[name]}", flush=True)
    ratios(results)
    return results


BEFORE_ANNOTATE = "traceflops annotate --no-cache (before)"


def annotate_ratio(path: str, repeat: int, before: str | None = None) -> dict:
    """`traceflops annotate --no-cache` against `traceflops analyze --no-cache --format json` on one trace: one warm-up
    each (its memory sampled), then `repeat` runs of each, unsampled and alternated so that both see the same load;
    the medians, their ratio, and the machine's load averages (1, 5, 15 min) before and after. With `before` (a checkout), its annotate (its package
    first on the path of the command and of the processes it starts) is alternated with them too, and the after /
    before ratios of the medians given."""
    pair = {"traceflops analyze --no-cache": (cli("--no-cache"), NOW), "traceflops annotate --no-cache": (ANNOTATE, NOW)}
    if before:
        pair[BEFORE_ANNOTATE] = (ANNOTATE, checkout(before))
    path = os.path.abspath(path)  # the before checkout's runs start in its own folder
    results: dict = {"trace": path, "bytes": os.path.getsize(path), "load_before": os.getloadavg()}
    results.update(alternated(pair, path, repeat))
    results["load_after"] = os.getloadavg()
    ann, ana = results["traceflops annotate --no-cache"], results["traceflops analyze --no-cache"]
    if "error" not in ann and "error" not in ana:
        results["annotate_vs_analyze_wall"] = round(ann["wall_s"] / ana["wall_s"], 3)
        results["annotate_vs_analyze_cpu"] = round(ann["cpu_s"] / ana["cpu_s"], 3)
    after_vs_before(results, "annotate", results.get(BEFORE_ANNOTATE), ann)
    print(f"annotate / analyze: wall {results.get('annotate_vs_analyze_wall')}, cpu {results.get('annotate_vs_analyze_cpu')}; "
          + (f"annotate after / before: wall {results.get('annotate_after_vs_before_wall')}, "
             f"cpu {results.get('annotate_after_vs_before_cpu')}; " if before else "")
          + f"load {results['load_before']} -> {results['load_after']}", flush=True)
    return results


NOW: tuple = (None, None)  # (environment, working folder) of a command of this checkout: this process's own


def checkout(before: str) -> tuple[dict, str]:
    """Where a command of another checkout runs: its package byte-compiled and first on the path of the command and
    of the processes it starts, in its own folder (`python -c` puts the working folder first, ahead of PYTHONPATH)."""
    root = str(Path(before).resolve())
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(root) / "traceflops")], check=True,
                   stdout=subprocess.DEVNULL)
    return {**os.environ, "PYTHONPATH": root}, root


def alternated(contenders: dict[str, tuple[str, tuple]], path: str, repeat: int) -> dict:
    """Each contender (name: code and where it runs) once with its memory sampled, then `repeat` unsampled runs of
    each in turn (`in_turn`), so all see the same load: `medians`, the walls, the sampled peaks."""
    memory = {name: run_isolated(code, path, *where) for name, (code, where) in contenders.items()}
    got: dict = {name: [] for name in contenders}
    for i in range(repeat):
        for name in in_turn(list(contenders), i):
            code, where = contenders[name]
            got[name].append(run_isolated(code, path, *where, sample=False))
    results = {}
    for name, runs in got.items():
        bad = [g for g in [*runs, memory[name]] if "error" in g]
        results[name] = bad[0] if bad else {
            **medians(runs),
            "walls": [g["wall_s"] for g in runs],
            "peak_tree_rss_mb": memory[name]["peak_tree_rss_mb"],
            "peak_tree_pss_mb": memory[name]["peak_tree_pss_mb"],
            "runs": len(runs),
        }
        print(f"{name:58s} {results[name]}", flush=True)
    return results


def in_turn(names: list, i: int) -> list:
    """Round `i`'s order: as given, then reversed (ABBA), so that no contender is always first. Whichever ran first
    in a round measured slower: the analysis after the parse, the same code both sides, 3-10 % in the first slot
    (2026-12-07, either checkout there)."""
    return names if i % 2 == 0 else names[::-1]


def after_vs_before(results: dict, what: str, old: dict | None, new: dict) -> None:
    """The after / before ratios of a contender's medians, where both ran."""
    if old is not None and "error" not in old and "error" not in new:
        results[f"{what}_after_vs_before_wall"] = round(new["wall_s"] / old["wall_s"], 3)
        results[f"{what}_after_vs_before_cpu"] = round(new["cpu_s"] / old["cpu_s"], 3)


def job_folder(ranks: int, src: Path | None = None, folder: Path | None = None) -> Path:
    """`ranks` copies of one rank's trace (the V100 transformer by default) as a job folder (a new temporary one by
    default), each its own rank for traceflops and for HTA alike."""
    import gzip

    import orjson

    src = src or SHARED / "kineto" / "v100_transformer_rank1.json.gz"
    folder = folder or Path(tempfile.mkdtemp(prefix="traceflops_bench_job_"))
    raw = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
    doc = orjson.loads(raw)
    info = doc.pop("distributedInfo", None) or {}
    body = orjson.dumps(doc)
    for r in range(ranks):  # a rank given twice is counted once, by HTA and traceflops alike
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(rank_copy(body, {**info, "rank": r, "world_size": ranks}),
                                                                compresslevel=1))
    return folder


def rank_copy(body: bytes, info: dict) -> bytes:
    """The trace `body` (a JSON object) with `info` as its distributedInfo, first and spaced as Kineto writes it.

    HTA finds a file's rank with the regex `"rank":\\s+(\\d+)` on the first line that matches: compact JSON
    (`"rank":3`) matches nothing, every copy defaults to rank 0 and HTA keeps one of them.
    """
    import json

    return b'{"distributedInfo": ' + json.dumps(info).encode() + (b", " + body[1:] if body != b"{}" else b"}")


def job_case(ranks: int, skip_hta: bool, repeat: int, before: str | None = None) -> dict:
    """`ranks` copies of the V100 transformer rank (48 MB of JSON each) as a job folder: traceflops with --jobs 2
    against HTA on the same folder, and one rank alone (the job's memory should stay near it, whatever the count).
    With `before` (a checkout), its job is alternated with this one's."""
    import shutil

    folder = job_folder(ranks)
    try:
        return _job_results(folder, ranks, skip_hta, repeat, before)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # 3.8 MB a rank


def job_commands(folder: Path) -> tuple[str, str]:
    """`analyze --no-cache` of the folder's first rank alone, and of the whole folder as a job with `--jobs 2`."""
    analyze = ["analyze", "--quiet", "--format", "json", "--no-cache"]
    return (_CLI.format(args=[*analyze, str(folder / "rank0.json.gz")]),
            _CLI.format(args=[*analyze, str(folder), "--jobs", "2"]))


BEFORE_JOB = "traceflops analyze DIR --jobs 2 (before)"


def _job_results(folder: Path, ranks: int, skip_hta: bool, repeat: int, before: str | None = None) -> dict:
    one, job = job_commands(folder)
    hta = ("from hta.trace_analysis import TraceAnalysis\n"
           f"t = TraceAnalysis(trace_dir={str(folder)!r})\n"
           f"assert len(t.t.traces) == {ranks}, f'HTA read {{len(t.t.traces)}} of {ranks} ranks'\n"
           "t.get_temporal_breakdown(visualize=False)")
    results: dict = {"ranks": ranks, "bytes": sum(f.stat().st_size for f in folder.iterdir())}
    results["traceflops, one rank"] = timed(one, str(folder), repeat)
    # the job alone, or in turn with another checkout's (one way to time it either way)
    jobs = {"traceflops analyze DIR --jobs 2": (job, NOW)} | ({BEFORE_JOB: (job, checkout(before))} if before else {})
    results.update(alternated(jobs, str(folder), repeat))
    after_vs_before(results, "job", results.get(BEFORE_JOB), results["traceflops analyze DIR --jobs 2"])
    if not skip_hta:
        results["HTA parse + temporal breakdown"] = timed(hta, str(folder), repeat, warm=False)  # the folder is warm from the runs before
    j, h, o = results["traceflops analyze DIR --jobs 2"], results.get("HTA parse + temporal breakdown"), results["traceflops, one rank"]
    if "error" not in j and h and "error" not in h:
        j["time_vs_hta"] = j["wall_s"] / h["wall_s"]
        j["memory_vs_hta"] = j["peak_tree_rss_mb"] / h["peak_tree_rss_mb"]
        j["pss_vs_hta"] = j["peak_tree_pss_mb"] / h["peak_tree_pss_mb"]
    if "error" not in j and "error" not in o:
        j["memory_vs_one_rank"] = j["peak_tree_rss_mb"] / o["peak_tree_rss_mb"]
        j["pss_vs_one_rank"] = j["peak_tree_pss_mb"] / o["peak_tree_pss_mb"]
    for name, r in results.items():
        if isinstance(r, dict):
            print(f"{name:58s} {r}", flush=True)
    return results


def timed(code: str, path: str, repeat: int, fresh: str | None = None, drop_reports: str | None = None, warm: bool = True) -> dict:
    """One warm-up run, its memory sampled (unless not `warm`: then the timed runs are sampled), then `repeat` runs
    with nothing sampling beside them: `medians` (whole process tree), the sampled peaks."""
    import shutil

    memory = run_isolated(code, path) if warm else None
    got = []
    for _ in range(repeat):
        if fresh:
            shutil.rmtree(fresh, ignore_errors=True)
            os.makedirs(fresh)
        for kept in Path(drop_reports).glob("*.tfreport") if drop_reports else ():
            kept.unlink()
        got.append(run_isolated(code, path, sample=not warm))
    sampled = [memory] if memory else got
    bad = [g for g in [*got, *sampled] if "error" in g]
    if bad:
        return bad[0]
    return {**medians(got),
            "peak_tree_rss_mb": max(g["peak_tree_rss_mb"] for g in sampled),
            "peak_tree_pss_mb": max(g["peak_tree_pss_mb"] for g in sampled),
            "runs": len(got), "timed_while_sampled": not warm}


def medians(runs: list[dict]) -> dict:
    """The medians of timed runs: wall, CPU (user + system), system alone and minor page faults (process trees)."""
    import statistics

    return {k: round(statistics.median(g[k] for g in runs), 3) for k in ("wall_s", "cpu_s", "sys_s", "minor_faults")}


def ratios(results: dict) -> None:
    ok = lambda name: "wall_s" in results.get(name, {}) and "error" not in results[name]
    base, hta = "orjson.loads", "HTA parse + temporal breakdown"
    for name in [n for n in results if n.startswith("traceflops")]:
        r = results[name]
        if ok(base):
            r["time_vs_orjson"] = r["wall_s"] / results[base]["wall_s"]
            if r.get("cpu_s") is not None and results[base].get("cpu_s"):
                r["cpu_vs_orjson"] = r["cpu_s"] / results[base]["cpu_s"]
        if ok(hta):
            r["time_vs_hta"] = r["wall_s"] / results[hta]["wall_s"]
            r["memory_vs_hta"] = r["peak_tree_rss_mb"] / results[hta]["peak_tree_rss_mb"]
        r["memory_vs_file"] = r["peak_tree_rss_mb"] * 2**20 / results["bytes"]
        r["pss_vs_file"] = r["peak_tree_pss_mb"] * 2**20 / results["bytes"]
    ann, ana = "traceflops annotate --no-cache", "traceflops analyze --no-cache"
    if ok(ann) and ok(ana):
        results[ann]["time_vs_analyze"] = results[ann]["wall_s"] / results[ana]["wall_s"]
    first, again = "traceflops analyze, first (writes the cache)", "traceflops analyze, again (cached)"
    if ok(first) and ok(again):
        results[again]["time_vs_first"] = results[again]["wall_s"] / results[first]["wall_s"]


# ---------------------------------------------------------------- the analysis after the parse

# One process per head: the trace parsed once (or read from the parsed-trace cache), the analysis run once to warm up,
# then `repeat` times, each timed on its own (CPU: the process's user + system, polars' threads included); then once
# more under cProfile to count the polars queries it ran (every eager frame operation is one collect).
_ANALYSIS = (
    "import cProfile, json, pstats, time\n"
    "from pathlib import Path\n"
    "from traceflops.core.results import ModelOptions\n"
    "from traceflops.pipeline import analyze_trace\n"
    "from traceflops.run.load import load\n"
    "trace = load(P, Path(CACHE))\n"
    "analyze_trace(trace, ModelOptions())\n"
    "runs = []\n"
    "for _ in range(REPEAT):\n"
    "    c, w = time.process_time(), time.perf_counter()\n"
    "    analyze_trace(trace, ModelOptions())\n"
    "    runs.append((time.process_time() - c, time.perf_counter() - w))\n"
    "try:  # the profiled run keeps every query on this thread (a part run beside would go uncounted)\n"
    "    import traceflops.core.beside as _beside\n"
    "    _beside.threaded = lambda: False\n"
    "except ImportError:  # a checkout from before `core.beside`\n"
    "    pass\n"
    "pr = cProfile.Profile()\n"
    "pr.runcall(analyze_trace, trace, ModelOptions())\n"
    "queries = sum(v[1] for f, v in pstats.Stats(pr).stats.items() if f[2] == \"<method 'collect' of 'builtins.PyLazyFrame' objects>\")\n"
    "print(json.dumps({'runs': runs, 'polars_queries': queries}))\n"
)


def analysis_after_parse(path: str, before: str | None = None, repeat: int = 3, rounds: int = 2) -> dict:
    """CPU and wall seconds of `pipeline.analyze_trace` on a parsed trace (the parse itself left out), and its
    polars queries; with `before` (a checkout), that head's too, the two in turn (`in_turn`) `rounds` times in one run (the
    machine is shared: only numbers from one run compare) and given as after / before ratios. Medians of every
    timed run; the load average (`uptime`) before and after goes with the numbers."""
    import shutil
    import statistics

    heads = {"after": str(ROOT)} | ({"before": str(Path(before).resolve())} if before else {})
    places = {head: checkout(root) for head, root in heads.items()}
    cache = tempfile.mkdtemp(prefix="traceflops_bench_analysis_")
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    got: dict[str, dict] = {h: {"cpu": [], "wall": [], "polars_queries": None} for h in heads}
    try:
        for i in range(rounds):
            for head in in_turn(list(heads), i):
                env, root = places[head]
                code = _ANALYSIS.replace("CACHE", repr(cache)).replace("REPEAT", str(repeat))
                r = subprocess.run([sys.executable, "-c", f"P = {path!r}\n{code}"], capture_output=True, text=True,
                                   env=env, cwd=root)
                if r.returncode:
                    raise RuntimeError(f"{head}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'failed'}")
                one = json.loads(r.stdout.strip().splitlines()[-1])
                got[head]["cpu"] += [c for c, _ in one["runs"]]
                got[head]["wall"] += [w for _, w in one["runs"]]
                got[head]["polars_queries"] = one["polars_queries"]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    out: dict = {"trace": path, "bytes": os.path.getsize(path), "runs_per_head": rounds * repeat,
                 "loadavg_before": load_before,
                 "loadavg_after": Path("/proc/loadavg").read_text().split()[:3] if load_before else None}
    for head, g in got.items():
        out[head] = {"cpu_s": round(statistics.median(g["cpu"]), 3), "wall_s": round(statistics.median(g["wall"]), 3),
                     "cpu_s_all": [round(c, 3) for c in g["cpu"]], "polars_queries": g["polars_queries"]}
    if before:
        out["cpu_after_vs_before"] = out["after"]["cpu_s"] / out["before"]["cpu_s"]
        out["wall_after_vs_before"] = out["after"]["wall_s"] / out["before"]["wall_s"]
        out["queries_after_vs_before"] = out["after"]["polars_queries"] / out["before"]["polars_queries"]
    return out


def run_isolated(code: str, path: str, env: dict | None = None, cwd: str | None = None, sample: bool = True) -> dict:
    """Wall and CPU time and, if `sample`, the peak memory of the process tree, sampled every 10 ms: RSS summed (a
    page shared by processes counted in each: three interpreters count polars' library thrice) and PSS summed (a
    shared page split among the processes that map it: the tree's real footprint, the figure to quote). Unsampled,
    the process is only waited for (no peaks)."""
    import resource

    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen([sys.executable, "-c", f"P = {path!r}\n{code}\n"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd)
    t = time.perf_counter()
    err = None if sample else proc.communicate()[1]  # unsampled: only waited for, its stderr read as it goes
    root, peak, peak_pss, pss_at = psutil.Process(proc.pid) if sample else None, 0, 0, 0.0
    while sample and proc.poll() is None:
        try:
            tree = [p for p in [root, *root.children(recursive=True)] if p.is_running()]
            rss = sum(p.memory_info().rss for p in tree)
            peak = max(peak, rss)
            # PSS walks every mapping of the process under its memory lock: read near the RSS peak, at most every
            # 100 ms, or the sampling itself slows what it measures (orjson.loads of 476 MB took 14.5 s, not 7.4).
            if rss >= 0.95 * peak and time.perf_counter() - pss_at >= 0.1:
                peak_pss, pss_at = max(peak_pss, sum(pss_bytes(p.pid) for p in tree)), time.perf_counter()
        except psutil.Error:
            pass
        time.sleep(0.01)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the contender and every descendant it waited for
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.read() if err is None else err
    if proc.returncode:
        return {"error": err.strip().splitlines()[-1] if err.strip() else "failed", "wall_s": wall}
    # The system share and the page faults: on a virtual machine a first touch of memory can cost the host's fault
    # too (see `machine_probe`), and that share moves with the host, not with the code measured.
    got = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "sys_s": round(after.ru_stime - before.ru_stime, 3),
           "minor_faults": after.ru_minflt - before.ru_minflt}
    if not sample:
        return got
    return {**got, "peak_tree_rss_mb": round(peak / 2**20, 1), "peak_tree_pss_mb": round(peak_pss / 2**20, 1)}


# The machine's speed now, in fresh processes (medians of three), to tell a slow spell from a slower commit:
# - `page_fault_us`: the first touch of 512 MiB, microseconds a 4 KiB page. Each page is a fault that the guest's kernel
#   serves with a zeroed page; where the host backs guest memory lazily or takes freed pages back (a balloon's free
#   page reporting), the host's own fault is added, and how much moves with the host's load.
# - `python_loop_ns`: nanoseconds an iteration of a plain Python loop (the interpreter's speed on this core now).
_PROBES = {
    "page_fault_us": (
        "import json, mmap, time\n"
        "n = 512 << 20\n"
        "m = mmap.mmap(-1, n)\n"  # anonymous: mapped, not yet touched
        "if hasattr(mmap, 'MADV_NOHUGEPAGE'):\n"  # Linux: 4 KiB pages whatever the kernel's huge-page mode
        "    m.madvise(mmap.MADV_NOHUGEPAGE)\n"
        "t = time.perf_counter()\n"
        "m[::4096] = b'\\x01' * (n // 4096)\n"  # one byte a page, in one C loop
        "print(json.dumps((time.perf_counter() - t) * 1e6 / (n // 4096)))\n"
    ),
    "python_loop_ns": (
        "import json, time\n"
        "n = 5_000_000\n"
        "t = time.perf_counter()\n"
        "x = 0\n"
        "for i in range(n):\n"
        "    x += i & 7\n"
        "print(json.dumps((time.perf_counter() - t) * 1e9 / n))\n"
    ),
}


def machine_probe(repeat: int = 3) -> dict[str, float]:
    """`_PROBES`, each the median of `repeat` fresh processes."""
    import statistics

    def once(code: str) -> float:
        return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)

    return {name: round(statistics.median(once(code) for _ in range(repeat)), 3) for name, code in _PROBES.items()}


def pss_bytes(pid: int) -> int:
    """A process's proportional set size (Linux /proc/PID/smaps_rollup); 0 once it has gone or where there is none."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


# ---- Memory ratios (`--memory`): a job's peak against one rank's, a big trace's peak against its file's size ----
#
# The peak of a process tree, sampled every 10 ms from /proc/PID/status: RSS summed over the processes (a shared
# library's pages counted in each), and "unique": anonymous pages summed plus file-backed pages counted once (the
# largest process's), close to what a cgroup is charged for the tree. Each figure comes with `uptime`: the machine is
# shared, and a loaded machine moves the timings (the peaks much less).


def _status_bytes(pid: int) -> dict[str, int]:
    got: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                    k, v = line.split(":")
                    got[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return got


def run_tree_memory(code: str, path: str) -> dict:
    """Wall time and the tree's peak RSS (summed) and unique memory (anonymous summed, file-backed once), in MiB."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", f"P = {path!r}\n{code}\n"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    root, t = psutil.Process(proc.pid), time.perf_counter()
    rss = unique = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = [root]
        got = [_status_bytes(p.pid) for p in tree]
        anon = sum(g.get("RssAnon", 0) + g.get("RssShmem", 0) for g in got)
        files = [g.get("RssFile", 0) for g in got]
        rss, unique = max(rss, anon + sum(files)), max(unique, anon + max(files, default=0))
        time.sleep(0.01)
    err = proc.stderr.read()
    if proc.returncode:
        return {"error": err.strip().splitlines()[-1] if err.strip() else "failed"}
    return {"wall_s": round(time.perf_counter() - t, 2), "peak_tree_rss_mb": round(rss / 2**20, 1),
            "peak_tree_unique_mb": round(unique / 2**20, 1), "uptime": uptime()}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def tiled_streaming(k: int, src: Path | None = None) -> str:
    """`tile_trace.py`'s K copies, written event by event: that tool holds every copy's dicts at once (tens of GB for
    a 2 GB trace). The copies are the same; the top-level fields come before traceEvents."""
    sys.path.insert(0, str(SHARED.parent / "tools"))
    from tile_trace import ID_ARGS, STEP, load

    src = src or SHARED / "kineto" / "v100_resnet50_legacy2021.json.gz"
    path = os.path.join(tempfile.gettempdir(), f"traceflops_bench_stream_{src.name.split('.')[0]}_{k}.json")
    if os.path.exists(path):
        return path
    trace = load(str(src))
    events = trace.pop("traceEvents")
    stamps = [float(e["ts"]) for e in events if "ts" in e]
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events if "ts" in e) - min(stamps) + 1000.0
    steps = [int(m.group(1)) for e in events if (m := STEP.match(str(e.get("name", ""))))]
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    ids = [int(v) for e in events for a in ID_ARGS if isinstance(v := e.get("args", {}).get(a), (int, float))]
    id_span = 1 + max(ids + [int(e["id"]) for e in events if isinstance(e.get("id"), int)] + [0])
    with open(path + ".part", "w") as f:
        head = json.dumps(trace)
        f.write(head[:-1] + (", " if trace else "") + '"traceEvents": [')
        for c in range(k):
            out = []
            for e in events:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = float(e["ts"]) + c * span
                if c and isinstance(e.get("id"), int):
                    e["id"] = e["id"] + c * id_span
                if c and "args" in e:
                    e["args"] = {a: (v + c * id_span if a in ID_ARGS and isinstance(v, int) and v >= 0 else v)
                                 for a, v in e["args"].items()}
                if c and step_span and (m := STEP.match(str(e.get("name", "")))):
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + c * step_span}"
                out.append(json.dumps(e))
            f.write((", " if c else "") + ", ".join(out))
        f.write("]}")
    os.replace(path + ".part", path)
    return path


def memory_ratios(ranks: int = 32, tiles: int = 57, repeat: int = 3) -> dict:
    """In one run: the job's peak (`analyze DIR --jobs 2`, `ranks` copies of the V100 transformer rank) against one
    rank's alone, and a big tiled trace's peak (`analyze --no-cache`) against its file's size; the largest peak of
    `repeat` runs each (one rank's varies by ~10 MiB from run to run)."""
    import shutil

    def worst(code: str, path: str, n: int) -> dict:
        got = [run_tree_memory(code, path) for _ in range(n)]
        bad = [g for g in got if "error" in g]
        if bad:
            return bad[0]
        top = max(got, key=lambda g: g["peak_tree_unique_mb"])
        return {**top, "peak_tree_rss_mb": max(g["peak_tree_rss_mb"] for g in got), "runs": n}

    out: dict = {}
    folder = job_folder(ranks)
    try:
        one, job = job_commands(folder)
        o = out["one rank"] = worst(one, str(folder), repeat)
        j = out[f"job of {ranks} ranks, --jobs 2"] = worst(job, str(folder), max(1, repeat // 3))
        print("one rank", o, "\njob", j, flush=True)
        if "error" not in o and "error" not in j:
            out["job vs one rank (RSS summed)"] = round(j["peak_tree_rss_mb"] / o["peak_tree_rss_mb"], 3)
            out["job vs one rank (unique)"] = round(j["peak_tree_unique_mb"] / o["peak_tree_unique_mb"], 3)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    big = tiled_streaming(tiles)
    b = out[f"{tiles} tiles ({os.path.getsize(big) / 1e9:.2f} GB)"] = run_tree_memory(cli("--no-cache"), big)
    print("big", b, flush=True)
    if "error" not in b:
        out["big trace vs file (RSS)"] = round(b["peak_tree_rss_mb"] * 2**20 / os.path.getsize(big), 3)
        out["big trace vs file (unique)"] = round(b["peak_tree_unique_mb"] * 2**20 / os.path.getsize(big), 3)
    return out


if __name__ == "__main__":
    main()
