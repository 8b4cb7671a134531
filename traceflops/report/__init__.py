"""Renderers of a finished `Analysis`, `Job` or diff: terminal, JSON, HTML, tables, the annotated trace. A renderer
computes nothing new."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET


def present(v: Any) -> Any:
    """A section's field as its key read: None where the source lacked it (`UNSET`, a key the report leaves out)."""
    return None if v is UNSET else v
