"""The decoded XSpace (planes, lines, events, metadata) as dataclasses: what the XSpace reader returns.

Why apart: the parser (`parse`, `scan`, `gpu`, `tpu`) and the HLO analysis (`hlo_facts`)
depend on these objects only, not on how the wire format is read (`xspace_python`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class XEventMetadata:
    id: int
    name: str = ""
    display_name: str = ""
    metadata: bytes = b""
    stats: dict[str, Any] = field(default_factory=dict)
    child_id: list[int] = field(default_factory=list)


@dataclass(slots=True)
class XEvent:
    metadata_id: int
    offset_ps: int
    num_occurrences: int
    duration_ps: int
    stats: dict[str, Any] | None  # None when the event has none


@dataclass(slots=True)
class XLine:
    id: int = 0
    display_id: int = 0
    name: str = ""
    display_name: str = ""
    timestamp_ns: int = 0
    duration_ps: int = 0
    events: list[XEvent] = field(default_factory=list)


@dataclass(slots=True)
class XPlane:
    id: int = 0
    name: str = ""
    lines: list[XLine] = field(default_factory=list)
    event_metadata: dict[int, XEventMetadata] = field(default_factory=dict)
    stat_metadata: dict[int, str] = field(default_factory=dict)  # id -> name
    stat_descriptions: dict[int, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    unknown_stats: int = 0  # stats whose metadata id is not in stat_metadata


@dataclass(slots=True)
class XSpace:
    planes: list[XPlane] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
