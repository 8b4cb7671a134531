"""Where device time went, per device and step: the exact partition of each window, its overlays, and the
devices that ran the program.

The interval algebra is the sweep's (`stages.sweep`); each collective's exposed share is `stages.comm_exposure`,
idle gaps and their reasons `stages.idle`, a CPU trace's activities `stages.cpu_activities`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.errors import ConservationError
from traceflops.core.vocab import PARTITION
from traceflops.stages.sweep import MM_KNOWN, MM_UNKNOWN, RECOMPUTE, Sweep, group_frame, group_sums, labels, sweep


def partition(kernels: pl.DataFrame, steps: pl.DataFrame, swept: Sweep | None = None) -> pl.DataFrame:
    """Per (device, step): the window cut into exclusive classes, plus overlays.

    Partition columns (µs, summing to `window`): matmul > other_compute >
    memcpy (memcpy and memset) > communication_exposed > idle, each instant
    going to the highest-priority class active on any stream of the device.
    Overlays (µs, not part of the sum):
      communication_overlapped: communication under matmul or other compute;
      communication_total: all communication (exposed + overlapped + under memcpy);
      recompute: time when a recompute-phase compute kernel runs (within compute);
      matmul_known / matmul_unknown: the matmul time, each segment split by the
        number of active matmul kernels with known and unknown FLOPs, so that
        each kernel gets the share of the matmul time it covers (its duration
        when matmuls do not overlap); they sum to `matmul`.
    `swept`: `sweep(kernels, steps)` where the caller already has it.
    """
    s = sweep(kernels, steps) if swept is None else swept
    label = labels(s.count)
    nw = len(s.windows.start)
    ng = len(s.devices) * nw
    parts = np.bincount(s.group * 5 + label, weights=s.length, minlength=ng * 5).reshape(ng, 5)
    c = s.count > 0
    compute = c[:, 0] | c[:, 1]
    mm = np.maximum(s.count[:, MM_KNOWN] + s.count[:, MM_UNKNOWN], 1)
    in_mm = np.where(label == 0, s.length, 0.0)
    cols = {name: parts[:, i] for i, name in enumerate(PARTITION)}
    cols.update(
        communication_overlapped=group_sums(s, np.where(c[:, 3] & compute, s.length, 0.0)),
        communication_total=group_sums(s, np.where(c[:, 3], s.length, 0.0)),
        recompute=group_sums(s, np.where(c[:, RECOMPUTE], s.length, 0.0)),
        matmul_known=group_sums(s, in_mm * s.count[:, MM_KNOWN] / mm),
        matmul_unknown=group_sums(s, in_mm * s.count[:, MM_UNKNOWN] / mm),
    )
    out = group_frame(s, cols)
    check_partition(out)
    return out


def check_partition(frame: pl.DataFrame, rel: float = 1e-6) -> None:
    """Raise if any row's partition does not add up to its window.

    The sweep makes this hold by construction; the check guards the
    construction, since every later number (the loss budget) relies on it.
    """
    total = pl.sum_horizontal([pl.col(c) for c in PARTITION])
    err = frame.select(
        bad=((total - pl.col("window")).abs() > rel * pl.max_horizontal(pl.col("window"), pl.lit(1.0))).any(),
        split=(
            (pl.col("matmul_known") + pl.col("matmul_unknown") - pl.col("matmul")).abs()
            > rel * pl.max_horizontal(pl.col("window"), pl.lit(1.0))
        ).any(),
    )
    if frame.height and (err["bad"][0] or err["split"][0]):
        raise ConservationError(
            "time partition",
            "time partition does not sum to the step window; this is a bug in traceflops.stages.timeline",
        )


PROGRAM_SHARE = (
    0.5  # a device busy for less than this share of the busiest one ran other work (initialization, a side program)
)


def program_devices(part: pl.DataFrame, activities: pl.DataFrame | None = None) -> list:
    """The devices that ran the program: the busiest, and every device busy at least PROGRAM_SHARE as long or, given
    the `activities` the partition was made of, that ran at least PROGRAM_SHARE as many compute activities in its
    steps as any device did (a JAX process drives all its chips, or all its XLA:CPU devices; a PyTorch rank one
    device). Busy time alone would leave out a device of the program: the device that reaches a collective first
    waits there for the last, and XLA:CPU's devices share the host's cores, so one device's ops may run twice as long
    as another's; the same program runs as many compute ops on each (copies do not count: a device that only took
    transfers ran no program). A CPU trace's one 'device' is None."""
    busy = (pl.col("window") - pl.col("idle")).sum().alias("_busy")
    dev = part.group_by("device").agg(busy).sort("_busy", "device", descending=[True, False], nulls_last=True)
    if dev.height == 0:
        return [None]
    top = dev["_busy"][0] or 0.0
    if top <= 0:
        return dev.head(1)["device"].to_list()
    keep = pl.col("_busy") >= PROGRAM_SHARE * top
    if activities is not None and activities.height and dev.height > 1:
        ran = (
            activities.filter(
                pl.col("step").is_in(part["step"].unique().to_list()) & pl.col("cls").is_in(["matmul", "other_compute"])
            )
            .group_by("device")
            .agg(pl.len().alias("_n"))
        )
        dev = dev.join(ran, on="device", how="left", nulls_equal=True, maintain_order="left")
        most = dev["_n"].max() or 0
        if most:
            keep = keep | (pl.col("_n").fill_null(0) >= PROGRAM_SHARE * most)  # type: ignore[operator]  # polars' stub
    return dev.filter(keep)["device"].to_list()


def on_devices(frame: pl.DataFrame, devices: list) -> pl.DataFrame:
    """The rows of these devices (None matches rows without a device id)."""
    if "device" not in frame.columns:
        return frame
    known = [d for d in devices if d is not None]
    sel = pl.col("device").is_in(known) if known else pl.lit(False)
    if None in devices:
        sel = sel | pl.col("device").is_null()
    return frame.filter(sel)
