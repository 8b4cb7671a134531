"""The analysis as flat tables: parquet and CSV files, or a dict of frames (notebooks).

Pure reshaping of an `Analysis` (or a `Job`): no new metric is computed here.
Each table is written twice, `NAME.parquet` and `NAME.csv`. Parquet keeps
nested list columns; CSV cannot hold them, so there list and struct columns
are JSON text. Object columns (a step's `loss_budget` dict) are JSON text in
both. Row counts are the frames' own.

A CSV text cell that a spreadsheet would run as a formula (one starting with
`=`, `+`, `-`, `@`, a tab or a carriage return: a kernel named
`=HYPERLINK(...)`) is written with a leading `'`, as OWASP advises; number
columns are written as numbers. Control characters in a CSV text cell (an
escape sequence, a bidi override) are shown as the terminal shows them
(`core.fmt.printable`). Parquet keeps every value as it is.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import polars as pl

from traceflops.core import fmt
from traceflops.core.files import write_file
from traceflops.core.results import Analysis
from traceflops.core.sections import json_default

# every table a report can write, one analysis's and a job's (`frames`, `job_frames`)
TABLE_NAMES = (
    "kernels",
    "ops",
    "steps",
    "partition",
    "idle_gaps",
    "launch_stats",
    "collectives",
    "roofline",
    "top_kernels",
    "by_kernel",
    "by_module",
    "ranks",
    "job_steps",
    "rank_steps",
    "stragglers",
    "pipeline",
)

# --- per-kernel frames (computed by the analysis; None on a CPU-only trace) ---


def roofline_frame(a: Analysis) -> pl.DataFrame | None:
    """Per kernel: intensity, achieved fractions, bound, recoverable time."""
    return a.roofline


def top_kernels_frame(a: Analysis) -> pl.DataFrame | None:
    """Kernel names ranked by recoverable time."""
    return a.top_kernels


def by_kernel_frame(a: Analysis) -> pl.DataFrame | None:
    """Per kernel name: count, time, share, FLOPs, TFLOP/s."""
    return a.by_kernel


def by_module_frame(a: Analysis) -> pl.DataFrame | None:
    """Per module: time and FLOPs by phase, recompute share."""
    return a.by_module


def collectives_frame(a: Analysis) -> pl.DataFrame | None:
    """Communication kernels with group, kind, payload (job.collectives); None on a CPU trace."""
    if a.kernels is None or a.kernels.height == 0:
        return None
    return a.collectives


# --- frames -----------------------------------------------------------------


def frames(a: Analysis) -> dict[str, pl.DataFrame]:
    """Every table of one analysis, by name (absent ones left out)."""
    out: dict[str, pl.DataFrame | None] = {
        "kernels": a.kernels,
        "ops": a.ops,
        "steps": a.steps,
        "partition": a.partition,
        "idle_gaps": a.idle_gaps,
        "launch_stats": a.launch_stats,
        "collectives": collectives_frame(a),
        "roofline": roofline_frame(a),
        "top_kernels": top_kernels_frame(a),
        "by_kernel": by_kernel_frame(a),
        "by_module": by_module_frame(a),
    }
    return {k: v for k, v in out.items() if v is not None}


def job_frames(job) -> dict[str, pl.DataFrame]:
    """Every table of a `Job` (many ranks), by name."""
    steps = [s.steps.with_columns(rank=pl.lit(s.rank, pl.Int64)) for s in job.summaries]
    out: dict[str, pl.DataFrame | None] = {
        "ranks": job.ranks,
        "job_steps": job.steps,
        "rank_steps": pl.concat(steps, how="diagonal_relaxed") if steps else None,
        "collectives": job.collectives,
        "stragglers": job.stragglers,
        "pipeline": job.pipeline,
    }
    return {k: v for k, v in out.items() if v is not None}


# --- serialization ----------------------------------------------------------


def _json_text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, pl.Series):
        v = v.to_list()
    return orjson.dumps(v, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def flat(df: pl.DataFrame, *, nested: bool) -> pl.DataFrame:
    """Object columns to JSON text; also list/struct/array columns unless `nested` (parquet keeps them)."""
    cols = []
    for name, dtype in df.schema.items():
        is_obj = dtype == pl.Object
        is_nested = isinstance(dtype, (pl.List, pl.Struct, pl.Array))
        if is_obj or (is_nested and not nested):
            values = [_json_text(v) for v in df[name].to_list()]
            cols.append(pl.Series(name, values, dtype=pl.Utf8))
        elif dtype == pl.Null:
            cols.append(df[name].cast(pl.Utf8))
        else:
            cols.append(df[name])
    return pl.DataFrame(cols) if cols else df


FORMULA_START = r"^[=+\-@\t\r]"  # what a spreadsheet reads as the start of a formula


def printable_cells(df: pl.DataFrame) -> pl.DataFrame:
    """Text columns with control characters shown as the terminal shows them (`core.fmt.printable`: `\\x1b`), decided
    once
    per distinct value; other columns, and a column without one, as they are."""
    out = []
    for n, t in df.schema.items():
        if t != pl.Utf8:
            continue
        changed = {v: p for v in df[n].drop_nulls().unique().to_list() if (p := fmt.printable(v)) != v}
        if changed:
            out.append(df[n].replace(changed))
    return df.with_columns(out) if out else df


def spreadsheet_safe(df: pl.DataFrame) -> pl.DataFrame:
    """A CSV's cells: control characters visible (`printable_cells`), a `'` before any text cell a spreadsheet would
    evaluate; other columns as they are."""
    df = printable_cells(df)
    text = [n for n, t in df.schema.items() if t in (pl.Utf8, pl.Categorical) or isinstance(t, pl.Enum)]
    guarded = (
        pl.when(pl.col(n).cast(pl.Utf8).str.contains(FORMULA_START))
        .then(pl.lit("'") + pl.col(n).cast(pl.Utf8))
        .otherwise(pl.col(n).cast(pl.Utf8))
        .alias(n)
        for n in text
    )
    return df.with_columns(guarded) if text else df


def table_files(directory: str | os.PathLike) -> list[Path]:
    """Every file `write_frames` may write in `directory`, whichever tables a report has."""
    d = Path(directory)
    return [d / f"{name}.{ext}" for name in TABLE_NAMES for ext in ("parquet", "csv")]


def _write_parquet(df: pl.DataFrame, f: BinaryIO) -> None:
    flat(df, nested=True).write_parquet(f)


def _write_csv(df: pl.DataFrame, f: BinaryIO) -> None:
    spreadsheet_safe(flat(df, nested=False)).write_csv(f)


def write_frames(named: dict[str, pl.DataFrame], directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Write each frame as NAME.parquet and NAME.csv under `directory` (created if needed).

    Returns {name: {"rows", "parquet", "csv"}}.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Any]] = {}
    for name, df in named.items():
        pq, csv = d / f"{name}.parquet", d / f"{name}.csv"
        write_file(pq, partial(_write_parquet, df))
        write_file(csv, partial(_write_csv, df))
        written[name] = {"rows": df.height, "parquet": str(pq), "csv": str(csv)}
    return written


def write_tables(analysis: Analysis, directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """kernels, ops, steps, partition, idle gaps, launch stats, collectives, roofline and roll-ups."""
    return write_frames(frames(analysis), directory)


def write_job_tables(job, directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """ranks, job steps, per-rank steps, matched collectives, stragglers, pipeline bubbles."""
    return write_frames(job_frames(job), directory)
