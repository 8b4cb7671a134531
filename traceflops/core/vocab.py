"""The words every layer shares: phases, device-activity kinds, time classes, idle reasons, step ids and markers."""

from __future__ import annotations

import reprlib

PHASES = ("forward", "backward", "recompute", "optimizer", "other")
KINDS = ("compute", "communication", "memcpy", "memset")

# Partition classes in priority order: an instant belongs to the first active one.
PARTITION = ("matmul", "other_compute", "memcpy", "communication_exposed", "idle")
# What a segment of the critical path ran through (stages.critical_path).
PATH_KINDS = ("host", "launch", "device_matmul", "device_other", "memcpy", "communication", "sync", "idle")
OVERLAYS = ("communication_overlapped", "communication_total", "recompute", "matmul_known", "matmul_unknown")
GAP_REASONS = ("sync", "input_pipeline", "host_bound", "launch_gap", "unknown")

# Kernel classes (`cls`) that take device time; memset is counted with memcpy.
BUSY_CLASSES = ("matmul", "other_compute", "memcpy", "memset", "communication")

OUTSIDE = -1  # step id of work outside every step

# A step is an outlier when its window is this far from the median (metrics.stepstats); reports say which rule held.
OUTLIER_MAD_K = 3.0
OUTLIER_MAD_FLOOR = (
    0.05  # a MAD outlier must also be this far (a fraction of the median): near-identical steps have a MAD near 0
)
OUTLIER_RELATIVE = 0.20
OUTLIER_RULES = {
    "mad": f"more than {OUTLIER_MAD_K:g} median absolute deviations (and {OUTLIER_MAD_FLOOR:.0%}) from the median",
    "relative": f"more than {OUTLIER_RELATIVE:.0%} from the median",
}

PROFILER_STEP_RE = r"^ProfilerStep#\d+$"  # the profiler's own step spans
STEP_MARKER_RE = rf"{PROFILER_STEP_RE}|^Optimizer\."  # host annotations that mark steps, not model code

# The launch a parser adds to link a device op to itself (TPU profiles record no host launch): not host work.
DEVICE_SIDE_LAUNCH = "device op (no host launch recorded)"

# JAX name stacks: `jax.checkpoint`'s recomputed forward, and the transposed JVP of `jax.grad` (the backward).
JAX_REMAT_SCOPE_RE = r"(^|/)rematted_computation(/|$)"
# `transpose(` opening a name-stack component, or inside the wrappers of one (`vmap(transpose(jvp()))`: per-example
# gradients; `pmap(…)`, `jit(…)`, `remat(…)` likewise).
JAX_BACKWARD_SCOPE_RE = r"(^|/)([A-Za-z_][\w.\-]*\()*transpose\("

# A CPU backend's collective: the work as it ran (its worker thread's annotation), and the call that issued it.
HOST_COMM_WORK_RE = r"^gloo:"
HOST_COMM_CALL_RE = r"^c10d::"
# The collective a `c10d::` call asks for; the backend may run it as another (gloo: a reduce-scatter as
# `gloo:all_reduce`).
HOST_COMM_CALL_KIND = {
    "c10d::allreduce_": "allreduce",
    "c10d::allreduce_coalesced_": "allreduce",
    "c10d::_allgather_base_": "allgather",
    "c10d::allgather_": "allgather",
    "c10d::allgather_coalesced_": "allgather",
    "c10d::allgather_into_tensor_coalesced_": "allgather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::alltoall_": "all_to_all",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::broadcast_": "broadcast",
    "c10d::send": "sendrecv",
    "c10d::recv_": "sendrecv",
    "c10d::recv_any_source_": "sendrecv",
}
# A CPU backend's work as it names it (`gloo:<op>`) -> its kind; send and recv run on the calling thread, inside the
# call.
HOST_COMM_WORK_KIND = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "send": "sendrecv",
    "recv": "sendrecv",
}
# Where a thread blocks until a collective completes (functional collectives: DTensor, TP, compiled code).
HOST_COMM_WAIT_RE = r"^_?c10d_functional(_autograd)?::wait_tensor$"

# XLA's collective HLO opcodes (each async as `<op>-start` ... `<op>-done`): the XLA parser books these ops as
# communication, and the collectives view reads a collective's message from such an op's operand.
XLA_COLLECTIVE_OPS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
    "send",
    "recv",
)

# More ranks than any machine has: a world or rank beyond it is corrupt (read from a trace or given as a flag).
MAX_RANKS = 1 << 24
# More elements than any device holds (256 TiB of bytes): a collective's message beyond it is corrupt, and its bytes
# (times an element's 16 bytes at most) stay far inside an Int64.
MAX_MESSAGE_ELEMENTS = 1 << 48


def usable_ranks(rank, world, source: str, warnings) -> tuple[int | None, int | None]:
    """A rank and world size as read (a trace's distributedInfo, a summary), each None unless usable, with a warning.

    Usable: a whole number, a rank in [0, world), a world in [1, MAX_RANKS]. Later stages divide by the world and
    size tables by it, so a negative, fractional or huge value would give a negative or vanishing MFU or allocate
    gigabytes; no real job writes one. A rank not below its world leaves both unknown: which is wrong cannot be
    told. `warnings` takes each complaint (`.add` or `.append`); `source` starts it ("distributedInfo").
    """
    say = getattr(warnings, "add", None) or warnings.append
    given = {"rank": rank, "world_size": world}
    r, w = (_whole(v) for v in (rank, world))
    if r is not None and not 0 <= r < MAX_RANKS:
        r = None
    if w is not None and not 1 <= w <= MAX_RANKS:
        w = None
    for key, got in (("rank", r), ("world_size", w)):
        if got is None and given[key] is not None:
            say(f"{source} {key} {reprlib.repr(given[key])} is not a whole number in range (ignored)")
    if r is not None and w is not None and r >= w:
        say(f"{source} rank {r} is not below world_size {w} (both ignored)")
        return None, None
    return r, w


def _whole(v) -> int | None:
    """An int, an integral float or a numeric string as an int; None otherwise (bools too)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return v if isinstance(v, int) else None


# A capture that names a device but holds none of its activity (CPU activity only, or the CUPTI range profiler):
# its warning opens with one of these and is shown in every report's headline, not only among the warnings.
NO_DEVICE_ACTIVITY = "no device activity in this capture"
RANGE_PROFILER_CAPTURE = "this is a CUPTI range-profiler capture"
CUT_FILE = "the file is cut"  # a trace whose JSON ends before it closes: what came after the cut is not in the report
HEADLINE_WARNINGS = (NO_DEVICE_ACTIVITY, RANGE_PROFILER_CAPTURE, CUT_FILE)
PROFILE_THE_DEVICE = "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"


# The parallelism dimensions a process group's role can name (views.collectives.group_role), as reports write them.
DIMENSIONS = ("dp", "tp", "pp", "ep", "cp")


def dimension_name(role: str) -> str:
    """A role as reports show it: a dimension in capitals (TP), any other role (world, a description) as it is."""
    return role.upper() if role in DIMENSIONS else role


def tells_dimensions_apart(roles) -> bool:
    """Whether a trace's groups say which dimension its communication is: a role among DIMENSIONS, or two roles of
    any kind (`?`, no group recorded, is none); one world group says no more than the time breakdown does."""
    roles = set(roles)
    return bool(roles & set(DIMENSIONS)) or len(roles - {"?"}) >= 2
