"""What kind of work an XLA op or device activity is: compute, communication (which collective), memcpy or memset.

Why apart: the TPU op builder, the GPU kernel scan and the builder's CPU ops classify by
the same opcode and kernel-name patterns; one module keeps the patterns in one place.
"""

from __future__ import annotations

import re

from traceflops.core.vocab import XLA_COLLECTIVE_OPS

_COMM_OP = re.compile(f"^({'|'.join(XLA_COLLECTIVE_OPS)})(-start|-done)?$")
_MEMCPY_OP = re.compile(r"^(copy-start|copy-done|infeed|outfeed|host-transfer)$")
_COMM_KERNEL = re.compile(
    r"nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|"
    r"cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce",
    re.IGNORECASE,
)
_SUFFIX = re.compile(r"\.\d+$")


def op_kind(opcode: str | None, category: str | None, name: str) -> tuple[str, str | None]:
    """(kind, collective) of an XLA op from its opcode, xprof category or name."""
    for s in (opcode, category, _SUFFIX.sub("", name)):
        if not s:
            continue
        s = s.strip().lower()
        if _COMM_OP.match(s.replace("_", "-")):
            return "communication", s.replace("_", "-")
        if _MEMCPY_OP.match(s) or "host-to-device" in s or "device-to-host" in s:
            return "memcpy", None
    if _COMM_KERNEL.search(name):
        return "communication", None
    return "compute", None


def collective_of(opcode: str | None, name: str) -> str | None:
    """The collective an XLA op is, by its HLO opcode (by its name without the `.N` suffix when the HLO is not in the
    profile): 'all-reduce', 'all-gather-start', 'reduce-scatter', ... spelled with dashes; None for any other op."""
    s = opcode if opcode else _SUFFIX.sub("", name or "")
    s = s.strip().lower().replace("_", "-")
    return s if _COMM_OP.match(s) else None


def gpu_kernel_kind(line_name: str, name: str, stats: dict | None) -> str:
    if stats and ("memset_details" in stats or "memcpy_details" in stats):
        return "memset" if "memset_details" in stats else "memcpy"
    key = (line_name, name)
    kind = _KIND_CACHE.get(key)
    if kind is None:
        kind = _KIND_CACHE[key] = _gpu_kernel_kind_uncached(line_name, name)
        if len(_KIND_CACHE) > 100_000:
            _KIND_CACHE.clear()
    return kind


_KIND_CACHE: dict[tuple[str, str], str] = {}


def _gpu_kernel_kind_uncached(line_name: str, name: str) -> str:
    ln = line_name.lower()
    n = name.lower()
    if "memset" in ln or "memset" in n or "fillbuffer" in n:
        return "memset"
    if "memcpy" in ln or n.startswith("memcpy") or "copybuffer" in n or (n.startswith("copy") and "device" in n):
        return "memcpy"
    if _COMM_KERNEL.search(name):
        return "communication"
    return "compute"
