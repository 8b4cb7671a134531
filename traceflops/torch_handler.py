"""`traceflops[torch]`: analyse each profiling cycle as it ends, from inside the training script.

    from traceflops.torch_handler import on_trace_ready
    with torch.profiler.profile(..., record_shapes=True,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                                on_trace_ready=on_trace_ready("traces/", params=..., layers=...)) as prof:
        for batch in loader:
            train_step(batch); prof.step()

The trace is written (gzipped) first, so nothing is lost if the analysis
fails; the analysis is printed (terminal report) and returned to `callback`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def on_trace_ready(
    out_dir: str | os.PathLike = ".",
    *,
    name: str = "trace",
    quiet: bool = False,
    callback: Callable[[Any], None] | None = None,
    **model: Any,
) -> Callable[[Any], None]:
    """A `torch.profiler` `on_trace_ready` handler; `model` takes `traceflops.api.analyze`'s options."""
    out = Path(out_dir)

    def handler(prof) -> None:
        out.mkdir(parents=True, exist_ok=True)
        rank = os.environ.get("RANK")
        stem = f"{name}_rank{rank}" if rank is not None else name
        path = out / f"{stem}_step{getattr(prof, 'step_num', 0)}.json.gz"
        prof.export_chrome_trace(str(path))  # torch gzips when the name ends in .gz
        from traceflops.api import analyze

        a = analyze(path, **model)
        if not quiet:
            from traceflops.report.formats import show

            show(a)
        if callback is not None:
            callback(a)

    return handler
