"""Reading XSpace events: timestamps in µs, a stat with its metadata's as fallback, name stacks, line and device ids.

Why apart: every builder (host scan, TPU ops, GPU resolution) reads events the same
way; these helpers hold no state and build no rows.
"""

from __future__ import annotations

import re
from typing import Any

from traceflops.parsers.xla.xspace_model import XPlane

DEVICE = re.compile(r"^/device:(GPU|TPU):(\d+)$")


def us(line_ts_ns: int, offset_ps: int, base_ns: int) -> float:
    return ((line_ts_ns - base_ns) * 1000 + offset_ps) / 1e6


def stat(ev_stats: dict | None, md_stats: dict, key: str) -> Any:
    if ev_stats is not None:
        v = ev_stats.get(key)
        if v is not None:
            return v
    return md_stats.get(key)


def tf_scope(v: Any) -> str | None:
    """Name stack from a `tf_op` stat ('jit(f)/jit(main)/add:' → 'jit(f)/jit(main)/add')."""
    if not isinstance(v, str) or not v or v == "XlaModule:":
        return None
    return v.removesuffix(":")


def plane_device(name: str) -> int | None:
    m = DEVICE.match(name)
    return int(m.group(2)) if m else None


def line_names(plane: XPlane) -> dict[int, str]:
    """A unique tid per line: its name, disambiguated by id when two lines share one."""
    seen: dict[str, int] = {}
    for ln in plane.lines:
        seen[ln.name] = seen.get(ln.name, 0) + 1
    return {
        id(ln): (ln.name or str(ln.id)) if seen[ln.name] == 1 and ln.name else f"{ln.name or 'line'}#{ln.id}"
        for ln in plane.lines
    }
