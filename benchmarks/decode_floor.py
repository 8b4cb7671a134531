"""What reading a trace costs before any analysis: the floor under `traceflops analyze`, measured beside peers.

    python benchmarks/decode_floor.py [--trace BIG.json] [--tiles 1] [--repeat 5] [--out floor.json]

`bench_parse.py` times whole commands; this splits one into the parts that
bound it, in one process, on one core (polars on one thread, no decode
helper), as CPU seconds: the median of `--repeat` runs after a warm-up.

  - the start of a command: a fresh interpreter importing the CLI and the
    analysis, and `traceflops analyze` of the smallest shared trace (what a
    command costs whatever the file's size);
  - `orjson.loads` of the file's bytes (bytes → dicts);
  - the parser's typed msgspec decode of the file's event arrays, alone
    (bytes → structs, the fields the analysis reads);
  - the whole parse (structs → typed columns → the `Trace`'s tables);
  - the analysis of the parsed trace;
  - peers that decode JSON straight into columns, where installed: polars'
    NDJSON reader, pyarrow's JSON reader and DuckDB's `read_json` (into a table of its own), each on
    the same events rewritten one per line (none of them reads a JSON array
    of events in chunks), typed with the fields the analysis reads. Events
    whose pid or tid is not an integer are left out of that copy: pyarrow
    and polars refuse a column that changes type.

The peers show whether another decoder would move the floor; the ratios
tell which of `bench_parse.py`'s targets a faster analysis alone could reach.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# beside this script (its folder is first on sys.path); it loads no polars
from bench_parse import SHARED, compile_package, tiled, timed

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one core: before polars loads
os.environ.setdefault("TRACEFLOPS_PARSE_HELPER", "0")


SMALLEST = SHARED / "kineto" / "dlrm_8rank" / "rank0.json.gz"  # 0.4 MB: what a command costs before the file's size counts


def cpu_median(fn, repeat: int) -> float:
    """Median CPU seconds of `fn()` over `repeat` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        c = time.process_time()
        fn()
        times.append(time.process_time() - c)
    return round(statistics.median(times), 4)


def _seconds(run: dict) -> dict:
    if "error" in run:
        raise SystemExit(f"decode_floor: a start-up run failed: {run['error']}")
    return {"wall_s": run["wall_s"], "cpu_s": run["cpu_s"]}


def event_arrays(path: str) -> list:
    """The file's events as the parser cuts them: JSON arrays of whole entries (2 MiB each)."""
    from traceflops.parsers.io import max_bytes_default
    from traceflops.parsers.jsonstream import stream_events
    from traceflops.parsers.kineto import CHUNK

    return [bytes(t) for texts, _ in stream_events(path, max_bytes_default(), chunk=CHUNK) for t in texts]


def ndjson_copy(raw: bytes, folder: str) -> tuple[str, bytes]:
    """The events one per line, those with an integer pid and tid only (see the module docstring)."""
    import orjson

    events = orjson.loads(raw)["traceEvents"]
    keep = [e for e in events if isinstance(e, dict) and isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int)]
    body = b"\n".join(orjson.dumps(e) for e in keep) + b"\n"
    path = os.path.join(folder, "events.ndjson")
    Path(path).write_bytes(body)
    return path, body


_ARGS = {"External id": "int", "correlation": "int", "Sequence number": "int", "device": "int", "stream": "int"}
_TOP = {"ph": "str", "cat": "str", "name": "str", "pid": "int", "tid": "int", "ts": "float", "dur": "float"}


def peers(nd_path: str, nd_body: bytes, repeat: int) -> dict:
    out: dict = {}
    import polars as pl

    pl_t = {"str": pl.Utf8, "int": pl.Int64, "float": pl.Float64}
    schema = {k: pl_t[v] for k, v in _TOP.items()} | {"args": pl.Struct({k: pl_t[v] for k, v in _ARGS.items()})}
    out["polars read_ndjson"] = cpu_median(lambda: pl.read_ndjson(nd_path, schema=schema), repeat)
    try:
        import io

        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        out["pyarrow.json read_json"] = None
    else:
        pa_t = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
        explicit = pa.schema([(k, pa_t[v]) for k, v in _TOP.items()] + [("args", pa.struct([(k, pa_t[v]) for k, v in _ARGS.items()]))])
        opts = pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="ignore")
        out["pyarrow.json read_json"] = cpu_median(
            lambda: pj.read_json(io.BytesIO(nd_body), read_options=pj.ReadOptions(use_threads=False), parse_options=opts), repeat)
    try:
        import duckdb
    except ImportError:
        out["DuckDB read_json"] = None
    else:
        db_t = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE"}
        args = ", ".join(f'"{k}" {db_t[v]}' for k, v in _ARGS.items())
        cols = ", ".join(f"'{k}': '{db_t[v]}'" for k, v in _TOP.items()) + f", 'args': 'STRUCT({args})'"
        con = duckdb.connect()
        con.execute("SET threads = 1")
        query = f"SELECT * FROM read_json('{nd_path}', format = 'newline_delimited', columns = {{{cols}}})"
        # into a table of DuckDB's own (columnar, in memory): no export, which needs pyarrow
        out["DuckDB read_json"] = cpu_median(lambda: con.execute(f"CREATE OR REPLACE TABLE events AS {query}"), repeat)
    return out


def measure(path: str, repeat: int) -> dict:
    import orjson

    from traceflops.core.results import ModelOptions
    from traceflops.parsers.kineto import parse_kineto
    from traceflops.parsers.kineto_events import EVENTS_DECODER as _EVENTS_DECODER
    from traceflops.pipeline import analyze_trace

    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":  # a gzipped trace: the JSON it holds, as orjson and the peers read it
        import gzip

        raw = gzip.decompress(raw)
    arrays = event_arrays(path)
    res: dict = {"trace": path, "bytes": len(raw)}
    # a fresh interpreter each, as bench_parse times its contenders (median wall and CPU seconds after a warm-up)
    res["start: import the CLI and the analysis"] = _seconds(timed(
        "import traceflops.cli.main, traceflops.pipeline, traceflops.parsers.kineto, traceflops.report.jsonreport", path, repeat))
    res["start: traceflops analyze of a 0.4 MB gzipped trace"] = _seconds(timed(
        "from traceflops.cli.main import main\n"
        f"main(['analyze', {str(SMALLEST)!r}, '--quiet', '--format', 'json', '--no-cache'], standalone_mode=False)", path, repeat))
    res["orjson.loads"] = cpu_median(lambda: orjson.loads(raw), repeat)

    def typed_decode():
        for a in arrays:
            _EVENTS_DECODER.decode(a)

    import gc

    gc.disable()  # as the parser runs its decode
    try:
        res["msgspec typed decode (structs only)"] = cpu_median(typed_decode, repeat)
    finally:
        gc.enable()
    res["traceflops parse (one process)"] = cpu_median(lambda: parse_kineto(path), repeat)
    trace = parse_kineto(path)
    res["traceflops analysis of the parsed trace"] = cpu_median(lambda: analyze_trace(trace, ModelOptions()), repeat)
    with tempfile.TemporaryDirectory() as d:
        nd_path, nd_body = ndjson_copy(raw, d)
        res["peers (NDJSON copy)"] = peers(nd_path, nd_body, repeat)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", help="a Kineto JSON trace (default: the V100 transformer tiled --tiles times)")
    ap.add_argument("--tiles", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    compile_package()  # as bench_parse does: the start-up measured is an installed package's
    res = measure(a.trace or tiled(a.tiles), a.repeat)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
