"""Cache of parsed `Trace` tables, so a second look at a big trace skips the parse.

The key is cheap to compute on a huge file: size, mtime_ns, inode, a hash of
the first and last MiB, and the tool's version — not a hash of the whole file.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

from traceflops import __version__
from traceflops.core.errors import TraceflopsError
from traceflops.core.trace import Trace, Warnings, compact
from traceflops.storage.bundle import read_bundle, write_bundle

_EDGE = 1 << 20
TABLES = ("ops", "kernels", "launches", "markers", "steps")


def default_dir() -> Path:
    env = os.environ.get("TRACEFLOPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceflops"


def key(path: str) -> str:
    st = os.stat(path)
    h = hashlib.sha256()
    h.update(f"{__version__}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode())
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if st.st_size > _EDGE:
            f.seek(max(st.st_size - _EDGE, _EDGE))
            h.update(f.read(_EDGE))
    return h.hexdigest()[:32]


def _read(entry: Path) -> tuple[dict, dict] | None:
    if not entry.exists():
        return None
    try:
        return read_bundle(entry)
    except TraceflopsError:
        return None  # a damaged entry is a miss; it will be rewritten


def load(path: str, cache_dir: Path) -> Trace | None:
    got = _read(cache_dir / f"{key(path)}.tfcache")
    if got is None:
        return None
    tables, meta = got
    if any(t not in tables for t in TABLES):
        return None
    warnings = Warnings(Counter(meta.pop("_warnings", {})))
    meta["path"] = str(path)
    tables = {t: compact(f.with_columns(_one_copy_each(f["name"])) if "name" in f.columns and f.height else f) for t, f in tables.items()}
    return Trace(*(tables[t] for t in TABLES), meta=meta, warnings=warnings)


def _one_copy_each(names):
    """Rows pointing at one copy of each distinct name, as the parser stores them.

    Parquet gives every row its own copy; long kernel names repeated a hundred
    thousand times then cost more than the rest of the trace.
    """
    import polars as pl

    distinct = names.unique(maintain_order=True)
    at = names.to_frame("v").join(distinct.to_frame("v").with_row_index("i"), on="v", how="left", nulls_equal=True, maintain_order="left")["i"]
    return distinct.gather(at).alias(names.name).cast(pl.Utf8)


def store(path: str, trace: Trace, cache_dir: Path) -> None:
    meta = dict(trace.meta)
    meta["_warnings"] = dict(trace.warnings.counts)
    write_bundle(cache_dir / f"{key(path)}.tfcache", {t: getattr(trace, t) for t in TABLES}, meta)


# ---------------------------------------------------------------- finished reports
# What the JSON and terminal reports read, kept per trace and per set of options:
# running the same command again on the same trace renders from here (no parse,
# no analysis). Other options still reuse the parsed tables above.
REPORT_TABLES = ("steps", "top_kernels", "by_module", "by_gemm_shape")
REPORT_FIELDS = ("hardware", "model", "totals", "outside_steps", "warnings", "ranks", "advice", "step_stats")


def report_key(path: str, options) -> str:
    return hashlib.sha256(f"{key(path)}|{options!r}".encode()).hexdigest()[:32]


def store_report(path: str, options, a, cache_dir: Path) -> None:
    steps = a.steps
    budgets = list(steps["loss_budget"]) if "loss_budget" in steps.columns else None
    tables = {"steps": steps.drop("loss_budget", strict=False)}
    tables |= {t: getattr(a, t) for t in REPORT_TABLES[1:] if getattr(a, t) is not None}
    meta = {f: getattr(a, f) for f in REPORT_FIELDS}
    meta |= {"_meta": {k: v for k, v in a.meta.items() if k in ("format", "rank", "world_size", "schema_version", "truncated")},
             "_loss_budgets": budgets}
    write_bundle(cache_dir / f"{report_key(path, options)}.tfreport", tables, meta)


def load_report(path: str, options, cache_dir: Path):
    """An `Analysis` holding what the reports read (no event tables), or None."""
    import polars as pl

    from traceflops.pipeline import Analysis
    from traceflops.core.trace import empty

    got = _read(cache_dir / f"{report_key(path, options)}.tfreport")
    if got is None:
        return None
    tables, meta = got
    if "steps" not in tables or any(f not in meta for f in REPORT_FIELDS):
        return None
    steps = tables["steps"]
    if meta.get("_loss_budgets") is not None:
        steps = steps.with_columns(loss_budget=pl.Series(meta["_loss_budgets"], dtype=pl.Object))
    trace_meta = dict(meta.get("_meta") or {}, path=str(path))
    trace = Trace(*(empty({}) for _ in TABLES), meta=trace_meta, warnings=Warnings())
    fields = {f: meta[f] for f in REPORT_FIELDS}
    return Analysis(trace=trace, ops=empty({}), kernels=empty({}), steps=steps,
                    top_kernels=tables.get("top_kernels"), by_module=tables.get("by_module"), by_gemm_shape=tables.get("by_gemm_shape"),
                    **fields)
