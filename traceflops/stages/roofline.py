"""Roofline of every device kernel: FLOPs, bytes moved, bound, and the time it could give back.

One row per kernel (same order as `Analysis.kernels`), from three inputs: the
kernels frame, the ops frame, and the device's peaks.

What each kernel did (`roof_flops`, `roof_bytes`, with `flops_basis` /
`bytes_basis` saying where the number comes from):

* matmul kernels (`cls == 'matmul'`): the leaf matmul op's effective FLOPs
  (a causal flash kernel's real work, see flops.py) and its `bytes` (inputs read
  + outputs written, from the registry), both split among the op's matmul
  kernels by duration share. Basis 'shapes'.
* other compute kernels: from the launching op's name, `Input Dims` and
  `Input type` (`op_estimate`), split among the op's compute kernels by
  duration share. The rules, per op family (aten ops only; an in-place
  `op_` is `op` writing into its first argument):

  ===========  =================================================  ====================  ==========
  family       bytes                                              FLOPs                 basis
  ===========  =================================================  ====================  ==========
  elementwise  input tensors read + output written. The output    1 per output element  'estimate'
               is the broadcast of the inputs, in the dtype of
               the largest (bool for comparisons); exact when     ('shapes' in place
               in place (the first argument) or when an `out=`     or with out=)
               tensor is recorded (a tensor past the op's inputs)
  norm         all inputs read + one output like the largest      5 per element of      'estimate'
               input (softmax, layer/batch/group/rms norm, bwd)   the largest input
  reduction    the reduced tensor read (the small output is       1 per element read    'estimate'
               neglected)
  copy         copy_: src read + dst written; fill_/zero_: dst    0                     'shapes'
               written; clone/contiguous: read + write                                  ('estimate')
  ===========  =================================================  ====================  ==========

  Anything else (other namespaces, tensor lists, unknown dtypes, no shapes)
  is null: an unknown is never guessed.
* where the op carries compiler hints (XLA: `bytes_hint`, `flops_hint`) and
  nothing better is known, those, with basis 'compiler'.
* communication, memcpy, memset: null (they have their own rows in the time
  partition).

Against which roof: matmul kernels use the tensor peak at the analysis
precision; other compute kernels the vector fp32 peak (they do not run on
tensor cores); both the HBM bandwidth. Then

    intensity      = roof_flops / roof_bytes               (FLOP/byte)
    ridge          = peak_flops / hbm_bytes_per_s
    bound          = 'memory' if intensity < ridge else 'compute'
    floor_us       = max(roof_flops / peak, roof_bytes / bandwidth)   (known terms only)
    recoverable_us = max(dur - floor_us, 0)                (null when neither term is known)
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import polars as pl

from traceflops.core.dtypes import dtype_of, itemsize
from traceflops.core.hardware import Hardware
from traceflops.stages.link import by_row, check_row_order, spread
from traceflops.stages.timeline import partition

COLUMNS = (
    "roof_flops",
    "flops_basis",
    "roof_bytes",
    "bytes_basis",
    "intensity",
    "peak_flops",
    "peak_bytes_per_s",
    "ridge",
    "achieved_flops_frac",
    "achieved_bw_frac",
    "bound",
    "floor_us",
    "recoverable_us",
)

# FLOPs per element, per family (rough on purpose: these kernels are far below their ridge).
FLOPS_PER_ELEMENT = {"elementwise": 1, "norm": 5, "reduction": 1, "copy": 0}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _arity(n: int, names: str) -> dict[str, int]:
    return dict.fromkeys(_words(names), n)


# Elementwise ops -> how many leading arguments may be input tensors; a tensor argument past
# them is an `out=` tensor (written, not read), as in `aten::mul(self, other, out)`.
_ELEMENTWISE: dict[str, int] = {
    **_arity(
        1,
        """neg abs exp exp2 expm1 log log1p log2 log10 sqrt rsqrt reciprocal square sigmoid
        tanh relu relu6 gelu silu mish elu selu celu leaky_relu hardtanh hardswish hardsigmoid
        softplus threshold sin cos tan erf erfc erfinv floor ceil round trunc frac sign sgn
        nan_to_num logical_not bitwise_not isnan isinf isfinite""",
    ),
    **_arity(
        2,
        """add sub rsub mul div true_divide pow maximum minimum fmax fmin fmod remainder
        clamp_min clamp_max eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and
        bitwise_or bitwise_xor threshold_backward gelu_backward silu_backward sigmoid_backward
        tanh_backward leaky_relu_backward hardtanh_backward hardswish_backward softplus_backward
        mish_backward""",
    ),
    **_arity(3, "clamp clip where masked_fill addcmul addcdiv lerp mse_loss_backward"),
    "elu_backward": 6,
}
_COMPARE = _words("eq ne lt le gt ge logical_and logical_or logical_xor logical_not isnan isinf isfinite")
_NORM = _words(
    """softmax _softmax log_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data
    layer_norm native_layer_norm native_layer_norm_backward batch_norm native_batch_norm
    native_batch_norm_backward cudnn_batch_norm cudnn_batch_norm_backward miopen_batch_norm
    miopen_batch_norm_backward group_norm native_group_norm native_group_norm_backward rms_norm
    _fused_rms_norm _fused_rms_norm_backward"""
)
_REDUCTION = _words(
    """sum mean amax amin max min argmax argmin prod norm linalg_vector_norm any all var std
    var_mean std_mean logsumexp"""
)
_COPY = _words("copy_ fill_ zero_ clone contiguous")


def family(name: str) -> tuple[str | None, str, bool]:
    """(family, base name, in place) of an op name; family None when there is no rule."""
    if not isinstance(name, str):
        return None, "", False
    n = name.strip()
    if n.startswith("aten::"):
        n = n[len("aten::") :]
    elif "::" in n:
        return None, n, False
    if n in _COPY:
        return "copy", n, n.endswith("_")
    inplace = n.endswith("_") and not n.endswith("__")
    base = n[:-1] if inplace else n
    if base in _ELEMENTWISE:
        return "elementwise", base, inplace
    if base in _NORM:
        return "norm", base, inplace
    if base in _REDUCTION and not inplace:
        return "reduction", base, False
    return None, base, inplace


def _tensors(dims, types) -> list[tuple[int, tuple[int, ...], int, str]] | None:
    """(argument index, shape, itemsize, type) of each tensor argument; None if any is unreadable."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(types) < len(dims):
        return None
    out = []
    for i, (d, t) in enumerate(zip(dims, types)):
        if not isinstance(d, list):
            return None
        is_shape = all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)
        size = itemsize(t) if isinstance(t, str) else None
        if is_shape and size is not None and dtype_of(t) is not None:
            out.append((i, tuple(d), size, t))
        elif d:  # a non-empty shape we cannot price (tensor list, unknown dtype)
            return None
        # [] with 'Scalar', 'ScalarList', '' ...: not a tensor
    return out


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    nd = max(len(s) for s in shapes)
    out = []
    for k in range(1, nd + 1):
        sizes = {s[-k] for s in shapes if len(s) >= k} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(reversed(out))


