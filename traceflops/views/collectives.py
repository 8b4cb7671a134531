"""Communication kernels as collectives: group, kind, payload bytes and order within the group, per trace."""

from __future__ import annotations

import numpy as np
import orjson
import polars as pl

from traceflops.core.dtypes import COLLECTIVE_ITEMSIZE
from traceflops.core.results import Analysis
from traceflops.core.trace import COLLECTIVE_COLUMNS
from traceflops.core.vocab import HOST_COMM_WORK_RE
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


def _tensor_sizes(dims) -> list[int]:
    """Elements of each tensor operand in recorded Input Dims (a tensor list counts as one operand, summed)."""
    out = []
    for d in dims if isinstance(dims, list) else []:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append(int(np.prod(d)))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            out.append(sum(_tensor_sizes(d)))
    return out


def host_work(a: Analysis) -> pl.DataFrame:
    """A CPU trace's collectives as they ran (`gloo:*` on the backend's threads), with their payload from the recorded input."""
    w = a.ops.filter(pl.col("name").str.contains(HOST_COMM_WORK_RE))
    if "comm_issuer" in w.columns:  # the issuing c10d call records output and input (an all-gather's work only its input)
        call_dims = a.ops["dims"].gather(w["comm_issuer"].fill_null(0)).to_list()
        call_dims = [c if i is not None else None for c, i in zip(call_dims, w["comm_issuer"].to_list())]
    else:
        call_dims = [None] * w.height
    nelems, dtype = [], []
    for dims, types, call in zip(w["dims"].to_list(), w["types"].to_list(), call_dims):
        t = orjson.loads(types) if types else None
        sizes = [n for n in (_tensor_sizes(orjson.loads(call)) if call else []) if n]
        sizes = sizes or _tensor_sizes(orjson.loads(dims) if dims else None)[:1]
        nelems.append(max(sizes) if sizes else None)
        dtype.append(t[0] if isinstance(t, list) and t and isinstance(t[0], str) else None)
    world = a.meta.get("world_size")
    return w.with_columns(
        collective=pl.col("name").str.replace(HOST_COMM_WORK_RE, ""),
        in_nelems=pl.Series(nelems, dtype=pl.Int64), out_nelems=pl.lit(None, pl.Int64),
        coll_dtype=pl.Series(dtype, dtype=pl.Utf8), pg_name=pl.lit(None, pl.Utf8), group_size=pl.lit(world, pl.Int64),
    )


def collectives(a: Analysis) -> pl.DataFrame:
    """Communication kernels (or a CPU trace's collectives) with their group, kind, payload and order within the group.

    Parameters come from the kernel's own args, else from the nearest enclosing
    op that records them (`record_param_comms`, `nccl:*`).
    """
    device = a.kernels.height > 0
    k = a.kernels.filter(pl.col("cls") == "communication") if device else host_work(a)
    cols = list(COLLECTIVE_COLUMNS)
    if device and k.height and a.ops.height:
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
