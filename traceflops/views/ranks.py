"""Which rank each summary is: ranks assigned where a trace names none, one rank given twice counted once, and the
ranks missing from the job."""

from __future__ import annotations

from dataclasses import replace

from traceflops.core.errors import InputError
from traceflops.core.results import RankSummary


def rank_of(s: RankSummary) -> int:
    """The rank of a summary that `assign_ranks` returned: each has one."""
    assert s.rank is not None, "a summary the job view reads has a rank (assign_ranks)"
    return s.rank


def assign_ranks(summaries: list[RankSummary], warnings: list[str]) -> list[RankSummary]:
    """The summaries by rank; one without a rank gets the lowest free one (a new summary, with a warning)."""
    used = {s.rank for s in summaries if s.rank is not None}
    nxt = 0
    ranked = []
    for s in summaries:
        if s.rank is None:
            while nxt in used:
                nxt += 1
            s = replace(s, rank=nxt)
            used.add(nxt)
            warnings.append(f"{s.path}: no rank in the trace or its name; assumed rank {nxt}")
        ranked.append(s)
    seen: dict[int, RankSummary] = {}
    for s in ranked:
        first = seen.setdefault(rank_of(s), s)
        if first is s:
            continue
        if not same_numbers(first, s):
            raise InputError(
                s.path,
                f"rank {s.rank} is also given by {first.path}, with different numbers",
                "pass each rank's trace once",
            )
        warnings.append(f"{s.path}: the same rank {s.rank} trace as {first.path}; counted once")
    return sorted(seen.values(), key=rank_of)


def same_numbers(a: RankSummary, b: RankSummary) -> bool:
    """Two summaries of one capture (a file given twice, or `rank0.json` beside `rank0.json.gz`)."""
    x, y = a.totals, b.totals
    return (x.flops, x.wall_us, x.time_us) == (y.flops, y.wall_us, y.time_us) and a.steps.equals(b.steps)


def missing_ranks(world: int, ranks: list[int], show: int = 20) -> tuple[int, list[int]] | None:
    """How many of ranks 0..world-1 are absent, and the first few: without building a set of the whole world."""
    present = {r for r in ranks if 0 <= r < world}
    count = world - len(present)
    if count <= 0:
        return None
    first: list[int] = []
    r = 0
    while len(first) < min(show, count):
        if r not in present:
            first.append(r)
        r += 1
    return count, first
