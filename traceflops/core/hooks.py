"""Where the package's top hands the lowest layer its notebook conveniences.

`Analysis.to_html()`, `.to_dict()`, `.to_pandas()` and `_repr_html_()` are
renderers' and the notebook API's work, layers above `core`. `traceflops/__init__.py`
(imported before any module of the package) fills `NOTEBOOK` with thin
functions that import those layers when called, so `core` calls up without
importing up. Nothing else is kept here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NOTEBOOK: dict[str, Callable[..., Any]] = {}


def notebook(name: str) -> Callable[..., Any]:
    """The registered function `name` (`to_html`, `to_dict`, `to_pandas`, `html_card`)."""
    try:
        return NOTEBOOK[name]
    except KeyError:  # only a copy of core without the package's top gets here
        raise RuntimeError(f"{name} needs the traceflops package (import traceflops)") from None
