"""Communication kernels as collectives: group, kind, payload bytes and order within the group, per trace."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceflops.core.dtypes import COLLECTIVE_ITEMSIZE
from traceflops.core.results import Analysis
from traceflops.core.trace import COLLECTIVE_COLUMNS
from traceflops.stages.link import nearest

P2P_RE = r"(?i)sendrecv|send_recv|ncclDevKernel_(Send|Recv)|ncclKernel_(Send|Recv)"


KIND_RE = [
    ("allreduce", r"(?i)all_?reduce"),
    ("allgather", r"(?i)all_?gather"),
    ("reduce_scatter", r"(?i)reduce_?scatter"),
    ("all_to_all", r"(?i)all_?to_?all"),
    ("broadcast", r"(?i)broadcast"),
    ("sendrecv", P2P_RE),
]


def collectives(a: Analysis) -> pl.DataFrame:
    """Communication kernels with their group, kind, payload and order within the group.

    Parameters come from the kernel's own args, else from the nearest enclosing
    op that records them (`record_param_comms`, `nccl:*`).
    """
    k = a.kernels.filter(pl.col("cls") == "communication")
    cols = list(COLLECTIVE_COLUMNS)
    if k.height and a.ops.height:
        parent = a.ops["parent"].to_numpy()
        carrier = nearest(parent, a.ops["collective"].is_not_null().to_numpy())
        rows = k["op_row"].fill_null(-1).to_numpy()
        src = np.where(rows >= 0, carrier[np.maximum(rows, 0)], -1)
        from_op = a.ops.select(cols)[np.maximum(src, 0)].with_columns(
            [pl.when(pl.Series(src >= 0)).then(pl.col(c)).alias(c) for c in cols]
        )
        k = k.with_columns([pl.coalesce(k[c], from_op[c]).alias(c) for c in cols])
    kind = pl.lit(None, pl.Utf8)
    for name, pat in reversed(KIND_RE):
        kind = pl.when(pl.coalesce("collective", "name").str.contains(pat)).then(pl.lit(name)).otherwise(kind)
    k = k.with_columns(
        kind=kind,
        pg=pl.col("pg_name").fill_null("?"),
        end=pl.col("ts") + pl.col("dur"),
        elem_bytes=pl.col("coll_dtype").str.to_lowercase().str.replace("c10::", "", literal=True).replace_strict(COLLECTIVE_ITEMSIZE, default=None),
    ).with_columns(
        bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("elem_bytes"),
    ).sort("ts")
    k = k.with_columns(seq=pl.int_range(pl.len()).over("pg"))
    return k.select("pg", "seq", "kind", "name", "ts", "end", "dur", "bytes", "group_size", "step")
