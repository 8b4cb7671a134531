"""Loose trace values to typed ones: traces write numbers as ints, floats or strings."""

from __future__ import annotations

from typing import Any


def as_int(v: Any) -> int | None:
    """An integer from an int, an integral float or a numeric string; None otherwise (bools too)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None
