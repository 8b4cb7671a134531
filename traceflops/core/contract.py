"""The JSON report's row shapes, one for a single trace and a job alike (`schema/report.schema.json` validates them).

A step row is built from a step table's row: the Analysis's `steps`, or a rank
summary's (which carries the loss budget as `budget_<term>` columns, since a
summary is stored as parquet). Keys a source lacks are null, never absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from traceflops.core.vocab import OVERLAYS, PARTITION, PHASES

# A communication row (per dimension, phase and kind: views.collectives.by_dimension), as reports and summaries hold it.
COMMUNICATION_SCHEMA = {"role": "str", "phase": "str", "kind": "str", "calls": "int", "time_us": "float",
                        "exposed_us": "float", "overlapped_us": "float", "window_us": "float",
                        "exposed_share": "float", "overlapped_share": "float"}

BUDGET_PREFIX = "budget_"
PATH_PREFIX = "path_"


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def loss_budget(row: Mapping[str, Any], keys: list[str] | None = None) -> dict[str, float] | None:
    """The step's loss budget: a dict column (an Analysis) or `budget_<term>` columns (a rank summary)."""
    lb = row.get("loss_budget")
    if isinstance(lb, Mapping):
        return dict(lb)
    return _prefixed(row, BUDGET_PREFIX, keys)


def critical_path(row: Mapping[str, Any], keys: list[str] | None = None) -> dict[str, float] | None:
    """The step's critical path by kind (µs), from `path_<kind>` columns; None where the trace has none."""
    return _prefixed(row, PATH_PREFIX, keys)


def _prefixed(row: Mapping[str, Any], prefix: str, keys: list[str] | None = None) -> dict[str, Any] | None:
    """The row's `<prefix><name>` columns by name (`keys`: those columns, found once for a table's rows); None where
    there are none or all are null."""
    if keys is None:
        keys = [k for k in row if k.startswith(prefix)]
    got = {k[len(prefix):]: row[k] for k in keys}
    return got if got and any(v is not None for v in got.values()) else None


def step_records(rows: Iterable[Mapping[str, Any]], rank: int | None) -> list[dict[str, Any]]:
    """`step_record` of each row of one table (the same keys in every row): its prefixed columns found once."""
    out: list[dict[str, Any]] = []
    keys = None
    for s in rows:
        if keys is None:
            keys = ([k for k in s if k.startswith(BUDGET_PREFIX)], [k for k in s if k.startswith(PATH_PREFIX)])
        out.append(step_record(s, rank, keys))
    return out


def step_record(s: Mapping[str, Any], rank: int | None, keys: tuple[list[str], list[str]] | None = None) -> dict[str, Any]:
    """One step of one rank, as the report contract states it (`keys`: the table's budget_ and path_ columns)."""
    flops = {p: _int(s.get(f"flops_{p}")) for p in PHASES}
    flops["executed"] = _int(s.get("flops_executed"))
    counts = {p: _int(s.get(f"count_{p}")) for p in PHASES}
    return {
        "rank": rank,
        "step": s.get("step"),
        "name": s.get("name"),
        "start_us": s.get("start"),
        "dur_us": s.get("window"),
        "host_start_us": s.get("ts"),
        "host_dur_us": s.get("dur"),
        "window_source": s.get("window_source"),
        "last": None if s.get("last") is None else bool(s.get("last")),
        "flops": flops,
        "matmul_count": counts if any(v is not None for v in counts.values()) else None,
        "model_flops": None if s.get("model_flops") is None else float(s["model_flops"]),
        "mfu": s.get("mfu"),
        "mfu_no_attention": s.get("mfu_no_attention"),
        "hfu": s.get("hfu"),
        "time_us": {c: s.get(f"time_{c}") for c in PARTITION},
        "overlay_us": {c: s.get(f"time_{c}") for c in OVERLAYS},
        "loss_budget": loss_budget(s, keys and keys[0]),
        "critical_path_us": critical_path(s, keys and keys[1]),
        "launch": {
            "kernels": s.get("launch_kernels"),
            "median_kernel_us": s.get("launch_median_kernel_us"),
            "median_launch_to_start_us": s.get("launch_median_delay_us"),
        },
    }


def rank_record(rank: int | None, path: str | None, totals: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's whole-trace numbers, as the report contract states it (the single report's `ranks` too)."""
    flops = totals.get("flops") or {}
    return {
        "rank": rank,
        "path": path,
        "wall_us": totals.get("wall_us"),
        "device_mfu": totals.get("mfu"),
        "hfu": totals.get("hfu"),
        "flops": {k: _int(v) for k, v in flops.items()} or None,
        "time_us": totals.get("time_us"),
        "overlay_us": totals.get("overlay_us"),
        "loss_budget": totals.get("loss_budget"),
    }


def collective_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """One matched collective of a job, as the report contract states it: its row, with its group's description,
    role (`dp`, `tp`, ... from a `mesh_<dim>` description; `world` for the default group) and ranks always present
    (null where the trace does not say)."""
    out = {k: v for k, v in row.items() if k != "group_ranks"}
    for k in ("pg_desc", "role", "group_size"):
        out.setdefault(k, None)
    ranks = row.get("group_ranks")
    out["group_ranks"] = _ranks(ranks) if isinstance(ranks, str) else None
    return out


def _ranks(text: str) -> list[int] | None:
    inner = text.strip()
    if not (inner.startswith("[") and inner.endswith("]")):
        return None
    try:
        return [int(x) for x in inner[1:-1].split(",") if x.strip()] or None
    except ValueError:
        return None

