"""Each collective's share of the step time it exposed and of the time compute hid, cut from the sweep's segments."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.stages.sweep import COLLECTIVE, Sweep, labels, sweep, usable


def comm_exposure(kernels: pl.DataFrame, steps: pl.DataFrame, swept: Sweep | None = None) -> pl.DataFrame:
    """Each communication activity's share of the step time it exposed and of the time compute hid, µs.

    The partition's `communication_exposed` and `communication_overlapped` are
    cut among the communication activities active in each segment, evenly (two
    concurrent collectives each get half), so the shares of a step's
    collectives add up to its partition totals. Returns one row per
    communication row of `kernels` (its position among them as `row`) and its
    shares of `communication_total`, `_exposed` and `_overlapped`: `total`,
    `exposed` and `overlapped` (the rest of `total` ran under a memcpy). `swept`: `sweep(kernels, steps)` where
    the caller already has it (its pairs index the usable kernels, in order, as here).
    """
    k = kernels.with_columns(row=pl.int_range(pl.len(), dtype=pl.Int64))
    k = usable(k)
    comm = (k["cls"] == "communication").to_numpy() if k.height else np.zeros(0, bool)
    empty = pl.DataFrame(schema={"row": pl.Int64, "total": pl.Float64, "exposed": pl.Float64, "overlapped": pl.Float64})
    if not comm.any():
        return empty
    s = sweep(k, steps) if swept is None else swept
    c = s.count > 0
    # a collective active shares the segment with the others active; a wait (the thread blocked on one) only
    # keeps what no collective in flight takes
    waits = ~c[:, COLLECTIVE]
    n = np.where(waits, np.maximum(s.count[:, 3], 1), np.maximum(s.count[:, COLLECTIVE], 1))
    label = labels(s.count)
    measures = [c[:, 3], label == 3, c[:, 3] & (c[:, 0] | c[:, 1])]
    # The communication activities' (pair, segment-range) entries only: every other pair is read for nothing.
    mine = np.flatnonzero(comm[s.pair])
    pair, first, stop = s.pair[mine], s.first[mine], s.stop[mine]
    is_wait = ~s.columns[pair, COLLECTIVE]
    out = {}
    for name, m in zip(("total", "exposed", "overlapped"), measures):  # a loop over three measures, not events
        share = np.where(m, s.length, 0.0) / n
        for_all = np.r_[0.0, np.cumsum(share)]
        for_waits = np.r_[0.0, np.cumsum(np.where(waits, share, 0.0))] if is_wait.any() else for_all
        out[name] = np.where(is_wait, for_waits[stop] - for_waits[first], for_all[stop] - for_all[first])
    rows = k["row"].to_numpy()[pair]
    return (
        pl.DataFrame({"row": rows, **out})
        .group_by("row")
        .agg(pl.col("total", "exposed", "overlapped").sum())
        .sort("row")
    )


def with_comm_exposure(
    frame: pl.DataFrame, activities: pl.DataFrame, steps: pl.DataFrame, by_op: bool, swept: Sweep | None = None
) -> pl.DataFrame:
    """`frame` (the kernels, or on a CPU trace the ops) with each communication row's `comm_exposed` and
    `comm_overlapped` µs (`comm_exposure`); activities are the frame's rows themselves, or ops by `op_row`."""
    e = comm_exposure(activities, steps, swept)
    if by_op:
        e = (
            e.join(
                activities.select("op_row").with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)), on="row"
            )
            .group_by("op_row")
            .agg(pl.col("exposed", "overlapped").sum())
            .rename({"op_row": "row"})
        )
    exposed = np.full(frame.height, np.nan)
    overlapped = np.full(frame.height, np.nan)
    at = e["row"].to_numpy()
    exposed[at], overlapped[at] = e["exposed"].to_numpy(), e["overlapped"].to_numpy()
    return frame.with_columns(
        comm_exposed=pl.Series(exposed).fill_nan(None), comm_overlapped=pl.Series(overlapped).fill_nan(None)
    )
