"""Per-rank summaries on disk (`.tfsum`): summarize anywhere, merge into the job view later."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import polars as pl

from traceflops.core.contract import COMMUNICATION_SCHEMA
from traceflops.core.errors import FormatError
from traceflops.core.results import RankSummary
from traceflops.core.sections import Hardware, ModelSection, RankAdvice, Totals, decode, encode, replace
from traceflops.core.vocab import PARTITION, usable_ranks
from traceflops.storage.bundle import bundle_bytes, read_bundle, write_bundle

KIND = "traceflops.summary/1"
# A summary holds per-step rows, one row per collective kernel and per (step, idle reason): far below these for any real
# trace (a 32 GiB trace has some millions of events in all), far above them for a decompression bomb.
MAX_SUMMARY_BYTES = 512 << 20
MAX_SUMMARY_ROWS = 4_000_000
_FIELDS = {"rank": int, "world_size": int, "path": str, "hardware": dict, "model": dict}  # each may also be null
_TABLE_COLUMNS = {"steps": ("step", "window"), "collectives": (), "idle": ()}
_REDO = "create it again with `traceflops summarize TRACE -o FILE.tfsum`"


def write_summary(s: RankSummary, path: str | Path) -> None:
    write_bundle(path, *_parts(s))


def summary_bytes(s: RankSummary) -> bytes:
    """The `.tfsum` file's bytes, in memory: how a job's process holds a rank's summary until the merge
    (`read_summary(io.BytesIO(b), name)` reads them back, checked as a file is)."""
    return bundle_bytes(*_parts(s))


def _parts(s: RankSummary) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    meta = {
        "kind": KIND,
        "rank": s.rank,
        "world_size": s.world_size,
        "path": s.path,
        "hardware": encode(s.hardware),
        "model": encode(s.model),
        "totals": encode(s.totals),
        "warnings": s.warnings,
        "advice": encode(s.advice),
    }
    tables = {"steps": s.steps, "collectives": s.collectives, "idle": s.idle}
    if s.path_comm is not None:
        tables["path_comm"] = s.path_comm
    if s.communication is not None:
        tables["communication"] = s.communication
    return tables, meta


def _tampered(meta, tables) -> str | None:
    """What a summary's contents lack that `write_summary` always writes, or None: checked before the job view trusts
    them."""
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


# What the job view reads from a summary's totals and hardware, and the kind of each (null allowed throughout).
_TOTAL_NUMBERS = ("wall_us", "mfu", "hfu")
_TOTAL_GROUPS = {"flops": ("executed", "recompute"), "time_us": PARTITION}
_HARDWARE: dict[str, type | tuple[type, ...]] = {"name": str, "peak_flops": (int, float)}

# The tables' columns of one kind, as `write_summary` writes them; other columns of `steps` are numbers
# (the integer ones by their prefix). A column given is of its kind; `step` columns and those below are required.
_TEXT = {"name", "window_source", "pg", "kind", "pg_desc", "role", "p2p", "group_ranks", "phase", "reason"}
_FLAGS = {"last"}
_WHOLE = {"step", "seq", "bytes", "group_size", "peer"}
_WHOLE_PREFIX = ("flops_", "count_")
_REQUIRED = {
    "idle": ("step", "reason", "dur"),
    "path_comm": ("step", "start", "end"),
    "collectives": ("pg", "seq", "kind", "ts", "end", "step"),
}


class _Mistyped(ValueError):
    pass


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mistyped(meta: dict) -> str | None:
    """What in the totals or hardware is of the wrong kind, or None."""
    t = meta["totals"]
    for k in _TOTAL_NUMBERS:
        if t.get(k) is not None and not _is_number(t[k]):
            return f"its totals' {k} is a {type(t[k]).__name__}, not a number"
    for g, keys in _TOTAL_GROUPS.items():
        v = t.get(g)
        if v is None and g == "time_us":
            continue
        if not isinstance(v, dict):
            return f"its totals' {g} is {'missing' if v is None else 'a ' + type(v).__name__}, not an object"
        bad = [k for k in keys if v.get(k) is not None and not _is_number(v[k])]
        if bad or (g == "flops" and any(k not in v for k in keys)):
            return f"its totals' {g} lack a number for {', '.join(bad or keys)}"
    hw = meta.get("hardware") or {}
    for k, kind in _HARDWARE.items():
        if hw.get(k) is not None and (not isinstance(hw[k], kind) or isinstance(hw[k], bool)):
            return f"its hardware's {k} is a {type(hw[k]).__name__}"
    return None


def _in_range(v) -> bool:
    return v is None or (math.isfinite(v) and v >= 0)


def _ranged_totals(t: Totals, notes: list[str]) -> Totals:
    """The totals with each negative or non-finite number the job view reads left unknown (None), each said in
    `notes`."""
    changes: dict[str, Any] = {}
    for k in _TOTAL_NUMBERS:
        v = getattr(t, k)
        if not _in_range(v):
            notes.append(f"the summary's totals' {k} {v!r} is not a finite number from 0 (ignored)")
            changes[k] = None  # wall_us too: unknown, as the summary's other out-of-range numbers
    for g, keys in _TOTAL_GROUPS.items():
        group = getattr(t, g)
        if isinstance(group, dict):
            bad = [k for k in keys if not _in_range(group.get(k))]
            for k in bad:
                notes.append(f"the summary's totals' {g}.{k} {group[k]!r} is not a finite number from 0 (ignored)")
            if bad:
                changes[g] = {**group, **dict.fromkeys(bad)}
    return replace(t, **changes) if changes else t


_SECTIONS = {"hardware": Hardware, "model": ModelSection, "totals": Totals}


def _sections(meta: dict, path) -> dict[str, Any]:
    """The stored hardware, model and totals decoded into their sections (None where stored as null); FormatError,
    naming the field at fault, when one does not read as its section."""
    out = {}
    for name, kind in _SECTIONS.items():
        v = meta.get(name)
        try:
            out[name] = None if v is None else decode(v, kind)
        except msgspec.ValidationError as e:
            raise FormatError(str(path), f"its {name} section does not read as one: {e}", _REDO) from None
    return out


def _advice(items) -> list[RankAdvice]:
    """The rank's stored advice headlines; an entry that is not one is left out (the headlines are a courtesy)."""
    out = []
    for a in items if isinstance(items, list) else []:
        try:
            out.append(decode(a, RankAdvice))
        except msgspec.ValidationError:
            continue
    return out


