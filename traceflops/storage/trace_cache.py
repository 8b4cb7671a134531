"""Cache of parsed `Trace` tables, so a second look at a big trace skips the parse.

The key is cheap to compute on a huge file: size, mtime_ns, inode, a hash of
the first and last MiB, and the tool's version — not a hash of the whole file.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

from traceflops.core.errors import TraceflopsError
from traceflops.core.trace import (
    KERNELS_SCHEMA,
    LAUNCHES_SCHEMA,
    MARKERS_SCHEMA,
    OPS_SCHEMA,
    Trace,
    Warnings,
    compact,
)
from traceflops.core.version import VERSION
from traceflops.storage.bundle import read_bundle, write_bundle

_EDGE = 1 << 20
TABLES = ("ops", "kernels", "launches", "markers", "steps")
SCHEMAS = {"ops": OPS_SCHEMA, "kernels": KERNELS_SCHEMA, "launches": LAUNCHES_SCHEMA, "markers": MARKERS_SCHEMA}


def default_dir() -> Path:
    env = os.environ.get("TRACEFLOPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceflops"


def key(path: str) -> str:
    """Names a trace file's cache entries: changes when the file (as far as size, times and its ends tell) or the version does."""
    st = os.stat(path)
    h = hashlib.sha256()
    h.update(f"{VERSION}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode())
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if st.st_size > _EDGE:
            f.seek(max(st.st_size - _EDGE, _EDGE))
            h.update(f.read(_EDGE))
    return h.hexdigest()[:32]


def read_entry(entry: Path) -> tuple[dict, dict] | None:
    """A cache entry's tables and metadata; None when absent or damaged (a miss)."""
    if not entry.exists():
        return None
    try:
        return read_bundle(entry)
    except TraceflopsError:
        return None  # a damaged entry is a miss; it will be rewritten


def load(path: str, cache_dir: Path) -> Trace | None:
    got = read_entry(cache_dir / f"{key(path)}.tfcache")
    if got is None:
        return None
    tables, meta = got
    if any(t not in tables for t in TABLES):
        return None
    if any(list(tables[t].columns) != list(schema) for t, schema in SCHEMAS.items()):
        return None  # written by a build whose Trace model had other columns: a miss, parsed again
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
