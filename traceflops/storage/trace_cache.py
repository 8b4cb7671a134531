"""Cache of parsed `Trace` tables, so a second look at a big trace skips the parse.

The key is the tool's version, the file's size, mtime and inode, and a SHA-256
hash of all its bytes: a trace edited in place with its size and mtime put
back is a miss, not old numbers. Hashing reads the file once per run (about
0.4 s for 285 MB here, a twentieth of a parse). Entries are read only when
they are regular files inside the cache folder (never through a link) and
within a size bound.

The folder heals itself: what one run could not do is never kept as a fact
(`NOT_WRITTEN`, the warning of an entry that could not be written, is never
stored in a kept report, so a later run tries again), a writer killed mid-write
(SIGKILL, a power cut) leaves a `.<entry>.<random>.tmp` that the next store
removes once it is `STALE_TMP_S` old, and the folder is bounded: after each
store the least recently used entries (a hit touches its entry's mtime) are
removed until the entries fit `max_bytes()` (`TRACEFLOPS_CACHE_MAX_BYTES`,
default 2 GiB).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from collections import Counter
from pathlib import Path

from traceflops.core.errors import TraceflopsError
from traceflops.core.files import open_if_regular
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
from traceflops.storage.bundle import MAX_BUNDLE_BYTES, read_bundle, write_bundle

TABLES = ("ops", "kernels", "launches", "markers", "steps")
SCHEMAS = {"ops": OPS_SCHEMA, "kernels": KERNELS_SCHEMA, "launches": LAUNCHES_SCHEMA, "markers": MARKERS_SCHEMA}


NOT_WRITTEN = "cache not written"  # the warning of a store that failed: true of one run only, never kept
ENTRY_SUFFIXES = (".tfcache", ".tfreport")
DEFAULT_MAX_BYTES = 2 << 30
STALE_TMP_S = 15 * 60  # a temporary this long untouched has no writer: each write keeps its file's mtime fresh
_TMP = re.compile(r"\..+\.(tfcache|tfreport)\.[0-9a-f]+\.tmp")  # core.files.write_atomic's temporaries of an entry
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)


def is_transient(warning: str) -> bool:
    """A warning about this run's cache, not about the trace: never stored with a kept report."""
    return warning.startswith(NOT_WRITTEN)


def max_bytes() -> int:
    """The cache folder's bound: TRACEFLOPS_CACHE_MAX_BYTES (bytes, or with a K/M/G/T suffix, powers of 1024; 0: no
    entry is kept), default 2 GiB; a value that is not a size is the default."""
    got = _SIZE.fullmatch(os.environ.get("TRACEFLOPS_CACHE_MAX_BYTES", ""))
    if got is None:
        return DEFAULT_MAX_BYTES
    return int(float(got.group(1)) * 1024 ** " kmgt".index(got.group(2).lower() or " "))