def _kind(column: str) -> tuple[str, tuple[type[pl.DataType], ...]]:
    if column in _TEXT:
        return "text", (pl.String,)
    if column in _FLAGS:
        return "true/false", (pl.Boolean,)
    if column in _WHOLE or column.startswith(_WHOLE_PREFIX):
        return "whole numbers", (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32)
    return "numbers", (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.Float32, pl.Float64)


def _typed(table: str, df: pl.DataFrame) -> pl.DataFrame:
    """`df` with every column of its kind (cast to the written type; all-null columns typed); `_Mistyped` says which is
    not.

    An empty table of any shape is an empty one of the kinds the job view reads.
    """
    if table == "communication":
        return df  # checked by `_communication`
    if df.height == 0:
        return pl.DataFrame(schema={c: _written(c) for c in _REQUIRED.get(table, ("step",))})
    missing = [c for c in _REQUIRED.get(table, ()) if c not in df.columns]
    if missing:
        raise _Mistyped(f"its {table} table has no {', '.join(missing)} column")
    casts = []
    for c, dtype in df.schema.items():
        what, kinds = _kind(c)
        if dtype == pl.Null:
            casts.append(pl.col(c).cast(_written(c)))
        elif not isinstance(dtype, kinds):
            raise _Mistyped(f"its {table} table's {c} column holds {dtype}, not {what}")
        elif what == "whole numbers" and dtype != pl.Int64:
            casts.append(pl.col(c).cast(pl.Int64))
    return df.with_columns(casts) if casts else df


def _written(column: str) -> type[pl.DataType]:
    what, _ = _kind(column)
    return {"text": pl.String, "true/false": pl.Boolean, "whole numbers": pl.Int64}.get(what, pl.Float64)


def read_summary(path: str | Path | BinaryIO, name: str | None = None) -> RankSummary:
    """A `.tfsum` back, bounded (bytes inflated, rows per table) and checked field by field: FormatError when tampered
    with.

    Types are checked (a value of the wrong kind is a FormatError), numbers range-checked as a trace's are
    (a rank or world size out of range, a negative or non-finite total: left unknown, with a warning).
    """
    where = name or str(path)
    tables, meta = read_bundle(path, max_bytes=MAX_SUMMARY_BYTES, max_rows=MAX_SUMMARY_ROWS, name=name)
    why = _tampered(meta, tables) or _mistyped(meta)
    if why is not None:
        raise FormatError(where, why, _REDO)
    try:
        tables = {t: _typed(t, df) for t, df in tables.items()}
    except _Mistyped as e:
        raise FormatError(where, str(e), _REDO) from None
    sections = _sections(meta, where)
    notes: list[str] = []
    rank, world = usable_ranks(meta.get("rank"), meta.get("world_size"), "the summary's", notes)
    totals = _ranged_totals(sections["totals"], notes)
    return RankSummary(
        rank=rank,
        world_size=world,
        path=meta.get("path") or where,
        hardware=sections["hardware"],
        model=sections["model"],
        steps=tables["steps"],
        collectives=tables["collectives"],
        idle=tables["idle"]
        if tables["idle"].width
        else pl.DataFrame(schema={"step": pl.Int64, "reason": pl.Utf8, "dur": pl.Float64}),
        totals=totals,
        warnings=[*notes, *(meta.get("warnings") or [])],
        path_comm=tables["path_comm"]
        if {"step", "start", "end"} <= set(tables.get("path_comm", pl.DataFrame()).columns)
        else None,
        advice=_advice(meta.get("advice")),
        communication=_communication(tables.get("communication"), where),
    )


_COMMUNICATION = {c: {"str": pl.Utf8, "int": pl.Int64, "float": pl.Float64}[t] for c, t in COMMUNICATION_SCHEMA.items()}


def _communication(t: pl.DataFrame | None, path) -> pl.DataFrame | None:
    """A summary's communication table, its columns of the types written (FormatError when not); None when absent
    (a summary written before it was kept)."""
    if t is None:
        return None
    if any(c not in t.columns or t[c].dtype != d for c, d in _COMMUNICATION.items()):
        raise FormatError(str(path), "its communication table lacks a column or has one of another type", _REDO)
    return t.select(list(_COMMUNICATION))
