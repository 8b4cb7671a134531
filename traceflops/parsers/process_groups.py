"""The process groups of a Kineto trace's `distributedInfo.pg_config` (`process_groups`): each group's name,
description, size, global ranks and backend, what is unusable counted and left out.
"""

from __future__ import annotations

from typing import Any

import orjson

from traceflops.core.trace import Warnings
from traceflops.core.vocab import MAX_RANKS
from traceflops.parsers.values import as_int as _int

MAX_GROUPS = 1 << 14  # process groups read from pg_config (a real job has tens; b200's 71)
MAX_GROUP_TEXT = 256  # characters of a group's name, description or backend
MAX_LISTED_RANKS = 1 << 16  # a group's ranks kept when listed; a longer list keeps only its size


def _group_ranks(v: Any) -> list[int] | None:
    """A group's global ranks: a list of whole numbers in [0, MAX_RANKS), or its JSON text ("[0, 1]"); None
    otherwise."""
    if isinstance(v, str):
        if len(v) > 16 * MAX_LISTED_RANKS:
            return None
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(v, list) or len(v) > MAX_LISTED_RANKS:
        return None
    out = [x for x in map(_int, v) if x is not None and 0 <= x < MAX_RANKS]
    if len(out) != len(v) or len(set(out)) != len(out):
        return None
    return out


def _group_text(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    return v if isinstance(v, str) and 0 < len(v) <= MAX_GROUP_TEXT else None


def process_groups(config: Any, warnings: Warnings) -> list[dict[str, Any]]:
    """The process groups `distributedInfo.pg_config` lists, in its order (the order they were created).

    Each: name, description, size and global ranks; `backend` as configured
    (`cpu:gloo,cuda:gloo`). A list of entries or a mapping of name to entry
    (the flight recorder's form) is read; an entry without a usable name, a
    size outside 1..MAX_RANKS, ranks that are not distinct ranks in range or
    do not number its size is left out, counted in a warning. At most
    MAX_GROUPS are read.
    """
    if isinstance(config, dict):
        config = [
            dict(v, pg_name=v.get("pg_name", v.get("name", k))) if isinstance(v, dict) else v for k, v in config.items()
        ]
    if not isinstance(config, list):
        if config is not None:
            warnings.add("distributedInfo pg_config is not a list of groups (ignored)")
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    bad = 0
    for x in config[:MAX_GROUPS]:
        if not isinstance(x, dict):
            bad += 1
            continue
        name = _group_text(x.get("pg_name"))
        size = _int(x.get("pg_size"))
        ranks = _group_ranks(x.get("ranks"))
        if size is None and ranks:
            size = len(ranks)
        listed = x.get("ranks") not in (None, "", [], "[]")
        if (
            name is None
            or name in seen
            or size is None
            or not 1 <= size <= MAX_RANKS
            or (listed and ranks is None and size <= MAX_LISTED_RANKS)
            or (ranks and len(ranks) != size)
        ):
            bad += 1
            continue
        seen.add(name)
        out.append(
            {
                "name": name,
                "desc": _group_text(x.get("pg_desc")),
                "size": size,
                "ranks": ranks or None,
                "backend": _group_text(x.get("backend_config")),
            }
        )
    warnings.add("distributedInfo pg_config entries without a usable name, size or ranks (ignored)", bad)
    warnings.add(
        f"distributedInfo pg_config lists more than {MAX_GROUPS} groups (the rest ignored)",
        int(len(config) > MAX_GROUPS),
    )
    return out
