"""The JSON report contract (`schema: traceflops.report/1`)."""

from __future__ import annotations

from typing import Any

import orjson

from traceflops.core.results import Analysis
from traceflops.core.vocab import OVERLAYS, PARTITION, PHASES

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
        flops = {p: int(s[f"flops_{p}"]) for p in PHASES}
        flops["executed"] = int(s["flops_executed"])
        rows.append(
            {
                "rank": rank,
                "step": s["step"],
                "name": s["name"],
                "start_us": s["start"],
                "dur_us": s["window"],
                "host_start_us": s["ts"],
                "host_dur_us": s["dur"],
                "window_source": s["window_source"],
                "last": bool(s["last"]),
                "flops": flops,
                "matmul_count": {p: int(s[f"count_{p}"]) for p in PHASES},
                "model_flops": _num(s["model_flops"]),
                "mfu": s["mfu"],
                "mfu_no_attention": s["mfu_no_attention"],
                "hfu": s["hfu"],
                "time_us": {c: s.get(f"time_{c}") for c in PARTITION},
                "overlay_us": {c: s.get(f"time_{c}") for c in OVERLAYS},
                "loss_budget": s.get("loss_budget"),
                "launch": {
                    "kernels": s.get("launch_kernels"),
                    "median_kernel_us": s.get("launch_median_kernel_us"),
                    "median_launch_to_start_us": s.get("launch_median_delay_us"),
                },
            }
        )
    return rows


def to_dict(a: Analysis) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "inputs": [
            {
                "path": a.meta.get("path"),
                "format": a.meta.get("format"),
                "rank": a.meta.get("rank"),
                "world_size": a.meta.get("world_size"),
                "device": (a.hardware or {}).get("name"),
            }
        ],
        "hardware": a.hardware,
        "model": a.model,
        "steps": step_rows(a),
        "ranks": a.ranks,
        "outside_steps": a.outside_steps,
        "top_kernels": _rows(a.top_kernels, 20),
        "modules": _rows(a.by_module, 50),
        "idle_gaps_by_reason": a.totals.get("idle_us_by_reason"),
        "advice": a.advice,
        "step_stats": a.step_stats,
        "gemm_shapes": _rows(a.by_gemm_shape, 30),
        "totals": a.totals,
        "warnings": a.warnings,
    }


def render(a: Analysis) -> str:
    return orjson.dumps(to_dict(a), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
