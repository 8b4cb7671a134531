"""Roll-up of device time and FLOPs per GEMM shape: the executed matmul ops' (M, N, K, batch) and convolutions as
implicit GEMMs, with how their output tiles fill the device's SMs in waves (wave quantization)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import polars as pl

from traceflops.core import hardware as hw
from traceflops.core.sections import Hardware
from traceflops.flops.aten import OP_FLOPS_MAX

GEMM_TILE = 128  # output tile edge assumed by the wave-quantization hint (128×128)
GEMM_TIME_MATTERS = 0.01  # share of all matmul kernel time from which a GEMM's hint is raised
_GEMM_OPS = frozenset(f"aten::{n}" for n in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear"))


def _shape(d) -> tuple[int, ...] | None:
    if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        return None
    return tuple(d)


def gemm_dims(name: str, dims) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of a matmul-family op from its `Input Dims`; None when they do not fit.

    A shape of more than `OP_FLOPS_MAX` FLOPs is no real op's (the FLOP count leaves it out and says so): it is
    no shape either, so tiles and waves never leave int64.
    """
    got = _gemm_dims(name, dims)
    if got is None:
        return None
    m, n, k, batch = got
    return got if 2 * m * n * k * batch <= OP_FLOPS_MAX and max(got) <= OP_FLOPS_MAX else None


