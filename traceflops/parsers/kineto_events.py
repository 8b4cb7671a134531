"""The Kineto chrome-trace event rules: the typed msgspec schema of the fields the analysis reads, the decoders
built from it, and the categories that say which table an event feeds (`kernel_kinds` for device activities).

Every field is typed loosely (`Any`) and validated when columns are built (`kineto_tables`).
"""

from __future__ import annotations

import re
from typing import Any, Union

import msgspec
import polars as pl

from traceflops.core.trace import name_matches


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    ext_id: Any = msgspec.field(default=None, name="External id")
    ext_id_old: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")
    strides: Any = msgspec.field(default=None, name="Input Strides")
    seq: Any = msgspec.field(default=None, name="Sequence number")
    fwd_tid: Any = msgspec.field(default=None, name="Fwd thread id")
    device: Any = None
    stream: Any = None
    bytes: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    coll_dtype: Any = msgspec.field(default=None, name="dtype")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    coll_seq: Any = msgspec.field(default=None, name="Seq")
    p2p_src: Any = msgspec.field(default=None, name="Src Rank")  # a receive's sender (global rank; PyTorch writes text)
    p2p_dst: Any = msgspec.field(default=None, name="Dst Rank")  # a send's receiver
    kernel: Any = None  # a runtime launch's kernel name (read to match graph replays with their capture)


# gc=False: millions of small structs that hold no reference cycles; tracking them
# made the garbage collector a third of the decode time.
class _Fields(msgspec.Struct, gc=False):
    """The fields of an event the analysis reads."""

    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Args | None = None


class X(_Fields, tag_field="ph", tag="X", gc=False):
    """A complete event, the only phase the analysis reads (the fast path's tagged union)."""


class Event(_Fields, gc=False):
    """Any event, its phase a field (the entry-by-entry fallback)."""

    ph: Any = None


# The chrome-trace phases other than 'X'. Each decodes to an empty struct here: its fields are skipped
# unbuilt. Flow and instant events are close to half of a Kineto trace.
OTHER_PHASES = tuple("BEiICbnestfPONDMVvRc()")  # each one character
_OTHER_STRUCTS = tuple(
    msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False) for i, ph in enumerate(OTHER_PHASES)
)


_ARGS = tuple(Args.__struct_fields__)


_EVENT: Any = Union[(X, *_OTHER_STRUCTS)]  # a union of generated structs: built at run time
EVENTS_DECODER = msgspec.json.Decoder(list[_EVENT])


class Head(msgspec.Struct):
    """The top-level fields beside traceEvents that the analysis reads."""

    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None


OP_CATS = frozenset({"cpu_op", "Operator", "user_annotation"})
KERNEL_CATS = {
    "kernel": "compute",
    "Kernel": "compute",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime"})
MARKER_CATS = frozenset({"cuda_sync", "gpu_user_annotation"})
# Categories that carry nothing the analysis reads; skipping them is not a loss.
IGNORED_CATS = frozenset(
    {
        "python_function",
        "cpu_instant_event",
        "ac2g",
        "async_cpu_to_gpu",
        "async",
        "fwdbwd",
        "Trace",
        "overhead",
        "Python",
        "python",
        "traceflops",  # our own annotation tracks, when an annotated trace is analysed again
    }
)

# The CUPTI range profiler's events: hardware counters per profiled range (kernel), no timeline. Counted, not analysed.
PROFILER_RANGE_CAT = "cuda_profiler_range"
PROFILER_RANGES = (
    "\0profiler ranges"  # their count, carried across chunks with the warning counts; build_trace moves it to meta
)

_COMM_RE = re.compile(
    r"(?i)nccl|rccl|multimem_all_reduce|all_reduce_kernel|allgather|all_gather|reduce_scatter|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce",
    re.IGNORECASE,
)


def kernel_kinds(cat: pl.Expr, names: pl.Series) -> pl.Expr:
    """compute | communication | memcpy | memset, from the category and (for kernels) the name."""
    base = cat.replace_strict(KERNEL_CATS, default=None)
    return (
        pl.when((base == "compute") & pl.lit(name_matches(names, _COMM_RE.pattern)))
        .then(pl.lit("communication"))
        .otherwise(base)
    )


EVENT_DECODER = msgspec.json.Decoder(Event)
HEAD_DECODER = msgspec.json.Decoder(Head)
