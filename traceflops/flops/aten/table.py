"""The registration table each formula module fills beside its formulas, and what one registration holds.

Formulas register where they are defined, but the lookup must see them all and refuse a second formula for
one op; so each module records its registrations, in order, in its own FormulaTable and registry merges them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traceflops.flops.aten.shapes import Args, R

Formula = Callable[[Args, Any], R]


@dataclass(frozen=True)
class Entry:
    fn: Formula
    primary: int = 0  # argument whose dtype is the compute dtype
    attention: bool = False


class FormulaTable:
    """One module's registrations, in order: (qualified, names, fn, primary, attention).

    aten: names without a namespace, registered as "aten::<name>"; ns: fully qualified names ("aiter::mha_fwd").
    registry checks and merges them (a second formula for one op is refused there).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[bool, Any, Formula, int, bool]] = []

    def aten(self, names, fn: Formula, primary: int = 0, attention: bool = False) -> None:
        self.rows.append((False, names, fn, primary, attention))

    def ns(self, names, fn: Formula, primary: int = 0, attention: bool = False) -> None:
        self.rows.append((True, names, fn, primary, attention))
