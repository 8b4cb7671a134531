"""The critical path as the reports show it: per step what bounded it by kind, and the longest stretches by name.

Renderers read this; they compute nothing. Kinds are `stages.critical_path.KINDS`;
the unit is µs of step time (the path's length is the step's window).
"""

from __future__ import annotations

import polars as pl

from traceflops.core.results import Analysis
from traceflops.core.sections import UNSET, PathStep, PathStretch, PathSummary
from traceflops.stages.critical_path import KINDS, breakdown, top_segments

# What each kind of path segment means, in one line (reports and their explanations).
MEANING = {
    "host": "the host thread ran Python and framework code (named by the outermost op it ran)",
    "launch": "runtime launch calls and the latency until the device started the kernel",
    "device_matmul": "device matmul kernels back to back on the stream that ended the step",
    "device_other": "device non-matmul kernels on that chain",
    "memcpy": "copies and memsets on that chain",
    "communication": "collective kernels on that chain (transfer and waiting for other ranks together, in one trace)",
    "sync": "the host blocked in a synchronising call, or a stream waited for another stream",
    "idle": "nothing recorded explains the wait (no launch, stream or sync edge)",
}

NOT_AVAILABLE = (
    "no device activities: a CPU-only trace (PyTorch on CPU, XLA:CPU) runs on the host threads alone, "
    "so there is no host → device chain to follow"
)
NOT_CAPTURED = (
    "no device activity in the capture (a device job profiled without its device activity): no host → "
    "device chain to follow"
)


def path_summary(a: Analysis, exclude_steps=None, top: int = 5) -> PathSummary:
    """`available`, the totals by kind over the steps, and per step its kinds and top segments (steps left out: by
    default those the analysis' totals left out)."""
    if exclude_steps is None:
        exclude_steps = tuple(a.totals.step_count.excluded)
    seg = a.critical_path
    if seg is None or seg.height == 0:
        return PathSummary(available=False, why=NOT_AVAILABLE)
    seg = seg.filter(~pl.col("step").is_in(list(exclude_steps)))
    per = breakdown(seg)
    tops = top_segments(seg, top)
    top_of: dict = {}  # the rows are the report's: one pass over them, not a filter per step
    for s, k, n, d, c in tops.select("step", "kind", "name", "dur", "segments").iter_rows():
        top_of.setdefault(s, []).append(PathStretch(kind=k, name=n, us=d, segments=c))
    steps = [
        PathStep(
            step=row["step"], length_us=row["length"], us={k: row[k] for k in KINDS}, top=top_of.get(row["step"], [])
        )
        for row in per.iter_rows(named=True)
    ]
    total = {k: float(per[k].sum()) for k in KINDS}
    length = sum(total.values())
    overall = top_segments(seg.with_columns(step=pl.lit(0, pl.Int64)), top)
    tpu = not (seg["kind"].is_in(["host", "launch"])).any() and a.meta.get("format") == "xplane"
    return PathSummary(
        available=True,
        us=dict(total),  # (a dict of float | None, as the section types it)
        share={k: (v / length if length else None) for k, v in total.items()},
        top=[
            PathStretch(kind=k, name=n, us=d, segments=c)
            for k, n, d, c in overall.select("kind", "name", "dur", "segments").iter_rows()
        ],
        steps=steps,
        meaning=dict(MEANING),
        note="the profile records no host launches for these devices (TPU): the path runs on the devices' op lines only"
        if tpu
        else UNSET,
    )
