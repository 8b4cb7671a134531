"""Executed FLOPs per op and per kernel, from recorded shapes.

Only leaf matmul-class ops count (an `aten::linear` that recorded its
`aten::addmm` counts once, through the addmm; a grouped mm counts once, as
itself, never through the per-group mm its fallback runs), and only ops that ran: on a
device trace an op ran iff it or a descendant launched device work; on a CPU
trace an op whose only children are `aten::detach` was cut short (checkpoint
early stop) and did nothing.
"""

from __future__ import annotations

import re

import numpy as np
import orjson
import polars as pl

from traceflops.core.dtypes import dtype_of
from traceflops.core.trace import Coded, name_matches
from traceflops.flops import aten as registry
from traceflops.flops.kernels import MATMUL_KERNEL_RE, is_matmul_kernel
from traceflops.stages.link import by_row, nearest, spread

FLOP_COLS = {
    "flops": pl.Int64,
    "effective_flops": pl.Int64,
    "recompute_flops": pl.Int64,
    "mask": pl.Utf8,
    "bytes": pl.Int64,
    "dtype": pl.Utf8,
    "flops_reason": pl.Utf8,
}


BOOKKEEPING = frozenset({"aten::detach", "detach", "PythonDispatchMode"})


def has_formula(names: pl.Series, hint: pl.Series | None = None) -> np.ndarray:
    """Matmul-class ops: a formula in the registry, or the format says so (an XLA dot fusion)."""
    mask = names.is_in(list(registry.MATMUL_OPS))
    if hint is not None:
        mask = mask | hint.fill_null(False)
    return mask.to_numpy()