def _gemm_dims(name: str, dims) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) as recorded, unbounded.

    mm(a[M,K], b[K,N]); addmm(bias, a, b); bmm(a[B,M,K], b[B,K,N]); baddbmm(bias, a, b);
    linear(x[..., K], w[N, K]) folds the leading dims of x into M; matmul follows
    torch.matmul: a 2-D right operand folds the left one's leading dims into M
    (one GEMM), otherwise the broadcast batch dims are the batch, and a 1-D
    operand is a vector (M or N = 1).
    """
    if not isinstance(dims, list):
        return None
    base = name[len("aten::") :] if isinstance(name, str) and name.startswith("aten::") else name
    ia, ib = (1, 2) if base in ("addmm", "baddbmm") else (0, 1)
    if len(dims) <= ib:
        return None
    a, b = _shape(dims[ia]), _shape(dims[ib])
    if a is None or b is None:
        return None
    if base in ("mm", "addmm"):
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            return None
        return a[0], b[1], a[1], 1
    if base in ("bmm", "baddbmm"):
        if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
            return None
        return a[1], b[2], a[2], a[0]
    if base == "linear":
        if not a or len(b) not in (1, 2) or a[-1] != b[-1]:
            return None
        return math.prod(a[:-1]), (b[0] if len(b) == 2 else 1), a[-1], 1
    if base == "matmul":
        if not a or not b:
            return None
        if len(b) == 1:
            return (math.prod(a[:-1]), 1, a[-1], 1) if a[-1] == b[0] else None
        if len(a) == 1:
            return (1, b[-1], a[0], math.prod(b[:-2])) if a[0] == b[-2] else None
        if a[-1] != b[-2]:
            return None
        if len(b) == 2:
            return math.prod(a[:-1]), b[1], a[-1], 1
        batch = []
        for i in range(1, max(len(a), len(b)) - 1):
            x = a[-2 - i] if len(a) >= 2 + i else 1
            y = b[-2 - i] if len(b) >= 2 + i else 1
            if x != y and 1 not in (x, y):
                return None
            batch.append(max(x, y) if 1 in (x, y) else x)
        return a[-2], b[-1], a[-1], math.prod(batch)
    return None


# Convolutions as implicit GEMMs. Every pass is shown by its forward convolution's GEMM: M = N·Hout·Wout (output
# positions), N = Cout, K = Cin/groups·kh·kw, so that 2·M·N·K is the pass's FLOPs and the three passes of one layer
# share M×N×K; `conv` names the pass. Per op name: (pass, dims index of the input x, of grad_output, of the weight);
# transposed convolutions are left out (their GEMM is another).
_CONV_FWD_NAMES = (
    "convolution",
    "_convolution",
    "convolution_overrideable",
    "conv1d",
    "conv2d",
    "conv3d",
    "_convolution_mode",
    "cudnn_convolution",
    "cudnn_convolution_relu",
    "miopen_convolution_relu",
    "cudnn_convolution_add_relu",
    "miopen_convolution_add_relu",
    "miopen_convolution",
    "miopen_depthwise_convolution",
    "mkldnn_convolution",
    "_slow_conv2d_forward",
    "thnn_conv2d",
    "thnn_conv2d_forward",
    "slow_conv3d_forward",
    "slow_conv3d",
    "thnn_conv3d",
    "slow_conv_dilated2d",
    "slow_conv_dilated3d",
    "_conv_depthwise2d",
    "conv_depthwise3d",
    "thnn_conv_depthwise2d",
    "thnn_conv_depthwise2d_forward",
    "_nnpack_spatial_convolution",
)
_CONV_OPS: dict[str, tuple[str, int | None, int | None, int | None]] = {
    **{f"aten::{n}": ("fwd", 0, None, 1) for n in _CONV_FWD_NAMES},
    **{
        f"aten::{n}": ("bwd", None, 0, 2)
        for n in (
            "convolution_backward",
            "convolution_backward_overrideable",
            "_slow_conv2d_backward",
            "thnn_conv2d_backward",
            "slow_conv3d_backward",
        )
    },
    **{
        f"aten::{n}": ("bwd", None, 1, 2)
        for n in (
            "cudnn_convolution_backward",
            "miopen_convolution_backward",
            "miopen_depthwise_convolution_backward",
            "mkldnn_convolution_backward",
        )
    },
    **{
        f"aten::{n}": ("dgrad", None, 1, 2)
        for n in (
            "cudnn_convolution_backward_input",
            "miopen_convolution_backward_input",
            "miopen_depthwise_convolution_backward_input",
        )
    },
    **{
        f"aten::{n}": ("wgrad", None, 1, None)
        for n in (
            "cudnn_convolution_backward_weight",
            "miopen_convolution_backward_weight",
            "miopen_depthwise_convolution_backward_weight",
        )
    },
}
CONV_OPS = frozenset(_CONV_OPS)


def conv_dims(name: str, dims, flops) -> tuple[int, int, int, str, int, int] | None:
    """A convolution op as an implicit GEMM: (M, N, K, pass, out_rows, out_cols), or None when it does not fit.

    M, N, K are the forward convolution's GEMM (M = N·Hout·Wout, N = Cout, K = Cin/groups·kh·kw) whatever the pass;
    what shapes cannot give (the output positions of a forward whose stride and padding are not recorded, the kernel
    size of a weight gradient) comes from the op's FLOPs, which must then be 2·M·N·K (once per pass: a
    convolution_backward that computed both gradients is 'dgrad+wgrad'). out_rows × out_cols is the GEMM output whose
    tiles fill the device: M × Cout for the forward, M × Cin for the input gradient (the grad-output positions: a
    strided convolution's input gradient has stride² more rows), Cout × K for the weight gradient.
    """
    spec = _CONV_OPS.get(name)
    if spec is None or not isinstance(dims, list) or flops is None or flops <= 0:
        return None
    kind, ix, igo, iw = spec
    flops = int(flops)

    def shape(i):
        return _shape(dims[i]) if i is not None and i < len(dims) else None

    x, go, w = shape(ix), shape(igo), shape(iw)
    if w is not None and (len(w) < 3 or min(w) < 1):
        return None
    if kind == "fwd":
        if w is None or x is None or len(x) != len(w) or x[1] % w[1] or x[0] < 1:
            return None
        n, k = w[0], w[1] * math.prod(w[2:])
        if flops % (2 * n * k):
            return None
        m = flops // (2 * n * k)
        if m % x[0]:
            return None
        return m, n, k, "fwd", m, n
    if go is None or len(go) < 3 or min(go) < 1:
        return None
    m, n = go[0] * math.prod(go[2:]), go[1]
    if kind == "wgrad":
        if w is not None or flops % (2 * m * n):
            return None
        k = flops // (2 * m * n)
        return m, n, k, "wgrad", n, k
    if w is None or len(w) != len(go) or w[0] != n:
        return None
    k = w[1] * math.prod(w[2:])
    passes, rest = divmod(flops, 2 * m * n * k)
    if rest or passes not in (1, 2) or (kind == "dgrad" and passes != 1):
        return None
    if kind == "dgrad":
        return m, n, k, "dgrad", m, w[1]
    return m, n, k, ("dgrad+wgrad" if passes == 2 else "bwd"), m, w[1]


def first_tensor_dtype(types) -> str | None:
    """The first tensor element type among an op's recorded input types (a backward convolution's first input is a
    size list)."""
    from traceflops.core.dtypes import dtype_of

    try:
        t = orjson.loads(types) if isinstance(types, str) else None
    except orjson.JSONDecodeError:
        return None
    for x in t if isinstance(t, list) else []:
        d = dtype_of(x) if isinstance(x, str) else None
        if d:
            return d
    return None


def _units(hardware: hw.Hardware | Hardware | str | None) -> int | None:
    """SMs / CUs of a Hardware row, an `Analysis.hardware` section, or a name."""
    if hardware is None:
        return None
    if isinstance(hardware, hw.Hardware):
        return hardware.compute_units
    name = hardware if isinstance(hardware, str) else hardware.name  # a name, or the report's section
    h = hw.lookup(name) if isinstance(name, str) else None
    return h.compute_units if h is not None else None


def wave_quantization(m: int, n: int, batch: int, units: int | None, tile: int = GEMM_TILE) -> dict:
    """Tiles of a GEMM's output and how they fill the SMs in waves.

    tiles = ceil(M/tile)·ceil(N/tile)·batch; waves = tiles / units;
    efficiency = tiles / (ceil(waves)·units); last_wave_fill = the share of
    the SMs the last wave occupies. Waves are null when `units` is unknown.
    """
    tiles = math.ceil(m / tile) * math.ceil(n / tile) * batch
    if not units or tiles == 0:
        return {"tiles": tiles, "waves": None, "wave_efficiency": None, "last_wave_fill": None}
    full = math.ceil(tiles / units)
    return {
        "tiles": tiles,
        "waves": tiles / units,
        "wave_efficiency": tiles / (full * units),
        "last_wave_fill": (tiles - (full - 1) * units) / units,
    }


def by_gemm_shape(
    ops: pl.DataFrame, kernels: pl.DataFrame, hardware: hw.Hardware | Hardware | str | None
) -> pl.DataFrame:
    """Per GEMM shape (M, N, K, batch, dtype, conv) of the executed leaf matmul ops.

    Ops: aten::mm, addmm, bmm, baddbmm, matmul, linear that are leaf matmuls
    (`matmul`) and ran (`ran`), with dims read from `Input Dims` (see
    `gemm_dims`), and the convolutions (forward and backward, not transposed)
    as implicit GEMMs (`conv_dims`: M = N·Hout·Wout, N = Cout, K =
    Cin/groups·kh·kw, `conv` the pass: fwd, dgrad, wgrad, dgrad+wgrad, bwd;
    null for a GEMM; tiles count the pass's own output). A backward
    convolution's dtype is its first tensor input's. Columns: M, N, K, batch, dtype, ops (the op names), count
    (op calls), kernels (their matmul-class kernels), time_us (those kernels'
    summed duration), share (of the time of all matmul-class kernels), flops
    (the ops' FLOPs), tflops (flops over time_us of the calls whose FLOPs are
    known), then the wave-quantization columns of `wave_quantization` with a
    128×128 output tile and the device's SMs (`hardware`: a Hardware row, the
    `Analysis.hardware` dict, a name, or None), and `wave_hint`: the last wave
    is under half full and the shape takes at least 1% of matmul time, with
    `hint` saying why, and `conv`. Sorted by time, longest first.
    """
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        "M": pl.Int64,
        "N": pl.Int64,
        "K": pl.Int64,
        "batch": pl.Int64,
        "dtype": pl.Utf8,
        "ops": pl.List(pl.Utf8),
        "count": pl.Int64,
        "kernels": pl.Int64,
        "time_us": pl.Float64,
        "share": pl.Float64,
        "flops": pl.Float64,
        "tflops": pl.Float64,
        "tiles": pl.Int64,
        "waves": pl.Float64,
        "wave_efficiency": pl.Float64,
        "last_wave_fill": pl.Float64,
        "wave_hint": pl.Boolean,
        "hint": pl.Utf8,
        "conv": pl.Utf8,
    }
    need = {"row", "name", "dims", "matmul", "ran"}
    if ops.height == 0 or not need <= set(ops.columns):
        return pl.DataFrame(schema=schema)
    names = list(_GEMM_OPS | CONV_OPS)
    leaf = ops.filter(pl.col("matmul") & pl.col("ran") & pl.col("name").is_in(names) & pl.col("dims").is_not_null())
    leaf = leaf.select(
        pl.col("row").cast(pl.Int64),
        "name",
        "dims",
        (pl.col("dtype") if "dtype" in ops.columns else pl.lit(None, pl.Utf8)).alias("dtype"),
        (pl.col("flops").cast(pl.Float64) if "flops" in ops.columns else pl.lit(None, pl.Float64)).alias("flops"),
        (pl.col("types") if "types" in ops.columns else pl.lit(None, pl.Utf8)).alias("_types"),
    )
    # a convolution's shape needs its FLOPs too (see conv_dims): parsed once per distinct (name, dims, FLOPs)
    conv = pl.col("name").is_in(list(CONV_OPS))
    leaf = leaf.with_columns(_key=pl.when(conv).then(pl.col("flops")))
    parsed: dict[str, list[Any]] = {
        "name": [],
        "dims": [],
        "_key": [],
        "M": [],
        "N": [],
        "K": [],
        "batch": [],
        "conv": [],
        "_om": [],
        "_on": [],
    }
    for name, dims, key in leaf.select("name", "dims", "_key").unique().iter_rows():
        try:
            d = orjson.loads(dims)
            got: tuple[int, int, int, int, str | None, int, int] | None
            if name in CONV_OPS:
                c = conv_dims(name, d, key)
                got = None if c is None else (c[0], c[1], c[2], 1, c[3], c[4], c[5])
            else:
                g = gemm_dims(name, d)
                got = None if g is None else (*g, None, g[0], g[1])
        except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
            got = None
        if got is None or 2 * got[0] * got[1] * got[2] * got[3] > OP_FLOPS_MAX:
            continue
        for k, v in zip(
            ("name", "dims", "_key", "M", "N", "K", "batch", "conv", "_om", "_on"), (name, dims, key, *got)
        ):
            parsed[k].append(v)
    shapes = pl.DataFrame(
        parsed,
        schema={
            "name": pl.Utf8,
            "dims": pl.Utf8,
            "_key": pl.Float64,
            "M": pl.Int64,
            "N": pl.Int64,
            "K": pl.Int64,
            "batch": pl.Int64,
            "conv": pl.Utf8,
            "_om": pl.Int64,
            "_on": pl.Int64,
        },
    )
    leaf = leaf.join(shapes, on=["name", "dims", "_key"], how="inner", nulls_equal=True)
    if leaf.height == 0:
        return pl.DataFrame(schema=schema)
    # a backward convolution's first input is a size list, so the op's dtype (its first input's) is unknown
    types = leaf.filter(pl.col("dtype").is_null() & pl.col("_types").is_not_null())["_types"].unique().to_list()
    if types:
        first = pl.DataFrame(
            {"_types": types, "_t_dtype": [first_tensor_dtype(t) for t in types]},
            schema={"_types": pl.Utf8, "_t_dtype": pl.Utf8},
        )
        leaf = leaf.join(first, on="_types", how="left").with_columns(dtype=pl.coalesce("dtype", "_t_dtype"))
    mm = kernels.filter(pl.col("cls") == "matmul") if kernels.height and "cls" in kernels.columns else None
    if mm is not None and mm.height:
        per_op = mm.group_by(pl.col("matmul_row").cast(pl.Int64).alias("row")).agg(
            pl.len().cast(pl.Int64).alias("_k"), pl.col("dur").cast(pl.Float64).sum().alias("_t")
        )
        total_mm = float(mm["dur"].sum())
    else:
        per_op = pl.DataFrame(schema={"row": pl.Int64, "_k": pl.Int64, "_t": pl.Float64})
        total_mm = 0.0
    leaf = leaf.join(per_op, on="row", how="left").with_columns(pl.col("_k").fill_null(0), pl.col("_t").fill_null(0.0))
    known = pl.col("flops").is_not_null()
    out = (
        leaf.group_by("M", "N", "K", "batch", "dtype", "conv")
        .agg(
            pl.col("_om").first(),
            pl.col("_on").first(),
            pl.col("name").unique().sort().alias("ops"),
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("_k").sum().cast(pl.Int64).alias("kernels"),
            pl.col("_t").sum().alias("time_us"),
            pl.when(known.any()).then(pl.col("flops").sum()).alias("flops"),
            pl.col("_t").filter(known).sum().alias("_known_us"),
        )
        .with_columns(
            share=(pl.col("time_us") / total_mm) if total_mm else pl.lit(None, pl.Float64),
            tflops=pl.when(pl.col("_known_us") > 0).then(pl.col("flops") / (pl.col("_known_us") * 1e-6) / 1e12),
        )
    )
    units = _units(hardware)
    waves = [wave_quantization(m, n, b, units) for m, n, b in out.select("_om", "_on", "batch").iter_rows()]
    out = out.with_columns(
        tiles=pl.Series([w["tiles"] for w in waves], dtype=pl.Int64),
        waves=pl.Series([w["waves"] for w in waves], dtype=pl.Float64),
        wave_efficiency=pl.Series([w["wave_efficiency"] for w in waves], dtype=pl.Float64),
        last_wave_fill=pl.Series([w["last_wave_fill"] for w in waves], dtype=pl.Float64),
    )
    # a weight gradient reduces over N·Hout·Wout, which cuDNN / MIOpen split across the SMs: its few output tiles are
    # no wave-quantization loss
    flag = (
        (pl.col("last_wave_fill") < 0.5)
        & (pl.col("share") >= GEMM_TIME_MATTERS)
        & (pl.col("conv").fill_null("") != "wgrad")
    )
    out = out.with_columns(wave_hint=flag.fill_null(False))
    hints: list[str | None] = []
    for r in out.iter_rows(named=True):
        if not r["wave_hint"]:
            hints.append(None)
        elif r["waves"] < 1:
            hints.append(
                f"{r['tiles']} output tiles of {GEMM_TILE}x{GEMM_TILE} for {units} compute units (SMs): only "
                f"{r['wave_efficiency']:.0%} of them get work; a larger M/N/batch (or split-K) fills them"
            )
        else:
            hints.append(
                f"{r['tiles']} tiles = {r['waves']:.2f} waves on {units} compute units (SMs): the last wave is "
                f"{r['last_wave_fill']:.0%} full ({r['wave_efficiency']:.0%} efficiency); a shape whose tile "
                f"count is a multiple of {units} (or just under it) removes the tail"
            )
    out = out.with_columns(hint=pl.Series(hints, dtype=pl.Utf8))
    return out.select(list(schema)).sort(
        ["time_us", "M", "N", "K", "batch", "conv"],
        descending=[True, False, False, False, False, False],
        nulls_last=True,
    )
