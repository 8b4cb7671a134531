"""Per-rank summaries on disk (`.tfsum`): summarize anywhere, merge into the job view later."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceflops.core.errors import FormatError
from traceflops.core.results import RankSummary
from traceflops.storage.bundle import read_bundle, write_bundle

KIND = "traceflops.summary/1"


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
    }
    write_bundle(path, {"steps": s.steps, "collectives": s.collectives, "idle": s.idle}, meta)


def read_summary(path: str | Path) -> RankSummary:
    tables, meta = read_bundle(path)
    if meta.get("kind") != KIND or any(t not in tables for t in ("steps", "collectives", "idle")):
        raise FormatError(str(path), "not a traceflops rank summary", "create it with `traceflops summarize TRACE -o FILE.tfsum`")
    return RankSummary(
        rank=meta.get("rank"),
        world_size=meta.get("world_size"),
        path=meta.get("path") or str(path),
        hardware=meta.get("hardware"),
        model=meta.get("model"),
        steps=tables["steps"],
        collectives=tables["collectives"],
        idle=tables["idle"] if tables["idle"].width else pl.DataFrame(schema={"step": pl.Int64, "reason": pl.Utf8, "dur": pl.Float64}),
        totals=meta.get("totals") or {},
        warnings=list(meta.get("warnings") or []),
    )
