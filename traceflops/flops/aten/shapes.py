"""Reading a recorded op's arguments: Input Dims / Input type / Concrete Inputs, dtypes, byte sizes and bounds.

Every formula module counts from the same view of an event (Args) and reports the same result (R), so the
parsing, validation (Bad) and the out-of-range bound live here once, below all formulas.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from traceflops.core.dtypes import dtype_of, itemsize

# One op's FLOPs above this (2.9e17: minutes of a whole accelerator's peak) are not a real op's: the shapes
# are corrupt or hostile, and summing such values would wrap the 64-bit counters.
OP_FLOPS_MAX = 1 << 58
OUT_OF_RANGE = "out of range"


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------


# c10::ScalarType enum value (how Concrete Inputs records a dtype argument) -> profiler type string
_SCALAR_TYPE_NUM: dict[int, str] = {
    0: "unsigned char",
    1: "signed char",
    2: "short int",
    3: "int",
    4: "long int",
    5: "c10::Half",
    6: "float",
    7: "double",
    8: "c10::complex<c10::Half>",
    9: "c10::complex<float>",
    10: "c10::complex<double>",
    11: "bool",
    12: "c10::qint8",
    13: "c10::quint8",
    14: "c10::qint32",
    15: "c10::BFloat16",
    16: "c10::quint4x2",
    17: "c10::quint2x4",
    23: "c10::Float8_e5m2",
    24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz",
    27: "short unsigned int",
    28: "unsigned int",
    29: "long unsigned int",
    44: "c10::Float8_e8m0fnu",
    45: "c10::Float4_e2m1fn_x2",
}


def is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def valid_shape(dims: Any) -> bool:
    return isinstance(dims, (list, tuple)) and all(is_int(d) and d >= 0 for d in dims)


def tensor_bytes(dims, type_str) -> int | None:
    """Bytes of a dense tensor with these dims and this profiler type string; None if unknown."""
    size = itemsize(type_str)
    if size is None or not valid_shape(dims):
        return None
    return math.prod(dims) * size


# --------------------------------------------------------------------------------------
# argument access
# --------------------------------------------------------------------------------------


class Bad(Exception):
    """Inputs do not allow a count; the message is the reason."""


_BOOL_STR = {"true": True, "false": False}


def _parse_scalar(s: Any) -> Any:
    """Concrete input -> python value (int, float, bool, list, str) or None when empty."""
    if s is None:
        return None
    if isinstance(s, (bool, int, float)):
        return s
    if isinstance(s, (list, tuple)):
        return [_parse_scalar(x) for x in s]
    if not isinstance(s, str):
        return None
    t = s.strip()
    if t == "":
        return None
    if t.lower() in _BOOL_STR:
        return _BOOL_STR[t.lower()]
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        if inner == "":
            return []
        return [_parse_scalar(p) for p in inner.split(",")]
    if re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    try:
        return float(t)
    except ValueError:
        return t


class Args:
    def __init__(self, dims: list, types: list | None, concrete: list | None, context: dict | None = None):
        self.dims = dims
        self.types = types if isinstance(types, (list, tuple)) else None
        self.concrete = concrete if isinstance(concrete, (list, tuple)) else None
        self.context = context if isinstance(context, dict) else None  # facts from outside the event

    def with_dims(self, dims: list) -> Args:
        """The same arguments seen through other shapes (a dense view of a packed batch)."""
        return Args(dims, self.types, self.concrete, self.context)

    def __len__(self) -> int:
        return len(self.dims)

    def type(self, i: int | None) -> str | None:
        if i is None or self.types is None or not (0 <= i < len(self.types)):
            return None
        t = self.types[i]
        return t if isinstance(t, str) else None

    def is_tensor(self, i: int | None) -> bool:
        """Whether argument i is a (defined) tensor."""
        if i is None or not (0 <= i < len(self.dims)):
            return False
        if self.types is not None:
            return dtype_of(self.type(i) or "") is not None
        d = self.dims[i]
        return isinstance(d, (list, tuple)) and len(d) > 0 and valid_shape(d)

    def shape(self, i: int, what: str, ndims: tuple[int, ...] | None = None, min_ndim: int = 1) -> tuple[int, ...]:
        if not (0 <= i < len(self.dims)):
            raise Bad(f"{what}: argument {i} not recorded (only {len(self.dims)} Input Dims)")
        d = self.dims[i]
        if not isinstance(d, (list, tuple)):
            raise Bad(f"{what}: Input Dims[{i}] is not a list")
        if not all(is_int(x) for x in d):
            raise Bad(f"{what}: Input Dims[{i}] has non-int sizes")
        if any(x < 0 for x in d):
            raise Bad(f"{what}: Input Dims[{i}] has negative sizes")
        if ndims is not None and len(d) not in ndims:
            want = " or ".join(str(n) for n in ndims)
            raise Bad(f"{what}: expected {want}-D, got {len(d)}-D {list(d)}")
        if ndims is None and len(d) < min_ndim:
            raise Bad(f"{what}: expected at least {min_ndim}-D, got {len(d)}-D {list(d)}")
        return tuple(d)

    def raw(self, i: int | None) -> Any:
        if i is None or self.concrete is None or not (0 <= i < len(self.concrete)):
            return None
        return _parse_scalar(self.concrete[i])

    def c_bool(self, i: int | None) -> bool | None:
        v = self.raw(i)
        if isinstance(v, bool):
            return v
        if is_int(v) and v in (0, 1):
            return bool(v)
        return None

    def c_int(self, i: int | None) -> int | None:
        v = self.raw(i)
        return v if is_int(v) else None

    def c_ints(self, i: int | None) -> list[int] | None:
        v = self.raw(i)
        if is_int(v):
            return [v]
        if isinstance(v, list) and all(is_int(x) for x in v):
            return v
        return None

    def c_bools(self, i: int | None) -> list[bool] | None:
        v = self.raw(i)
        if isinstance(v, list) and v and all(isinstance(x, bool) for x in v):
            return v
        return None

    def c_dtype(self, i: int | None) -> str | None:
        """A ScalarType argument (recorded as its enum number) -> profiler type string."""
        v = self.c_int(i)
        return _SCALAR_TYPE_NUM.get(v) if v is not None else None


@dataclass
class R:
    """What a formula found; op_flops turns it into an OpFlops."""

    flops: int | None
    effective: int | None = None
    recompute: int = 0
    mask: str | None = None
    reason: str | None = None
    reads: tuple[int, ...] = ()  # argument indices read (tensors only are counted)
    outs: list[tuple[tuple[int, ...], str | None]] | None = None  # outputs written; None = unknown
    single_out: bool = True  # out_dims (if given) describes outs[0]
    args: Args | None = None  # the view the counts were made on, when not the event's
    extra_reads: list[tuple[tuple[int, ...], str | None]] = field(default_factory=list)  # read, not arguments


def unknown(reason: str, reads=(), outs=None, mask=None) -> R:
    return R(None, None, 0, mask, reason, tuple(reads), outs)


def output_type(a: Args, default_idx: int, dtype_idx: int | None = None) -> str | None:
    t = a.c_dtype(dtype_idx)
    return t if t is not None else a.type(default_idx)


def fp4_mult(a: Args, i: int) -> int:
    """Packed fp4 stores two values per element along the contraction dim."""
    return 2 if dtype_of(a.type(i) or "") == "fp4" else 1
