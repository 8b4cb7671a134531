"""The JSON report contract (`schema: traceflops.report/1`)."""

from __future__ import annotations

from typing import Any

import orjson

from traceflops.core.contract import rank_record, step_record
from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis

SCHEMA = "traceflops.report/1"


def _num(v):
    if v is None:
        return None
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2**63 else f


def _rows(df, n: int) -> list[dict[str, Any]] | None:
    return None if df is None else df.head(n).to_dicts()


def step_rows(a: Analysis) -> list[dict[str, Any]]:
    rank = a.meta.get("rank")
    rows = []
    for s in a.steps.iter_rows(named=True):
        row = step_record(s, rank)
        row["model_flops"] = _num(row["model_flops"])
        rows.append(row)
    return rows


def to_dict(a: Analysis) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "inputs": [
            {
                "path": path_text(a.meta.get("path")),
                "format": a.meta.get("format"),
                "rank": a.meta.get("rank"),
                "world_size": a.meta.get("world_size"),
                "device": (a.hardware or {}).get("name"),
            }
        ],
        "hardware": a.hardware,
        "model": a.model,
        "steps": step_rows(a),
        "ranks": [rank_record(a.meta.get("rank"), path_text(a.meta.get("path")), a.totals)],
        "outside_steps": a.outside_steps,
        "top_kernels": _rows(a.top_kernels, 20),
        "modules": _rows(a.by_module, 50),
        "idle_gaps_by_reason": a.totals.get("idle_us_by_reason"),
        "advice": a.advice,
        "step_stats": a.step_stats,
        "critical_path": a.path_summary,
        "gemm_shapes": _rows(a.by_gemm_shape, 30),
        "totals": a.totals,
        "warnings": a.warnings,
    }


def render(a: Analysis) -> str:
    return orjson.dumps(to_dict(a), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