def mark_ancestors(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """True for every strict ancestor of `rows`."""
    out = np.zeros(len(parent), dtype=bool)
    cur = parent[rows]
    cur = cur[cur >= 0]
    while cur.size:
        cur = cur[~out[cur]]  # stop climbing where an earlier path already marked
        out[cur] = True
        cur = parent[cur]
        cur = cur[cur >= 0]
    return out


# Grouped GEMMs (MoE experts) count once, as the dispatcher-level op, with FLOPs from its own shapes: the CPU (and
# pre-Hopper CUDA) fallback runs one aten::mm (or bmm) per group inside it, and those are not matmuls of their own.
GROUPED_MM_OPS = frozenset({"aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::_scaled_grouped_mm_v2"})


def leaf_matmuls(ops: pl.DataFrame) -> np.ndarray:
    """Matmul-class ops with no matmul-class op below them, but for a grouped mm: it is the op counted, and the
    per-group matmuls inside it are not (`GROUPED_MM_OPS`)."""
    parent = ops["parent"].to_numpy()
    formula = has_formula(ops["name"], ops["matmul_hint"])
    grouped = formula & ops["name"].is_in(list(GROUPED_MM_OPS)).to_numpy()
    if grouped.any():
        owner = nearest(parent, grouped)  # the op itself or its nearest grouped-mm ancestor
        inside = np.where(parent >= 0, owner[np.maximum(parent, 0)] >= 0, False)
        formula = formula & ~inside
    return formula & ~mark_ancestors(parent, np.flatnonzero(formula))


def ran(ops: pl.DataFrame, kernels: pl.DataFrame, device_trace: bool) -> np.ndarray:
    parent = ops["parent"].to_numpy()
    n = ops.height
    if device_trace:
        launched = np.zeros(n, dtype=bool)
        rows = kernels["op_row"].drop_nulls().unique().to_numpy()
        launched[rows] = True
        return launched | mark_ancestors(parent, rows)
    # CPU trace: an op whose children only save or hand back tensors did no work:
    # aten::detach alone is a checkpoint early stop, PythonDispatchMode without a
    # compute op under it is a selective-checkpoint cache hit.
    names = ops["name"]
    bookkeeping = names.is_in(list(BOOKKEEPING)).to_numpy()
    has_child = np.zeros(n, dtype=bool)
    working_child = np.zeros(n, dtype=bool)
    has_child[parent[parent >= 0]] = True
    keep = (parent >= 0) & ~bookkeeping
    working_child[parent[keep]] = True
    return ~(has_child & ~working_child)


def _decode(text: str | None):
    return None if text is None else orjson.loads(text)


def formula_table(
    ops: pl.DataFrame,
    rows: np.ndarray,
    out_dims: dict[int, str] | None = None,
    contexts: dict[int, str] | None = None,
) -> pl.DataFrame:
    """Apply the registry once per distinct (name, dims, types, concrete, out, context) signature.

    `contexts`: per op row, facts recorded outside the op (JSON; `op_contexts`) that its formula needs.
    """
    sub = ops[rows].select("row", "name", "dims", "types", "concrete")
    extra = {"out": out_dims, "ctx": contexts}
    sub = sub.with_columns(
        [
            pl.col("row").replace_strict(v, default=None, return_dtype=pl.Utf8).alias(k)
            if v
            else pl.lit(None, pl.Utf8).alias(k)
            for k, v in extra.items()
        ]
    )
    keys = ["name", "dims", "types", "concrete", *extra]
    uniq = sub.select(keys).unique()
    rows_out: dict[str, list] = {k: [] for k in FLOP_COLS}
    for name, dims, types, concrete, out, ctx in uniq.iter_rows():
        d = _decode(dims)
        r = registry.op_flops(name, d, _decode(types), _decode(concrete), out_dims=_decode(out), context=_decode(ctx))
        if r is None:
            r = registry.OpFlops(None, None, 0, None, None, None, "no formula")
        reason: str | None
        if d is None and r.flops is None:
            reason = "no Input Dims (re-profile with record_shapes=True)"
        else:
            reason = r.reason
        rows_out["flops"].append(r.flops)
        rows_out["effective_flops"].append(r.effective)
        rows_out["recompute_flops"].append(r.recompute)
        rows_out["mask"].append(r.mask)
        rows_out["bytes"].append(r.bytes)
        rows_out["dtype"].append(r.dtype)
        rows_out["flops_reason"].append(reason)
    res = pl.concat([uniq, pl.DataFrame(rows_out, schema=FLOP_COLS)], how="horizontal")
    return sub.join(res, on=keys, how="left", nulls_equal=True).select("row", *FLOP_COLS)


def conv_out_dims(ops: pl.DataFrame, rows: np.ndarray, lookahead: int = 8) -> dict[int, str]:
    """Output shape of convolutions that lack Concrete Inputs, from the ops that follow.

    Old traces record no stride or padding. The op consuming a convolution's
    output (bias add, batch norm, activation) follows it on the same thread and
    takes it as its first input: the first of the next few ops whose first input
    has the convolution's batch size and output channels is trusted, none other.
    """
    conv = ops[rows].filter(
        pl.col("name").str.contains("conv") & ~pl.col("name").str.contains("backward") & pl.col("concrete").is_null()
    )
    if conv.height == 0:
        return {}
    order = ops.select("row", "pid", "tid", "ts", "dur", "dims").sort(["pid", "tid", "ts"]).with_row_index("pos")
    pos_of = dict(zip(order["row"].to_list(), order["pos"].to_list()))
    thread = (order["pid"].fill_null("") + "|" + order["tid"].fill_null("")).to_list()
    ts = order["ts"].to_list()
    dims = order["dims"].to_list()
    out: dict[int, str] = {}
    for row, d_text, end in conv.select("row", "dims", (pl.col("ts") + pl.col("dur"))).iter_rows():
        d = _decode(d_text)
        if not (d and len(d) >= 2 and isinstance(d[0], list) and isinstance(d[1], list) and len(d[0]) >= 3 and d[1]):
            continue
        batch, cout = d[0][0], d[1][0]
        p = pos_of[row]
        seen = 0
        for q in range(p + 1, min(p + 1 + 4 * lookahead, len(ts))):
            if thread[q] != thread[p]:
                break
            if ts[q] < end:
                continue  # nested inside the convolution
            seen += 1
            nd = _decode(dims[q])
            if nd and isinstance(nd[0], list) and len(nd[0]) == len(d[0]) and nd[0][0] == batch and nd[0][1] == cout:
                out[row] = orjson.dumps(nd[0]).decode()
                break
            if seen >= lookahead:
                break
    return out


def weight_grad_shapes(ops: pl.DataFrame, rows: np.ndarray) -> dict[int, str]:
    """Weight shape for old `cudnn_convolution_backward_weight` ops, from their parent.

    The weight size is an int list there (not recorded), but the enclosing
    `cudnn_convolution_backward` records the weight tensor as its third input.
    """
    wg = ops[rows].filter(pl.col("name").str.ends_with("convolution_backward_weight"))
    if wg.height == 0:
        return {}
    parents = ops.select(
        pl.col("row").alias("parent"), pl.col("dims").alias("parent_dims"), pl.col("name").alias("parent_name")
    )
    j = wg.select("row", "parent").join(parents, on="parent", how="left")
    out: dict[int, str] = {}
    for row, pname, pdims in j.select("row", "parent_name", "parent_dims").iter_rows():
        d = _decode(pdims)
        if (
            pname
            and pname.endswith("convolution_backward")
            and d
            and len(d) >= 3
            and isinstance(d[2], list)
            and len(d[2]) >= 3
        ):
            out[row] = orjson.dumps(d[2]).decode()
    return out


# A serving engine's step annotation that carries its batch's sequence lengths (vLLM:
# execute_<n>_context_…_generation_…).
BATCH_ANNOTATION_RE = r"^execute_\d+_context_\d+\(sq"
_TOPK_RE = re.compile(r"(?i)topk")


def op_contexts(ops: pl.DataFrame, rows: np.ndarray) -> dict[int, str]:
    """Per matmul op row, what its formula needs that is recorded outside its own arguments (as JSON):
    `seq_stats`, the sequence lengths of a serving engine's step annotation above it (vLLM's attention), and
    `moe`, the top-k and the expert weights seen in the ops a fused MoE ran."""
    ctx: dict[int, dict] = {}
    for row, name in batch_annotations(ops, rows).items():
        stats = registry.vllm_batch_stats(name)
        if stats:
            ctx.setdefault(row, {})["seq_stats"] = stats
    for row, moe in moe_evidence(ops, rows).items():
        ctx.setdefault(row, {})["moe"] = moe
    return {row: orjson.dumps(c).decode() for row, c in ctx.items()}


def batch_annotations(ops: pl.DataFrame, rows: np.ndarray) -> dict[int, str]:
    """For matmul ops under a serving engine's step annotation, that annotation's name."""
    marked = name_matches(ops["name"], BATCH_ANNOTATION_RE).to_numpy()
    if not marked.any() or not len(rows):
        return {}
    near = nearest(ops["parent"].to_numpy(), marked, rows)
    has = near >= 0
    names = ops["name"].gather(near[has]).to_list()
    return dict(zip(ops["row"].gather(rows[has]).to_list(), names))


def moe_evidence(ops: pl.DataFrame, rows: np.ndarray) -> dict[int, dict]:
    """For each fused MoE op among `rows`: the top-k (a `TopK` / `aten::topk` it ran: its k argument) and its expert
    weights (the first two 3-D tensors of the router's expert count its ops took, in order: up, then down), as
    [dims, type, strides]. Only MoE ops are looked into: their own arguments do not hold the experts."""
    if not len(rows):
        return {}
    names = ops["name"].gather(rows)
    moe_rows = rows[names.is_in(list(registry.MOE_OPS)).to_numpy()]
    if not len(moe_rows):
        return {}
    mark = np.zeros(ops.height, dtype=bool)
    mark[moe_rows] = True
    parent = ops["parent"].to_numpy()
    owner = nearest(parent, mark)
    inside = np.flatnonzero((owner >= 0) & ~mark)
    experts = {}
    for row, dims in zip(moe_rows.tolist(), ops["dims"].gather(moe_rows).to_list()):
        d = _decode(dims)
        if isinstance(d, list) and len(d) > 1 and isinstance(d[1], list) and len(d[1]) == 2:
            experts[row] = d[1][1]
    found: dict[int, dict] = {r: {"topk": None, "weights": []} for r in experts}
    sub = (
        ops[inside]
        .select("ts", "row", "name", "dims", "types", "concrete", "strides")
        .with_columns(owner=pl.Series(owner[inside]))
        .sort("ts", "row")
    )
    for own, name, dims, types, concrete, strides in sub.select(
        "owner", "name", "dims", "types", "concrete", "strides"
    ).iter_rows():
        got = found.get(own)
        if got is None:
            continue
        if got["topk"] is None and name and _TOPK_RE.search(name):
            c = _decode(concrete)
            k = c[1] if isinstance(c, list) and len(c) > 1 else None
            if isinstance(k, str) and k.isdigit():
                got["topk"] = int(k)
        d = _decode(dims)
        if (
            len(got["weights"]) < 2
            and isinstance(d, list)
            and d
            and isinstance(d[0], list)
            and len(d[0]) == 3
            and d[0][0] == experts[own]
            and all(w[0] != d[0] for w in got["weights"])
        ):
            t, st = _decode(types), _decode(strides)
            got["weights"].append(
                [d[0], t[0] if isinstance(t, list) and t else None, st[0] if isinstance(st, list) and st else None]
            )
    return {r: g for r, g in found.items() if g["topk"] is not None and len(g["weights"]) == 2}


def count_ops(ops: pl.DataFrame, kernels: pl.DataFrame, device_trace: bool) -> pl.DataFrame:
    """Add leaf/ran flags and FLOP columns to the tagged ops."""
    leaf = leaf_matmuls(ops)
    did_run = ran(ops, kernels, device_trace)
    rows = np.flatnonzero(leaf)
    table = formula_table(ops, rows, conv_out_dims(ops, rows) | weight_grad_shapes(ops, rows), op_contexts(ops, rows))
    ops = ops.with_columns(matmul=pl.Series(leaf), ran=pl.Series(did_run))
    ops = ops.with_columns(spread(table, ops.height))  # by position: no join, no copy of the ops
    return apply_hints(ops)


TOTAL_FLOPS_MAX = 1 << 62  # a trace's executed FLOPs in all; below it no sum of non-negative counts wraps int64


def total_flops(ops: pl.DataFrame) -> float:
    """The counted FLOPs of every op, summed in floating point so that a hostile trace cannot wrap the sum."""
    return float(ops["flops"].cast(pl.Float64).sum() or 0.0)


def apply_hints(ops: pl.DataFrame) -> pl.DataFrame:
    """Where the format reports FLOPs (XLA: the compiler's, or the HLO's shapes), they win over shape formulas.

    With them come the in-kernel recompute (a fused attention backward's Q·Kᵀ,
    counted in HFU, not in MFU) and an attention op's mask.
    """
    if ops["flops_hint"].null_count() == ops.height and ops["bytes_hint"].null_count() == ops.height:
        # No format reported any (a Kineto trace): every column below is kept as it is but the matmuls' dtype.
        return ops.with_columns(dtype=_dtype_from_types(ops))
    given = pl.col("matmul") & pl.col("flops_hint").is_not_null()
    in_range = pl.col("flops_hint").is_between(0, registry.OP_FLOPS_MAX) & pl.col("recompute_hint").fill_null(
        0
    ).is_between(0, registry.OP_FLOPS_MAX)
    hinted = given & in_range
    return ops.with_columns(
        flops=pl.when(hinted).then(pl.col("flops_hint")).when(given).then(None).otherwise(pl.col("flops")),
        effective_flops=pl.when(hinted)
        .then(pl.col("flops_hint"))
        .when(given)
        .then(None)
        .otherwise(pl.col("effective_flops")),
        recompute_flops=pl.when(hinted)
        .then(pl.col("recompute_hint").fill_null(0))
        .when(given)
        .then(0)
        .otherwise(pl.col("recompute_flops")),
        mask=pl.when(hinted & pl.col("mask_hint").is_not_null()).then(pl.col("mask_hint")).otherwise(pl.col("mask")),
        bytes=pl.coalesce(
            "bytes", pl.when(pl.col("bytes_hint").is_between(0, registry.OP_FLOPS_MAX)).then(pl.col("bytes_hint"))
        ),
        flops_reason=pl.when(hinted)
        .then(None)
        .when(given)
        .then(pl.lit(f"{registry.OUT_OF_RANGE}: the compiler's FLOPs"))
        .otherwise(pl.col("flops_reason")),
        dtype=_dtype_from_types(ops),
    )


def _dtype_from_types(ops: pl.DataFrame) -> pl.Series | pl.Expr:
    """A matmul op's dtype where no formula gave one: its first input's, read once per distinct `types` text (they
    repeat thousands of times), and only at the rows that need one (matching every op's long `types` text was most of
    this stage)."""
    need = ops.select(pl.col("matmul") & pl.col("dtype").is_null() & pl.col("types").is_not_null()).to_series()
    if not need.any():
        return ops["dtype"]
    rows = need.arg_true()
    types = ops["types"].gather(rows)
    distinct = types.unique()
    first = pl.Series([_first_dtype(t) for t in distinct.to_list()], dtype=pl.Utf8)
    dtype = types.replace_strict(distinct, first, default=None, return_dtype=pl.Utf8)
    found = pl.DataFrame({"row": rows, "dtype": dtype})
    # where one is needed the op has no dtype, so the one found (or none) is the op's: elsewhere its own stays
    return pl.coalesce(spread(found, ops.height)["dtype"], ops["dtype"]).alias("dtype")


def _first_dtype(types: str) -> str | None:
    t = orjson.loads(types)
    return dtype_of(t[0]) if isinstance(t, list) and t and isinstance(t[0], str) else None


# Kernels a GEMM or convolution library runs around its GEMM that only move data: layout transforms (cuDNN, MIOpen),
# tensor scaling and offset tables (cuDNN), sub-tensor ops (MIOpen), copies into a contiguous operand (PyTorch).
LAYOUT_KERNEL_RE = (
    r"(?i)nchwToNhwc|nhwcToNchw|NCHW2CNHW|CNHW2NCHW|batched_transpose"  # NCHW <-> NHWC around a convolution
)
AUX_KERNEL_RE = (
    LAYOUT_KERNEL_RE + r"|transpose|scalePackedTensor|compute[AB]?OffsetsKernel|SubTensorOp"
    r"|direct_copy_kernel|copy_device_to_device"
)

_SAYS_GEMM = (
    MATMUL_KERNEL_RE + r"|(?i:gemm|triton_tem|matmul|gemv)"
)  # a fused GEMM template (inductor's triton_tem_*) may name a transpose


def classify_kernels(kernels: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Matmul-class kernels: compute kernels launched under an executed leaf matmul op (but for its data movers), and
    every kernel whose name is a GEMM, convolution or attention library's (`flops.kernels`) wherever it was launched.

    The op's FLOPs are shared among its matmul kernels in proportion to duration.
    A kernel named as a layout transform or copy (`AUX_KERNEL_RE`, unless its
    name also says GEMM) does no FLOPs: other compute, unless it is all the op
    launched (its FLOPs then stay on it rather than vanish); so is a framework op's kernel
    that no library names beside one that is (a fused MoE's routing). A kernel told by
    its name alone (a graph replay, a framework op without a formula, a trace
    without host ops) is matmul time with unknown FLOPs, never other compute.
    """
    if kernels.height == 0:
        return kernels.with_columns(
            cls=pl.lit(None, pl.Utf8), matmul_row=pl.lit(None, pl.Int64), flops=pl.lit(None, pl.Float64)
        )
    op_row = kernels["op_row"].fill_null(-1).to_numpy()
    mm_row = np.full(kernels.height, -1)
    launched = np.flatnonzero(op_row >= 0)  # climbed from the ops that launched kernels only
    if len(launched):
        mm_row[launched] = nearest(ops["parent"].to_numpy(), ops["matmul"].to_numpy(), op_row[launched])
    kernels = kernels.with_columns(matmul_row=pl.Series(mm_row, dtype=pl.Int64)).with_columns(
        matmul_row=pl.when(pl.col("matmul_row") >= 0).then(pl.col("matmul_row"))
    )
    # Per matmul op, over its kernels: an any or a sum in numpy by op row, read back at each kernel (polars windows
    # over the op rows were half of this stage). A kernel without a matmul op takes none: nothing below reads it there.
    has = mm_row >= 0
    at = np.maximum(mm_row, 0)

    def any_of_op(flag: np.ndarray) -> pl.Series:
        seen = np.zeros(ops.height + 1, dtype=bool)
        seen[mm_row[has & flag]] = True
        return pl.Series(seen[at] & has)

    is_compute = (kernels["kind"] == "compute").fill_null(False).to_numpy()
    compute = pl.col("kind") == "compute"
    mover = name_matches(kernels["name"], AUX_KERNEL_RE, unless=_SAYS_GEMM)
    is_mm = compute & pl.col("matmul_row").is_not_null()
    if mover.any():
        is_mm = is_mm & (~mover | ~any_of_op(is_compute & ~mover.to_numpy()))  # a mover: unless all its op launched
    named = is_matmul_kernel(kernels["name"])
    if ops.height and "name" in ops.columns:
        # A framework op (not aten's) that launched named matmul kernels: its other kernels are routing, quantisation
        # or scatter work (a fused MoE's top-k, SageAttention's quantiser), not matmul time.
        # Decided per distinct op name and read at each kernel's matmul op (its name not gathered per kernel).
        names = Coded.of(ops["name"])
        d = names.distinct
        per_name = (d.str.contains("::", literal=True) & ~d.str.starts_with("aten::")).to_numpy()  # vllm::, aiter::
        framework = has & names.per_row(per_name, False)[at]
        aux = framework & ~named.to_numpy() & any_of_op(is_compute & named.to_numpy()).to_numpy()
        is_mm = is_mm & ~pl.Series(aux)
    is_mm = is_mm | (compute & named)
    kernels = kernels.with_columns(
        cls=pl.when(is_mm)
        .then(pl.lit("matmul"))
        .when(pl.col("kind") == "compute")
        .then(pl.lit("other_compute"))
        .otherwise(pl.col("kind"))
    )
    # Only the op's matmul kernels share its FLOPs (a memset it launched does none).
    matmul = (kernels["cls"] == "matmul").fill_null(False).to_numpy()
    dur = kernels["dur"].cast(pl.Float64).fill_null(0.0).to_numpy()  # a null duration adds nothing, as in a sum
    op_time = np.bincount(mm_row[has], weights=np.where(matmul, dur, 0.0)[has], minlength=ops.height + 1)
    share = pl.col("dur") / pl.Series(np.where(has, op_time[at], np.nan))
    op_flops = by_row(ops, kernels["matmul_row"], "flops").to_series()
    return kernels.with_columns(flops=pl.when(pl.col("cls") == "matmul").then(op_flops * share.fill_nan(1.0)))