def op_estimate(name: str, dims, types) -> tuple[float | None, float | None, str | None, str | None]:
    """(bytes, FLOPs, bytes_basis, flops_basis) of one non-matmul op from its recorded inputs.

    `dims` and `types` are the decoded `Input Dims` / `Input type` lists. Rules in the module doc.
    """
    fam, base, inplace = family(name)
    if fam is None:
        return None, None, None, None
    ts = _tensors(dims, types)
    if not ts:
        return None, None, None, None
    numel = [math.prod(s) for _, s, _, _ in ts]
    nbytes = [n * size for n, (_, _, size, _) in zip(numel, ts)]
    reads = float(sum(nbytes))
    big = max(range(len(ts)), key=lambda j: (numel[j], ts[j][2]))
    per = FLOPS_PER_ELEMENT[fam]
    if fam == "copy":
        if ts[0][0] != 0:
            return None, None, None, None
        if base in ("fill_", "zero_"):
            return float(nbytes[0]), 0.0, "shapes", "estimate"
        if base == "copy_":
            return reads, 0.0, "shapes", "estimate"
        return 2.0 * nbytes[0], 0.0, "estimate", "estimate"
    if fam == "reduction":
        if ts[0][0] != 0:
            return None, None, None, None
        return float(nbytes[0]), float(per * numel[0]), "estimate", "estimate"
    if fam == "norm":
        return reads + nbytes[big], float(per * numel[big]), "estimate", "estimate"
    # elementwise: tensors past the op's inputs are out= tensors
    n_in = _ELEMENTWISE[base]
    ins = [j for j, t in enumerate(ts) if t[0] < n_in]
    outs = [j for j, t in enumerate(ts) if t[0] >= n_in]
    if not ins:
        return None, None, None, None
    in_bytes = float(sum(nbytes[j] for j in ins))
    if inplace:
        if ts[0][0] != 0 or outs:
            return None, None, None, None
        return in_bytes + nbytes[0], float(per * numel[0]), "shapes", "estimate"
    if outs:
        return in_bytes + sum(nbytes[j] for j in outs), float(per * max(numel[j] for j in outs)), "shapes", "estimate"
    shape = _broadcast([ts[j][1] for j in ins])
    top = max(numel[j] for j in ins)
    out_numel = math.prod(shape) if shape is not None else top
    size = 1 if base in _COMPARE else max(ts[j][2] for j in ins if numel[j] == top)
    return in_bytes + out_numel * size, float(per * out_numel), "estimate", "estimate"