def default_dir() -> Path:
    env = os.environ.get("TRACEFLOPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceflops"


_DIGESTS: dict[
    tuple[int, ...], str
] = {}  # this process's content hashes, by file identity and times: one read per file per run


def _content_digest(f, st: os.stat_result) -> str:
    """SHA-256 of all the file's bytes (hardware-accelerated: the fastest of hashlib's here), once per process while it
    is unchanged."""
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if ident not in _DIGESTS:
        if len(_DIGESTS) >= 4096:
            _DIGESTS.clear()
        _DIGESTS[ident] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[ident]


def key(path: str) -> str | None:
    """Names a trace file's cache entries: changes when any byte of the file, its mtime, or the version does; None (no
    caching) when it cannot be read."""
    try:
        f, st = open_if_regular(path)
    except (OSError, ValueError):
        return None  # the parser says why it cannot be read
    if f is None:
        return None  # a pipe or a device: never hashed, never cached
    with f:
        digest = _content_digest(f, st)
    return hashlib.sha256(f"{VERSION}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{digest}".encode()).hexdigest()[:32]


def read_entry(entry: Path, max_bytes: int = MAX_BUNDLE_BYTES) -> tuple[dict, dict] | None:
    """A cache entry's tables and metadata; None when absent, damaged, too large, or not a regular file (a link is never
    followed).
    A hit marks the entry used (its mtime), for the least-recently-used eviction."""
    try:
        f, st = open_if_regular(entry, follow_links=False)
    except OSError:
        return None  # absent, a link (ELOOP under O_NOFOLLOW), or unreadable: a miss, rewritten by `store`
    if f is None:
        return None
    with f:
        if st.st_size > max_bytes:
            return None
        try:
            got = read_bundle(f, max_bytes=max_bytes, name=str(entry))
        except TraceflopsError:
            return None  # a damaged entry is a miss; it will be rewritten
        with contextlib.suppress(OSError):  # a read-only cache is still read
            os.utime(f.fileno())
        return got


def tidy(cache_dir: Path, keep: Path | None = None, now: float | None = None) -> None:
    """Remove dead writers' temporaries, then the least recently used entries until the entries fit `max_bytes()`.

    `keep` (the entry just written) goes last, and only when it alone is over the bound. Links and folders are
    never followed nor removed; a file another process removed first is skipped.
    """
    now = time.time() if now is None else now
    bound = max_bytes()
    entries = []
    try:
        with os.scandir(cache_dir) as it:
            listing = list(it)
    except OSError:
        return
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if _TMP.fullmatch(e.name):
            if now - st.st_mtime > STALE_TMP_S:
                _remove(e.path)
        elif e.name.endswith(ENTRY_SUFFIXES):
            entries.append((e.path == str(keep), st.st_mtime, st.st_size, e.path))
    total = sum(size for _, _, size, _ in entries)
    for _, _, size, path in sorted(entries):  # the oldest use first, the entry just written last
        if total <= bound:
            break
        if _remove(path):
            total -= size


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def load(path: str, cache_dir: Path) -> Trace | None:
    k = key(path)
    got = None if k is None else read_entry(cache_dir / f"{k}.tfcache")
    if got is None:
        return None
    tables, meta = got
    if any(t not in tables for t in TABLES):
        return None
    if any(list(tables[t].columns) != list(schema) for t, schema in SCHEMAS.items()):
        return None  # written by a build whose Trace model had other columns: a miss, parsed again
    warnings = Warnings(Counter(meta.pop("_warnings", {})))
    meta["path"] = str(path)
    tables = {
        t: compact(f.with_columns(_one_copy_each(f["name"])) if "name" in f.columns and f.height else f)
        for t, f in tables.items()
    }
    ops, kernels, launches, markers, steps = (tables[t] for t in TABLES)
    return Trace(ops, kernels, launches, markers, steps, meta=meta, warnings=warnings)


def _one_copy_each(names):
    """Rows pointing at one copy of each distinct name, as the parser stores them.

    Parquet gives every row its own copy; long kernel names repeated a hundred
    thousand times then cost more than the rest of the trace.
    """
    import polars as pl

    distinct = names.unique(maintain_order=True)
    at = names.to_frame("v").join(
        distinct.to_frame("v").with_row_index("i"), on="v", how="left", nulls_equal=True, maintain_order="left"
    )["i"]
    return distinct.gather(at).alias(names.name).cast(pl.Utf8)


def writable_entry(entry: Path) -> Path:
    """The entry's path, with whatever is there removed first when it is a link or not a regular file.

    Writing a file follows a link to its target (a report's `-o` may be one);
    a cache entry never does: a link planted in the cache is dropped, not
    written through to whatever it points at.
    """
    try:
        st = os.lstat(entry)
    except FileNotFoundError:
        return entry
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        entry.unlink()
    return entry


def store(path: str, trace: Trace, cache_dir: Path) -> None:
    """Keep the parsed tables; the path is not kept (`load` sets the one asked for, and a name need not be UTF-8)."""
    k = key(path)
    if k is None:
        return
    meta = {m: v for m, v in trace.meta.items() if m != "path"}
    meta["_warnings"] = {w: n for w, n in trace.warnings.counts.items() if not is_transient(w)}
    entry = writable_entry(cache_dir / f"{k}.tfcache")
    write_bundle(entry, {t: getattr(trace, t) for t in TABLES}, meta)
    tidy(cache_dir, keep=entry)
