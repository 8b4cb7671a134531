"""Element types: the profiler's type strings (`Input type`) and collectives' dtype names, with their sizes in bytes."""

from __future__ import annotations

from typing import Any

# profiler type string -> (normalized name, bytes per element)
TYPE_INFO: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "c10::Half": ("fp16", 2),
    "c10::BFloat16": ("bf16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1),
    "c10::Float8_e5m2": ("fp8", 1),
    "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1),
    "c10::Float8_e8m0fnu": ("fp8", 1),
    "c10::Float4_e2m1fn_x2": ("fp4", 1),  # two fp4 values packed per element
    "signed char": ("int8", 1),
    "unsigned char": ("uint8", 1),
    "short int": ("int16", 2),
    "short": ("int16", 2),
    "int": ("int32", 4),
    "long int": ("int64", 8),
    "long long int": ("int64", 8),
    "long long": ("int64", 8),
    "__int64": ("int64", 8),
    "int64_t": ("int64", 8),
    "short unsigned int": ("uint16", 2),
    "unsigned short": ("uint16", 2),
    "unsigned int": ("uint32", 4),
    "long unsigned int": ("uint64", 8),
    "unsigned long long": ("uint64", 8),
    "unsigned __int64": ("uint64", 8),
    "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8),
    "c10::complex<double>": ("complex128", 16),
    "c10::complex<c10::Half>": ("complex32", 4),
    "c10::qint8": ("int8", 1),
    "c10::quint8": ("uint8", 1),
    "c10::qint32": ("int32", 4),
    "c10::quint4x2": ("uint4", 1),
    "c10::quint2x4": ("uint2", 1),
}


def type_key(type_str: Any) -> str | None:
    if not isinstance(type_str, str):
        return None
    s = type_str.strip()
    for prefix in ("struct ", "class "):  # MSVC spelling
        if s.startswith(prefix):
            s = s[len(prefix) :].strip()
    s = s.replace("class c10::", "c10::").replace("struct c10::", "c10::")
    return s


def dtype_of(type_str: str) -> str | None:
    """Normalized dtype name of a profiler 'Input type' string; None for non-tensors/unknown."""
    info = TYPE_INFO.get(type_key(type_str) or "")
    return info[0] if info else None


def itemsize(type_str: Any) -> int | None:
    info = TYPE_INFO.get(type_key(type_str) or "")
    return info[1] if info else None


# A collective's `Collective dtype` / `dtype` as recorded (lower-cased, without `c10::`) -> bytes per element.
COLLECTIVE_ITEMSIZE = {
    "float": 4,
    "float32": 4,
    "bfloat16": 2,
    "half": 2,
    "float16": 2,
    "double": 8,
    "float64": 8,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "byte": 1,
    "char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    # the rest of c10's ScalarType names, as `dtype` records them
    "short": 2,
    "int16": 2,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "complexhalf": 4,
    "complexfloat": 8,
    "complexdouble": 16,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    # element types as a profiler built with clang or older Kineto spells them (`Input type`), beside TYPE_INFO's
    "unsigned long": 8,
    "long long unsigned int": 8,
    "unsigned short int": 2,
}


def collective_dtype_key(dtype: Any) -> str | None:
    """The key of `COLLECTIVE_ITEMSIZE` for a recorded collective dtype."""
    return None if dtype is None else str(dtype).lower().replace("c10::", "")


def collective_itemsize(dtype: Any) -> int | None:
    """Bytes per element of a collective's recorded dtype: a profiler type string (a CPU backend's work records
    its input's, `long int`, `c10::Half`) or a ScalarType name (`record_param_comms`' `dtype`: `Long`, `BFloat16`)."""
    return itemsize(dtype) or COLLECTIVE_ITEMSIZE.get(collective_dtype_key(dtype) or "")
