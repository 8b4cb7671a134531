"""Communication kernels as collectives: group, kind, payload bytes and order within the group, per trace.

A collective's process group comes from its own args (`Process Group Name`,
`Description`, `Ranks`, `Seq`: NCCL ops and kernels), completed from the
trace's `distributedInfo.pg_config`. A CPU backend's work (`gloo:*`) records
no group: each group runs its work on threads of its own, created when the
group is, so the runloop threads, by thread id, are the member groups' in the
order pg_config lists them (see `thread_groups`). A collective's message is
its recorded size, else the one input tensor of the call it ran under
(`call_payload`: an older PyTorch's `nccl:*`, `symm_mem::`, XLA's ops).
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import polars as pl

from traceflops.core.contract import COMMUNICATION_SCHEMA
from traceflops.core.dtypes import collective_itemsize
from traceflops.core.results import Analysis
from traceflops.core.trace import COLLECTIVE_COLUMNS, name_matches
from traceflops.core.vocab import (
    HOST_COMM_CALL_KIND,
    HOST_COMM_WAIT_RE,
    HOST_COMM_WORK_RE,
    MAX_MESSAGE_ELEMENTS,
    XLA_COLLECTIVE_OPS,
)
from traceflops.stages.link import nearest
from traceflops.stages.steps import counted_steps
from traceflops.views import p2p

# A point-to-point transfer by its kernel (NCCL's SendRecv, Send, Recv), its CPU work (`gloo:send`), the collective
# name PyTorch records for it (`send`, `recv`) or the call the kernel ran under (`nccl:send`, `nccl:recv`).
# XLA's send and recv (HLO opcodes, async as `send-start` ... `send-done`) are point-to-point too.
P2P_RE = (
    r"(?i)sendrecv|send_recv|ncclDevKernel_(Send|Recv)|ncclKernel_(Send|Recv)|"
    r"^(gloo:|nccl:)?(send|recv)(_any_source|-start|-done)?$"
)


# PyTorch's names (`all_reduce`, `allgather`) and XLA's HLO opcodes (`all-reduce`, `ragged-all-to-all`,
# `collective-broadcast`, each async as `-start` ... `-done`).
KIND_RE = [
    ("allreduce", r"(?i)all[_-]?reduce"),
    ("allgather", r"(?i)all[_-]?gather"),
    ("reduce_scatter", r"(?i)reduce[_-]?scatter"),
    ("all_to_all", r"(?i)all[_-]?to[_-]?all"),
    ("broadcast", r"(?i)broadcast"),
    # XLA's collective-permute: each device sends its buffer to one peer and receives one (JAX's ppermute: ring
    # attention, pipelines); a kind of its own, as a pipeline's transfers are told by their send and recv
    ("collective_permute", r"(?i)^collective-permute"),
    ("reduce", r"(?i)^(nccl:)?reduce$|nccl(Dev)?Kernel_Reduce_"),  # dist.reduce: to one rank (not ReduceScatter)
    # gather and scatter run as NCCL send/recv kernels: named by what was asked, so they are not taken for a pipeline's
    # transfers
    ("gather", r"(?i)^(nccl:)?gather$"),
    ("scatter", r"(?i)^(nccl:)?scatter$"),
    ("sendrecv", P2P_RE),
]
# The call a device collective ran under, as the profiler names ProcessGroupNCCL's (`nccl:all_to_all`, `nccl:send`),
# PyTorch's symmetric-memory collectives (`symm_mem::multimem_all_reduce_`, vLLM's all-reduce on B200) and XLA's
# collective ops (HLO `all-reduce`, `all-reduce-start.3`: their operands are the input; a `-done` op's is the start's
# result): what the kernel was for where its own args and its `record_param_comms` name no collective (an all-to-all
# runs as SendRecv kernels), and what it moved where nothing records a message size.
COLLECTIVE_CALL_RE = rf"^(nccl:|symm_mem::|({'|'.join(XLA_COLLECTIVE_OPS)})(-start)?(\.\d+)?$)"


def kind_of(text: pl.Expr) -> pl.Expr:
    """The collective kind a name says (`KIND_RE`, first match), or null."""
    kind = pl.lit(None, pl.Utf8)
    for name, pat in reversed(KIND_RE):
        kind = pl.when(text.str.contains(pat)).then(pl.lit(name)).otherwise(kind)
    return kind


# The columns of a trace's collectives (and of a rank summary's).
COLUMNS = (
    "pg",
    "seq",
    "kind",
    "name",
    "ts",
    "end",
    "dur",
    "bytes",
    "group_size",
    "step",
    "pg_desc",
    "role",
    "group_ranks",
    "phase",
    "exposed",
    "overlapped",
)


# What a group is for, by the words of its description: PyTorch DeviceMesh dimensions (`mesh_<name>`, torchtitan's
# dp_replicate, dp_shard, dp_shard_cp, cp, tp, pp, ep, ...) and Megatron-Core's `group_desc` names
# (TENSOR_MODEL_PARALLEL_GROUP, DATA_PARALLEL_GROUP_WITH_CP, EXPERT_MODEL_PARALLEL_GROUP, ...).
_MESH_ROLES = {
    "dp": "dp",
    "fsdp": "dp",
    "hsdp": "dp",
    "ddp": "dp",
    "replicate": "dp",
    "shard": "dp",
    "tp": "tp",
    "sp": "tp",
    "pp": "pp",
    "ep": "ep",
    "etp": "tp",
    "edp": "dp",
    "efsdp": "dp",
    "cp": "cp",
}
_MEGATRON_ROLES = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "tp",
    "EXPERT_DATA_PARALLEL_GROUP": "dp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP": "dp",
    "INTER_PARTIAL_DATA_PARALLEL_GROUP": "dp",
    "INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "dp",
}


def group_role(desc) -> str | None:
    """What a group is for, from its description: a DeviceMesh dimension `mesh_<dim>` → dp, tp, pp, ep or cp by its
    first word (torchtitan's `dp_shard_cp` is FSDP's: dp), else the dimension's own name; a Megatron-Core group
    (`TENSOR_MODEL_PARALLEL_GROUP`, `DATA_PARALLEL_GROUP_WITH_CP_GLOO`, ...) → its role; `default_pg` → world;
    None for other descriptions (a combined group such as Megatron's MODEL_PARALLEL_GROUP has no one role)."""
    if not isinstance(desc, str):
        return None
    if desc == "default_pg":
        return "world"
    if desc.startswith("mesh_") and len(desc) > 5:
        name = desc[5:]
        return _MESH_ROLES.get(name.split("_")[0].lower(), name)
    base = desc.upper().removesuffix("_GLOO").removesuffix("_WITH_CP")
    return _MEGATRON_ROLES.get(base)


def member_groups(a: Analysis) -> list[dict]:
    """The groups of pg_config this rank belongs to that can communicate (more than one rank), in creation order."""
    rank = a.meta.get("rank")
    return [
        g
        for g in a.meta.get("process_groups") or []
        if g["size"] > 1 and (rank is None or g["ranks"] is None or rank in g["ranks"])
    ]


def _tensor_sizes(dims) -> list[int]:
    """Elements of each tensor operand in recorded Input Dims (a tensor list counts as one operand, summed); a shape
    of negative, boolean or implausibly many elements is skipped."""
    out = []
    for d in dims if isinstance(dims, list) else []:
        if isinstance(d, list) and d and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            n = math.prod(d)
            if n <= MAX_MESSAGE_ELEMENTS:
                out.append(n)
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            out.append(sum(_tensor_sizes(d)))
    return out


def call_payload(dims: str | None, types: str | None) -> tuple[int | None, str | None]:
    """A device collective's input (elements, dtype) from the call it ran under, where the collective records no
    message size. ProcessGroupNCCL gives its `nccl:*` call's record function the collective's input tensors as its
    inputs (c10d `Work`'s constructor, fed by `initWork`; PyTorch before `In msg nelems` records nothing else), a
    `symm_mem::` all-reduce op takes its input as its one tensor argument, and an XLA collective's operand shapes are
    its input's (XLA records no message size). Exactly one tensor operand is read; several (a coalesced call, an XLA
    all-reduce of a tuple, an all-gather into an output) are left unknown."""
    try:
        shapes = orjson.loads(dims) if dims else None
        names = orjson.loads(types) if types else None
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(shapes, list):
        return None, None
    tensors = [i for i, d in enumerate(shapes) if isinstance(d, list) and d]
    sizes = _tensor_sizes([shapes[i] for i in tensors])
    if len(tensors) != 1 or len(sizes) != 1 or isinstance(shapes[tensors[0]][0], list):
        return None, None
    i = tensors[0]
    dtype = names[i] if isinstance(names, list) and i < len(names) and isinstance(names[i], str) else None
    return sizes[0], dtype


# A group's threads are created one after another: threads a few ids apart are one group's, a larger step is
# better explained by the next group (the ids between went to other threads).
_BOUNDARY = 2.0


def thread_groups(tids: list[int], hints: list[set[int]], sizes: list[int]) -> list[int] | None:
    """Each backend thread's group (an index into `sizes`, the groups in creation order), or None where none fits.

    `tids` ascending; `hints[i]` the group sizes thread i's work implies (an
    all-gather's output over its input). Threads go to groups in creation
    order (a thread never goes to an earlier group than the thread before it),
    each to a group whose size its hints allow. Of those assignments, the one
    whose cost is least: two neighbouring threads in one group cost their id
    step less one, in two groups `_BOUNDARY`; ties go to later groups (the
    world group is created first and a parallelism API's groups after it).
    """
    n, m = len(tids), len(sizes)
    if n == 0 or m == 0:
        return None
    inf = (float("inf"), 0)
    ok = [[not h or h == {sizes[g]} for g in range(m)] for h in hints]
    # cost[i][g]: the least (cost, lateness) of threads 0..i with thread i in group g; back[i][g]: thread i-1's group
    cost = [[(0.0, m - 1 - g) if ok[0][g] else inf for g in range(m)]]
    back = [[-1] * m]
    for i in range(1, n):
        step = max(float(tids[i] - tids[i - 1]) - 1.0, 0.0)
        prev, row, ptr = cost[-1], [], []
        before, before_g = inf, -1  # the least cost of thread i-1 in a group before g
        for g in range(m):
            best, h = inf, -1
            if ok[i][g]:
                if prev[g] != inf:
                    best, h = (prev[g][0] + step, prev[g][1] + m - 1 - g), g
                if before != inf and (before[0] + _BOUNDARY, before[1] + m - 1 - g) < best:
                    best, h = (before[0] + _BOUNDARY, before[1] + m - 1 - g), before_g
            row.append(best)
            ptr.append(h)
            if prev[g] < before:
                before, before_g = prev[g], g
        cost.append(row)
        back.append(ptr)
    last = min(range(m), key=lambda g: cost[-1][g])
    if cost[-1][last] == inf:
        return None
    out = [0] * n
    g = last
    for i in range(n - 1, -1, -1):
        out[i] = g
        g = back[i][g]
    return out


def _size_hint(call: str | None, call_dims: str | None) -> int | None:
    """The group size a gather or scatter call's shapes imply: its gathered (or scattered) tensor over its shard."""
    kind = HOST_COMM_CALL_KIND.get(call or "")
    if kind not in ("allgather", "reduce_scatter") or not call_dims:
        return None
    sizes = _tensor_sizes(orjson.loads(call_dims))
    if len(sizes) < 2 or not sizes[0] or not sizes[1]:
        return None
    big, small = (sizes[0], sizes[1]) if kind == "allgather" else (sizes[1], sizes[0])
    return big // small if big % small == 0 and big > small else None


def _host_groups(a: Analysis, w: pl.DataFrame, calls: list, call_dims: list) -> list[dict | None]:
    """Each CPU collective work's group (a pg_config entry), or None where it cannot be told.

    Work on the backend's runloop threads (not nested in anything) gets its
    thread's group (`thread_groups`); work run inside its call on the calling
    thread (gloo's send and recv) gets the only group, or the only `pp` group.
    """
    groups = [g for g in member_groups(a) if not g.get("backend") or "gloo" in g["backend"].lower()]
    if not groups or w.height == 0:
        return [None] * w.height
    inline = (w["parent"] >= 0).to_list() if "parent" in w.columns else [False] * w.height
    tids = w["tid"].to_list()
    hints: dict[str, set[int]] = {}
    for t, nested, call, dims in zip(tids, inline, calls, call_dims):
        h = None if nested else _size_hint(call, dims)
        hints.setdefault(t, set())
        if h:
            hints[t].add(h)
    runloop = sorted({t for t, nested in zip(tids, inline) if not nested}, key=lambda t: (_tid_number(t), str(t)))
    of_thread: dict = {}
    if len(groups) == 1:
        of_thread = {t: groups[0] for t in runloop}
    elif runloop:
        pick = thread_groups(
            [_tid_number(t) for t in runloop], [hints[t] for t in runloop], [g["size"] for g in groups]
        )
        of_thread = {t: groups[i] for t, i in zip(runloop, pick)} if pick else {}
    pp = [g for g in groups if group_role(g.get("desc")) == "pp"]
    inline_group = groups[0] if len(groups) == 1 else pp[0] if len(pp) == 1 else None
    return [inline_group if nested else of_thread.get(t) for t, nested in zip(tids, inline)]


def untold_group_size(a: Analysis) -> int | None:
    """The size of a collective's group where the trace does not tell the group: the world's, unless this rank is in
    a smaller group too (then the collective may be that group's: its size is unknown, not the world's)."""
    world = a.meta.get("world_size")
    return None if any(g["size"] != world for g in member_groups(a)) else world


def _tid_number(t) -> int:
    try:
        return int(t)
    except (TypeError, ValueError):
        return 0


def host_work(a: Analysis) -> pl.DataFrame:
    """A CPU trace's collectives as they ran (`gloo:*` on the backend's threads), with their payload from the recorded
    input, the kind the issuing call asked for, and their group."""
    w = a.ops.filter(pl.col("name").str.contains(HOST_COMM_WORK_RE))
    issuers = w["comm_issuer"].to_list() if "comm_issuer" in w.columns else [None] * w.height
    at = [i if i is not None else 0 for i in issuers]
    # the issuing c10d call records output and input (an all-gather's work only its input)
    call_dims = (
        [c if i is not None else None for c, i in zip(a.ops["dims"].gather(at).to_list(), issuers)] if w.height else []
    )
    calls = (
        [c if i is not None else None for c, i in zip(a.ops["name"].gather(at).to_list(), issuers)] if w.height else []
    )
    nelems, dtype = [], []
    for dims, types, call in zip(w["dims"].to_list(), w["types"].to_list(), call_dims):
        t = orjson.loads(types) if types else None
        sizes = [n for n in (_tensor_sizes(orjson.loads(call)) if call else []) if n]
        sizes = sizes or _tensor_sizes(orjson.loads(dims) if dims else None)[:1]
        nelems.append(max(sizes) if sizes else None)
        dtype.append(t[0] if isinstance(t, list) and t and isinstance(t[0], str) else None)
    group = _host_groups(a, w, calls, call_dims)
    world = untold_group_size(a)
    return w.with_columns(
        collective=pl.col("name").str.replace(HOST_COMM_WORK_RE, ""),
        in_nelems=pl.Series(nelems, dtype=pl.Int64),
        out_nelems=pl.lit(None, pl.Int64),
        coll_dtype=pl.Series(dtype, dtype=pl.Utf8),
        pg_name=pl.Series([g["name"] if g else None for g in group], dtype=pl.Utf8),
        group_size=pl.Series([g["size"] if g else world for g in group], dtype=pl.Int64),
        pg_desc=pl.Series([g["desc"] if g else None for g in group], dtype=pl.Utf8),
        pg_ranks=pl.Series(
            [orjson.dumps(g["ranks"]).decode() if g and g["ranks"] else None for g in group], dtype=pl.Utf8
        ),
        coll_seq=pl.lit(None, pl.Int64),
        call_kind=pl.Series([HOST_COMM_CALL_KIND.get(c) if c else None for c in calls], dtype=pl.Utf8),
        **p2p.call_args(a, w),
    )


def _from_config(k: pl.DataFrame, a: Analysis) -> pl.DataFrame:
    """A collective's description, size and ranks, where its args lack them, from the pg_config entry of its group's
    name."""
    groups = {g["name"]: g for g in a.meta.get("process_groups") or []}
    if not groups or k.height == 0:
        return k
    names = list(groups)
    ranks = [orjson.dumps(groups[n]["ranks"]).decode() if groups[n]["ranks"] else None for n in names]

    def lookup(values, dtype):
        return pl.col("pg_name").replace_strict(names, values, default=None, return_dtype=dtype)

    return k.with_columns(
        pg_desc=pl.coalesce("pg_desc", lookup([groups[n]["desc"] for n in names], pl.Utf8)),
        group_size=pl.coalesce("group_size", lookup([groups[n]["size"] for n in names], pl.Int64)),
        pg_ranks=pl.coalesce("pg_ranks", lookup(ranks, pl.Utf8)),
    )


def collectives(a: Analysis, with_issuer: bool = False) -> pl.DataFrame:
    """Communication kernels (or a CPU trace's collectives) with their group, kind, payload and order within the group.

    Parameters come from the kernel's own args, else from the nearest enclosing
    op that records them (`record_param_comms`, `nccl:*`), else from pg_config.
    The order within a group is the recorded `Seq` where every collective of
    the group has a distinct one, else the order they started in. `with_issuer`
    adds a CPU collective's issuing call (an op row) as `issuer`.
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
        caller = nearest(parent, name_matches(a.ops["name"], COLLECTIVE_CALL_RE).to_numpy())
        up = np.where(rows >= 0, caller[np.maximum(rows, 0)], -1)
        called = a.ops["name"][np.maximum(up, 0)]
        k = k.with_columns(
            _called=pl.when(pl.Series(up >= 0)).then(called), **p2p.device_args(), **_call_sizes(k, a, up)
        )
    k = p2p.keyed(_from_config(k, a), a)
    # What the collective was, from the most to the least direct record: the name PyTorch recorded for it, the call it
    # ran under, the kernel's (or the CPU work's) own name.
    named = [pl.col("collective"), *([pl.col("_called")] if "_called" in k.columns else []), pl.col("name")]
    kind = pl.coalesce([kind_of(t) for t in named])
    if (
        "call_kind" in k.columns
    ):  # the collective the issuing call asked for (gloo runs a reduce-scatter as an all-reduce)
        kind = pl.coalesce("call_kind", kind)
    k = k.with_columns(kind=kind)
    if "_call_nelems" in k.columns:
        k = _sized_by_call(k, a)
    dtypes = k["coll_dtype"].drop_nulls().unique().to_list() if k.height else []
    k = (
        k.with_columns(
            pg=pl.col("pg_name").fill_null("?"),
            end=pl.col("ts") + pl.col("dur"),
            elem_bytes=pl.col("coll_dtype").replace_strict(
                dtypes, [collective_itemsize(d) for d in dtypes], default=None, return_dtype=pl.Int64
            ),
            role=_role(k, dict(a.meta.get("group_roles") or {})),
        )
        .with_columns(
            bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("elem_bytes"),
        )
        .sort("ts")
    )
    order = pl.int_range(pl.len()).over("pg")
    recorded = pl.col("coll_seq").is_not_null().all().over("pg") & (
        pl.col("coll_seq").n_unique().over("pg") == pl.len().over("pg")
    )
    k = k.with_columns(seq=pl.when(recorded).then(pl.col("coll_seq")).otherwise(order))
    listed = k["pg_ranks"].drop_nulls().unique().to_list() if k.height else []
    # the share of the step time each exposed and compute hid (stages.comm_exposure), µs
    shares = [
        pl.col(c).cast(pl.Float64).alias(n) if c in k.columns else pl.lit(None, pl.Float64).alias(n)
        for c, n in (("comm_exposed", "exposed"), ("comm_overlapped", "overlapped"))
    ]
    issuer = (
        [
            pl.col("comm_issuer").cast(pl.Int64).alias("issuer")
            if "comm_issuer" in k.columns and not device
            else pl.lit(None, pl.Int64).alias("issuer")
        ]
        if with_issuer
        else []
    )
    ranks = pl.col("pg_ranks").replace_strict(
        listed, [ranks_text(v) for v in listed], default=None, return_dtype=pl.Utf8
    )
    phase = pl.col("phase") if "phase" in k.columns else pl.lit(None, pl.Utf8)
    return k.select(*COLUMNS[:12], ranks.alias("group_ranks"), phase.alias("phase"), *shares, *p2p.P2P_COLUMNS, *issuer)


def _call_sizes(k: pl.DataFrame, a: Analysis, up: np.ndarray) -> dict[str, pl.Series]:
    """Each collective kernel that records no message size, the input of the call it ran under (row `up`, -1 for
    none) as `_call_nelems` and `_call_dtype` (`call_payload`, once per distinct recorded shape); null elsewhere."""
    unsized = (k["in_nelems"].is_null() & k["out_nelems"].is_null()).to_numpy() & (up >= 0)
    rows = np.unique(up[unsized])
    calls = pl.DataFrame({"row": rows, "dims": a.ops["dims"].gather(rows), "types": a.ops["types"].gather(rows)})
    calls = calls.filter(pl.col("dims").is_not_null())  # shapes not recorded: nothing to read
    shapes = calls.select("dims", "types").unique()
    got = [call_payload(d, t) for d, t in shapes.iter_rows()]
    sized = calls.join(
        shapes.with_columns(
            n=pl.Series([n for n, _ in got], dtype=pl.Int64), t=pl.Series([t for _, t in got], dtype=pl.Utf8)
        ),
        on=["dims", "types"],
        nulls_equal=True,
    )
    at = pl.Series(np.where(unsized, up, -1))
    return {
        "_call_nelems": at.replace_strict(sized["row"], sized["n"], default=None, return_dtype=pl.Int64),
        "_call_dtype": at.replace_strict(sized["row"], sized["t"], default=None, return_dtype=pl.Utf8),
    }


# Kinds whose message is the call's input tensor: a reduce-scatter's whole input, an all-to-all's whole send buffer,
# a transfer's tensor. An all-gather's input is one rank's share; a gather's or scatter's input differs between the
# root and the others, and a collective of no known kind has no known message: those are not read from the input.
_MESSAGE_IS_INPUT = (
    "allreduce",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "sendrecv",
    "collective_permute",
)


def _sized_by_call(k: pl.DataFrame, a: Analysis) -> pl.DataFrame:
    """Message sizes from the calls' inputs where the collective records none: the input for the kinds whose
    message it is (`_MESSAGE_IS_INPUT`), an all-gather's input times its group's size (its recorded group's, else the
    world's where no group of this rank is smaller; unknown otherwise), no size for any other kind."""
    size = pl.coalesce("group_size", pl.lit(untold_group_size(a), pl.Int64))
    gathered = (pl.col("kind") == "allgather").fill_null(False)
    whole = pl.col("kind").is_in(_MESSAGE_IS_INPUT).fill_null(False)
    known = gathered & (pl.col("_call_nelems") <= MAX_MESSAGE_ELEMENTS // size).fill_null(False)
    return k.with_columns(
        in_nelems=pl.coalesce("in_nelems", pl.when(whole | known).then("_call_nelems")),
        out_nelems=pl.coalesce(
            "out_nelems",
            pl.when(gathered & (pl.col("_call_nelems") <= MAX_MESSAGE_ELEMENTS // size)).then(
                pl.col("_call_nelems") * size
            ),
        ),
        coll_dtype=pl.coalesce("coll_dtype", "_call_dtype"),
    )


def ranks_text(v: str) -> str | None:
    """A group's recorded ranks ("[0, 1]") as compact JSON text ("[0,1]"); None unless a list of whole numbers."""
    try:
        ranks = orjson.loads(v)
    except orjson.JSONDecodeError:
        return None
    ok = isinstance(ranks, list) and ranks and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
    return orjson.dumps(ranks).decode() if ok else None


def _role(k: pl.DataFrame, by_hand: dict[str, str]) -> pl.Expr:
    """A collective's role: given by hand for its group's description or name (`--group-role`), else its
    description's."""
    descs = k["pg_desc"].drop_nulls().unique().to_list() if k.height else []
    described = pl.col("pg_desc").replace_strict(
        descs, [by_hand.get(d) or group_role(d) for d in descs], default=None, return_dtype=pl.Utf8
    )
    if not by_hand:
        return described
    named = pl.col("pg_name").replace_strict(list(by_hand), list(by_hand.values()), default=None, return_dtype=pl.Utf8)
    return pl.coalesce(
        pl.col("pg_desc").replace_strict(list(by_hand), list(by_hand.values()), default=None, return_dtype=pl.Utf8),
        named,
        described,
    )


# --- communication by dimension -------------------------------------------

DIMENSION_COLUMNS = tuple(COMMUNICATION_SCHEMA)


def by_dimension(coll: pl.DataFrame, waits: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame | None:
    """Communication per dimension (its group's role), phase and kind over the given steps: calls, time, and the
    step time it exposed and compute hid (µs, and as shares of the steps' summed windows).

    The exposed and overlapped times are each collective's share of the
    partition's (`stages.comm_exposure`), so the rows add up to the
    steps' `communication_exposed` and `communication_overlapped`. A thread's
    wait for a collective when none is in flight on this rank (`waits`) goes
    to the collective its thread issued last, else to role `?`, kind `wait`. A dimension is the group's role
    (dp, tp, pp, ep, cp, world), else its description, else `?` (no group
    recorded). None when there is no communication in the steps.
    """
    ids = steps["step"].to_list()
    window = float(steps["window"].sum()) if steps.height else 0.0
    c = coll.filter(pl.col("step").is_in(ids)).select(
        role=pl.coalesce("role", "pg_desc", pl.lit("?")),
        phase=pl.col("phase").fill_null("other"),
        kind=pl.col("kind").fill_null("?"),
        dur=pl.col("dur").cast(pl.Float64),
        exposed=pl.col("exposed").fill_null(0.0),
        overlapped=pl.col("overlapped").fill_null(0.0),
    )
    w = waits.filter(pl.col("step").is_in(ids) & (pl.col("exposed") > 0)).select(
        role=pl.coalesce("role", "pg_desc", pl.lit("?")),
        phase=pl.col("phase").fill_null("other"),
        kind=pl.col("kind").fill_null("wait"),
        dur=pl.col("exposed"),
        exposed=pl.col("exposed"),
        overlapped=pl.col("overlapped").fill_null(0.0),
        calls=pl.lit(0),
    )
    rows = pl.concat([c.with_columns(calls=pl.lit(1)), w])
    if rows.height == 0 or window <= 0:
        return None
    return (
        rows.group_by("role", "phase", "kind")
        .agg(
            calls=pl.col("calls").sum(),
            time_us=pl.col("dur").sum(),
            exposed_us=pl.col("exposed").sum(),
            overlapped_us=pl.col("overlapped").sum(),
        )
        .with_columns(
            calls=pl.col("calls").cast(pl.Int64),
            window_us=pl.lit(window),
            exposed_share=pl.col("exposed_us") / window,
            overlapped_share=pl.col("overlapped_us") / window,
        )
        .sort(["exposed_us", "time_us", "role", "phase", "kind"], descending=[True, True, False, False, False])
        .select(DIMENSION_COLUMNS)
    )


def host_waits(a: Analysis, coll: pl.DataFrame) -> pl.DataFrame:
    """A CPU trace's waits on collectives (`_c10d_functional::wait_tensor`) with the exposed time no collective
    took, each tied to the collective its thread issued last before it (its group's role, its kind); `coll` is
    `collectives(a, with_issuer=True)`."""
    schema = {
        "step": pl.Int64,
        "phase": pl.Utf8,
        "exposed": pl.Float64,
        "overlapped": pl.Float64,
        "role": pl.Utf8,
        "pg_desc": pl.Utf8,
        "kind": pl.Utf8,
    }
    if "comm_exposed" not in a.ops.columns or a.kernels.height:
        return pl.DataFrame(schema=schema)
    waits = a.ops.filter(pl.col("name").str.contains(HOST_COMM_WAIT_RE) & pl.col("comm_exposed").is_not_null())
    if waits.height == 0:
        return pl.DataFrame(schema=schema)
    coll = coll.filter(pl.col("issuer").is_not_null())
    issuers = a.ops.select("tid", "ts")[coll["issuer"].to_numpy()]  # the issuing call's thread and start
    calls = (
        coll.select("role", "pg_desc", "kind")
        .with_columns(tid=issuers["tid"], ts=issuers["ts"].cast(pl.Float64))
        .sort("ts")
    )
    w = waits.select(
        "tid",
        pl.col("ts").cast(pl.Float64),
        pl.col("step").cast(pl.Int64),
        "phase",
        exposed=pl.col("comm_exposed"),
        overlapped=pl.col("comm_overlapped"),
    ).sort("ts")
    return w.join_asof(calls, on="ts", by="tid", strategy="backward", check_sortedness=False).select(list(schema))


def communication(a: Analysis, coll: pl.DataFrame, exclude_steps=()) -> pl.DataFrame | None:
    """This trace's communication by dimension, phase and kind over the counted steps (`by_dimension`), from its
    `collectives(a, with_issuer=True)`."""
    return by_dimension(coll, host_waits(a, coll), counted_steps(a.steps, exclude_steps))


def across_ranks(tables: dict[int | None, pl.DataFrame | None]) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """Ranks' communication tables (`by_dimension`, keyed by rank) as the job's: per dimension, phase and kind, summed
    over the ranks, its shares of all ranks' summed step windows, how many ranks have the row and which has the
    largest exposed share; and the ranks' rows with their rank. (None, None) when no rank has one."""
    frames = [t.with_columns(rank=pl.lit(r, pl.Int64)) for r, t in tables.items() if t is not None and t.height]
    if not frames:
        return None, None
    per = pl.concat(frames, how="vertical_relaxed")
    window = float(per.group_by("rank").agg(pl.col("window_us").first())["window_us"].sum())
    job = (
        per.sort("exposed_share", "rank", descending=[True, False])
        .group_by("role", "phase", "kind")
        .agg(
            pl.col("calls").sum(),
            pl.col("time_us", "exposed_us", "overlapped_us").sum(),
            ranks=pl.col("rank").n_unique(),
            max_exposed_share=pl.col("exposed_share").first(),
            max_rank=pl.col("rank").first(),
        )
        .with_columns(
            window_us=pl.lit(window),
            exposed_share=pl.col("exposed_us") / window,
            overlapped_share=pl.col("overlapped_us") / window,
        )
        .sort(["exposed_us", "time_us", "role", "phase", "kind"], descending=[True, True, False, False, False])
        .select(*DIMENSION_COLUMNS, "ranks", "max_exposed_share", "max_rank")
    )
    return job, per.sort("rank", "exposed_us", descending=[False, True]).select("rank", *DIMENSION_COLUMNS)