def estimate_table(ops: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    """op_estimate once per distinct (name, dims, types) among `rows` of ops."""
    schema = {
        "row": pl.Int64,
        "_e_bytes": pl.Float64,
        "_e_flops": pl.Float64,
        "_e_bbasis": pl.Utf8,
        "_e_fbasis": pl.Utf8,
    }
    # Gathered at the rows, in row order (linked ops keep row == position): no membership test over every op.
    at = rows.drop_nulls().unique().sort().cast(pl.Int64)
    at = at.filter((at >= 0) & (at < ops.height))  # a row that is no op's matches nothing, as by membership
    check_row_order(ops)
    sub = ops.select(pl.col(c).gather(at) for c in ("row", "name", "dims", "types"))
    if sub.height == 0:
        return pl.DataFrame(schema=schema)
    keys = ["name", "dims", "types"]
    uniq = sub.select(keys).unique()
    cols: dict[str, list] = {"_e_bytes": [], "_e_flops": [], "_e_bbasis": [], "_e_fbasis": []}
    for name, dims, types in uniq.iter_rows():
        try:
            d = orjson.loads(dims) if dims is not None else None
            t = orjson.loads(types) if types is not None else None
            r = op_estimate(name, d, t)
        except (orjson.JSONDecodeError, TypeError, ValueError):
            r = (None, None, None, None)
        for k, v in zip(cols, r):
            cols[k].append(v)
    est = pl.concat([uniq, pl.DataFrame(cols, schema={k: schema[k] for k in cols})], how="horizontal")
    return sub.join(est, on=keys, how="left", nulls_equal=True).select(list(schema))


def _col(frame: pl.DataFrame, name: str, dtype) -> pl.Expr:
    return pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype).alias(name)


