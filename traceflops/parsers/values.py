"""Loose trace values to typed ones: traces write numbers as ints, floats or strings."""

from __future__ import annotations

from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _whole(v: Any) -> int | None:
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


def as_int(v: Any) -> int | None:
    """An integer from an int, an integral float or a numeric string; None otherwise (bools too).

    None beyond int64 too (a uint64 stat of 2**64-1, a double of 1e300): no column holds it, and no id,
    ordinal or step number is that large.
    """
    n = _whole(v)
    return n if n is not None and INT64_MIN <= n <= INT64_MAX else None


def as_count(v: Any) -> int | None:
    """A FLOP or byte count as `as_int` reads it, but one beyond int64 is kept at the int64 bound.

    So the count stage's range check says it is out of range (a corrupt or hostile count, with a warning)
    instead of taking it for a missing one.
    """
    n = _whole(v)
    return None if n is None else max(INT64_MIN, min(n, INT64_MAX))
