"""Per-rank summaries on disk (`.tfsum`): summarize anywhere, merge into the job view later."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.results import RankSummary
from traceflops.storage.bundle import read_bundle, write_bundle

KIND = "traceflops.summary/1"
# A summary holds per-step rows, one row per collective kernel and per (step, idle reason): far below these for any real
# trace (a 32 GiB trace has some millions of events in all), far above them for a decompression bomb.
MAX_SUMMARY_BYTES = 512 << 20
MAX_SUMMARY_ROWS = 4_000_000
_FIELDS = {"rank": int, "world_size": int, "path": str, "hardware": dict, "model": dict}  # each may also be null
_TABLE_COLUMNS = {"steps": ("step", "window"), "collectives": (), "idle": ()}
_REDO = "create it again with `traceflops summarize TRACE -o FILE.tfsum`"


def write_summary(s: RankSummary, path: str | Path) -> None:
    meta = {
        "kind": KIND,
        "rank": s.rank,
        "world_size": s.world_size,
        "path": s.path,
        "hardware": s.hardware,
        "model": s.model,
        "totals": s.totals,
        "warnings": s.warnings,
        "advice": s.advice,
    }
    tables = {"steps": s.steps, "collectives": s.collectives, "idle": s.idle}
    if s.path_comm is not None:
        tables["path_comm"] = s.path_comm
    write_bundle(path, tables, meta)


def _tampered(meta, tables) -> str | None:
    """What a summary's contents lack that `write_summary` always writes, or None: checked before the job view trusts them."""
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        return "not a traceflops rank summary"
    for f, kind in _FIELDS.items():
        v = meta.get(f)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            return f"its {f} is a {type(v).__name__}, not a {kind.__name__}"
    if not isinstance(meta.get("totals"), dict):
        return "its totals are missing or not an object"
    if not isinstance(meta.get("warnings", []), list) or not all(isinstance(w, str) for w in meta.get("warnings", [])):
        return "its warnings are not a list of text"
    for t, columns in _TABLE_COLUMNS.items():
        if t not in tables:
            return f"its {t} table is missing"
        missing = [c for c in columns if c not in tables[t].columns]
        if missing:
            return f"its {t} table has no {', '.join(missing)} column"
    return None


def read_summary(path: str | Path) -> RankSummary:
    """A `.tfsum` back, bounded (bytes inflated, rows per table) and checked field by field: FormatError when tampered with."""
    tables, meta = read_bundle(path, max_bytes=MAX_SUMMARY_BYTES, max_rows=MAX_SUMMARY_ROWS)
    why = _tampered(meta, tables)
    if why is not None:
        raise FormatError(str(path), why, _REDO)
    return RankSummary(
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
        path=meta.get("path") or str(path),
        hardware=meta.get("hardware"),
        model=meta.get("model"),
        steps=tables["steps"],
        collectives=tables["collectives"],
        idle=tables["idle"] if tables["idle"].width else pl.DataFrame(schema={"step": pl.Int64, "reason": pl.Utf8, "dur": pl.Float64}),
        totals=meta["totals"],
        warnings=list(meta.get("warnings") or []),
        path_comm=tables["path_comm"] if {"step", "start", "end"} <= set(tables.get("path_comm", pl.DataFrame()).columns) else None,
        advice=[a for a in meta.get("advice") or [] if isinstance(a, dict) and isinstance(a.get("title"), str)],
    )