def _share(k: pl.DataFrame, key: str, cls: str) -> pl.Series:
    """Duration share of each kernel of class `cls` among the kernels of that class that share its `key` (equal shares
    where their durations sum to zero), null for the other classes; the kernels without a key share one group.

    Summed by bincount over the keys (op rows): a window over each key was most of this stage's time.
    """
    mine = (k["cls"] == cls).fill_null(False).to_numpy()
    dur = k["dur"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    keys = k[key].cast(pl.Int64)
    lo = keys.min() if keys.null_count() < keys.len() else 0
    group = (keys - lo).fill_null(-1).to_numpy()
    group = np.where(group < 0, group.max(initial=0) + 1, group)  # no key: a group of its own
    timed = mine & ~np.isnan(dur)
    size = int(group.max(initial=0)) + 1
    den = np.bincount(group[timed], weights=dur[timed], minlength=size)[group]
    cnt = np.bincount(group[timed], minlength=size)[group]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(den > 0, dur / den, 1.0 / cnt)
    return pl.Series(np.where(mine, share, np.nan), dtype=pl.Float64).fill_nan(None)


def roofline(kernels: pl.DataFrame, ops: pl.DataFrame, hardware: Hardware | None, precision: str) -> pl.DataFrame:
    """One row per kernel (kernels' order): kernel_id, name, cls, dur and COLUMNS."""
    tensor_peak = hardware.peak(precision) if hardware is not None and precision else None
    vector_peak = hardware.peak("vector_fp32") if hardware is not None else None
    hbm = hardware.hbm_bytes_per_s if hardware is not None else None

    opc = ops.select(
        pl.col("row").cast(pl.Int64),
        _col(ops, "flops", pl.Float64).alias("_o_flops"),
        _col(ops, "effective_flops", pl.Float64).alias("_o_eff"),
        _col(ops, "bytes", pl.Float64).alias("_o_bytes"),
        _col(ops, "flops_hint", pl.Float64).alias("_o_fhint"),
        _col(ops, "bytes_hint", pl.Float64).alias("_o_bhint"),
    )
    k = kernels.select(
        "kernel_id",
        "name",
        "cls",
        pl.col("dur").cast(pl.Float64),
        pl.col("op_row").cast(pl.Int64),
        pl.col("matmul_row").cast(pl.Int64),
    )
    est = estimate_table(ops, k.filter(pl.col("cls") == "other_compute")["op_row"])
    # Op columns at the kernels' op rows by position (linked ops keep row == position): no joins.
    values = [c for c in opc.columns if c != "row"]
    at_mm = by_row(opc, k["matmul_row"], *values)
    at_op = by_row(opc, k["op_row"], *values)
    at_est = spread(est, ops.height, k["op_row"])
    k = pl.concat([k, at_mm.rename({c: f"m{c}" for c in at_mm.columns}), at_op, at_est], how="horizontal")
    k = k.with_columns(_mm_share=_share(k, "matmul_row", "matmul"), _oc_share=_share(k, "op_row", "other_compute"))
    mm = pl.col("cls") == "matmul"
    oc = pl.col("cls") == "other_compute"
    mm_flops = pl.coalesce("m_o_eff", "m_o_flops")
    oc_flops = pl.coalesce("_e_flops", "_o_fhint")
    oc_bytes = pl.coalesce("_e_bytes", "_o_bhint")
    k = k.with_columns(
        roof_flops=pl.when(mm)
        .then(pl.coalesce(mm_flops, "m_o_fhint") * pl.col("_mm_share"))
        .when(oc)
        .then(oc_flops * pl.col("_oc_share")),
        flops_basis=pl.when(mm & mm_flops.is_not_null())
        .then(pl.lit("shapes"))
        .when(mm & pl.col("m_o_fhint").is_not_null())
        .then(pl.lit("compiler"))
        .when(oc & pl.col("_e_flops").is_not_null())
        .then(pl.col("_e_fbasis"))
        .when(oc & pl.col("_o_fhint").is_not_null())
        .then(pl.lit("compiler")),
        roof_bytes=pl.when(mm)
        .then(pl.coalesce("m_o_bytes", "m_o_bhint") * pl.col("_mm_share"))
        .when(oc)
        .then(oc_bytes * pl.col("_oc_share")),
        bytes_basis=pl.when(mm & pl.col("m_o_bytes").is_not_null())
        .then(pl.lit("shapes"))
        .when(mm & pl.col("m_o_bhint").is_not_null())
        .then(pl.lit("compiler"))
        .when(oc & pl.col("_e_bytes").is_not_null())
        .then(pl.col("_e_bbasis"))
        .when(oc & pl.col("_o_bhint").is_not_null())
        .then(pl.lit("compiler")),
        peak_flops=pl.when(mm).then(pl.lit(tensor_peak, pl.Float64)).when(oc).then(pl.lit(vector_peak, pl.Float64)),
        peak_bytes_per_s=pl.when(mm | oc).then(pl.lit(hbm, pl.Float64)),
    )
    secs = pl.when(pl.col("dur") > 0).then(pl.col("dur") * 1e-6)
    flops_us = pl.col("roof_flops") / pl.col("peak_flops") * 1e6
    bytes_us = pl.col("roof_bytes") / pl.col("peak_bytes_per_s") * 1e6
    k = k.with_columns(
        intensity=pl.when(pl.col("roof_bytes") > 0).then(pl.col("roof_flops") / pl.col("roof_bytes")),
        ridge=pl.col("peak_flops") / pl.col("peak_bytes_per_s"),
        achieved_flops_frac=pl.col("roof_flops") / secs / pl.col("peak_flops"),
        achieved_bw_frac=pl.col("roof_bytes") / secs / pl.col("peak_bytes_per_s"),
        floor_us=pl.max_horizontal(flops_us, bytes_us),
    ).with_columns(
        bound=pl.when(pl.col("intensity").is_null() | pl.col("ridge").is_null())
        .then(None)
        .when(pl.col("intensity") < pl.col("ridge"))
        .then(pl.lit("memory"))
        .otherwise(pl.lit("compute")),
        recoverable_us=(pl.col("dur") - pl.col("floor_us")).clip(lower_bound=0.0),
    )
    return k.select("kernel_id", "name", "cls", "dur", *COLUMNS)


def memory_bound_overlay(frame: pl.DataFrame) -> pl.Series:
    """Boolean mask over the roofline frame's rows (= the kernels' rows): memory-bound kernels."""
    return (frame["bound"] == "memory").fill_null(False).alias("memory_bound")


def memory_bound_partition(kernels: pl.DataFrame, frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The time partition of the memory-bound kernels alone (their union over streams per step and device: the
    `memory_bound` overlay); an empty frame when no kernel is memory-bound."""
    bound = kernels.filter(memory_bound_overlay(frame))
    if bound.height == 0:
        return pl.DataFrame()
    return partition(bound, steps.select("step", "name", "ts", "dur", "start", "window"))


def top_recoverable(frame: pl.DataFrame, n: int = 20) -> pl.DataFrame:
    """Kernel names with the most recoverable time: count, time, recoverable, median intensity, bound.

    `bound` is the bound of most of the name's time (null when none is known);
    `known` counts the kernels whose recoverable time is known.
    """
    dur_if = lambda b: pl.when(pl.col("bound") == b).then(pl.col("dur")).sum()
    out = (
        frame.group_by("name")
        .agg(
            pl.col("cls").sort_by("dur", descending=True).first(),  # the class of most of its time
            pl.len().alias("count"),
            pl.col("recoverable_us").is_not_null().sum().alias("known"),
            pl.col("dur").sum().alias("dur_us"),
            pl.col("recoverable_us").sum().alias("recoverable_us"),
            pl.col("intensity").median().alias("median_intensity"),
            pl.col("achieved_bw_frac").median().alias("median_bw_frac"),
            pl.col("achieved_flops_frac").median().alias("median_flops_frac"),
            dur_if("memory").alias("_mem"),
            dur_if("compute").alias("_cmp"),
            pl.col("bound").is_not_null().any().alias("_any"),
        )
        .with_columns(
            bound=pl.when(~pl.col("_any"))
            .then(None)
            .when(pl.col("_mem") >= pl.col("_cmp"))
            .then(pl.lit("memory"))
            .otherwise(pl.lit("compute"))
        )
        .drop("_mem", "_cmp", "_any")
        .sort(["recoverable_us", "dur_us", "name"], descending=[True, True, False])
    )
    return out.head(n)
