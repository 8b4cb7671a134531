"""Cache of parsed `Trace` tables, so a second look at a big trace skips the parse.

The key is cheap to compute on a huge file: size, mtime_ns, inode, a hash of
the first and last MiB, and the tool's version — not a hash of the whole file.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

from . import __version__
from .errors import TraceflopsError
from .model import Trace, Warnings
from .store import read_bundle, write_bundle

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


def load(path: str, cache_dir: Path) -> Trace | None:
    entry = cache_dir / f"{key(path)}.tfcache"
    if not entry.exists():
        return None
    try:
        tables, meta = read_bundle(entry)
    except TraceflopsError:
        return None  # a damaged entry is a miss; it will be rewritten
    if any(t not in tables for t in TABLES):
        return None
    warnings = Warnings(Counter(meta.pop("_warnings", {})))
    meta["path"] = str(path)
    return Trace(*(tables[t] for t in TABLES), meta=meta, warnings=warnings)


def store(path: str, trace: Trace, cache_dir: Path) -> None:
    meta = dict(trace.meta)
    meta["_warnings"] = dict(trace.warnings.counts)
    write_bundle(cache_dir / f"{key(path)}.tfcache", {t: getattr(trace, t) for t in TABLES}, meta)
