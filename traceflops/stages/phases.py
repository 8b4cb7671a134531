"""Phase of every op: forward, backward, recompute, optimizer, other.

Each signal is one small function over the nested ops (numpy arrays aligned
with `Linked.ops` rows); `tag_ops` composes them in one place, in priority
order. Kernels take the phase of the op that launched them.
"""

from __future__ import annotations

import re

import numpy as np
import orjson
import polars as pl

from traceflops.core.trace import Coded
from traceflops.core.vocab import (
    HOST_COMM_CALL_KIND,
    HOST_COMM_CALL_RE,
    HOST_COMM_WORK_KIND,
    HOST_COMM_WORK_RE,
    PROFILER_STEP_RE,
)
from traceflops.stages.link import Linked, by_row, nearest, nearest_each

EVAL_PREFIX = "autograd::engine::evaluate_function: "
# An autograd node: anything the engine evaluates (`evaluate_function: X`, whatever X is: formula
# nodes, AccumulateGrad, hook and custom-function nodes), or a bare `XBackward0` (2021-era traces).
_NODE_RE = re.compile(r"^autograd::engine::evaluate_function: (.+)$|^([\w:.]*Backward\d*)$")
_FORMULA_NODE_RE = re.compile(r"Backward\d*$")  # a node that computes gradients, not a hook around them
# Backward work outside any node: callbacks the engine runs when the backward pass ends (FSDP's last reduce-scatter).
_BACKWARD_CALLBACK_RE = re.compile(r"^FSDP::root_post_backward_callback$|^FSDP::post_backward")
_OPT_RE = re.compile(r"^Optimizer\.(?:step|zero_grad)#|^optimizer\.step|^Optimizer\.step")
# A graph compiled by compiled autograd (`torch._dynamo.compiled_autograd`): the whole backward pass as one
# Dynamo graph, its compile id prefixed by `!` (the compiled-autograd graph's id): no autograd node is recorded.
_COMPILED_AUTOGRAD_RE = re.compile(r"^Torch-Compiled Region: !\d+/")
CHECKPOINT_NODE = "CheckpointFunctionBackward"
COMPILED_FWD = "CompiledFunction"
COMPILED_BWD = "CompiledFunctionBackward"


def node_names(names: pl.Series) -> pl.Series:
    """Autograd node name of a backward-node op ('' for other ops).

    The regex runs once per distinct name (a trace repeats a few hundred names
    over every step): per row it was a fifth of phase tagging.
    """
    coded = Coded.of(names)
    return _nodes(coded).gather(coded.codes)


def _nodes(names: Coded) -> pl.Series:
    """Per code of `names`, the node name of an op of that name: '' for other ops, and for the code of a null name
    (the last), which also stands for "no node"."""
    d = names.distinct
    return (
        d.str.extract(_NODE_RE.pattern, 1)
        .fill_null(d.str.extract(_NODE_RE.pattern, 2))
        .extend_constant(None, 1)
        .fill_null("")
    )


def hook_nodes(nodes: pl.Series) -> np.ndarray:
    """Per node name, whether it is a node that is not a gradient formula: AccumulateGrad's hooks.

    A DDP communication hook (PowerSGD's bmm) or any gradient hook runs inside
    `evaluate_function: torch::autograd::AccumulateGrad`: the device executed it
    (HFU), but it is not the model's math (never in model FLOPs).
    """
    return ((nodes != "") & ~nodes.str.contains(_FORMULA_NODE_RE.pattern)).to_numpy()


def in_gradient_hook(in_hook_node: np.ndarray, matmul_like: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Matmuls run inside a `hook_nodes` node (`in_hook_node`, per op), and what they call."""
    return nearest(parent, in_hook_node & matmul_like) >= 0


def reentrant_recompute(under_checkpoint: np.ndarray, is_node: np.ndarray) -> np.ndarray:
    """Forward ops re-run directly under `CheckpointFunctionBackward` (not in its inner backward)."""
    return under_checkpoint & ~is_node


def grad_mode_forward_in_backward(
    ops: pl.DataFrame, in_bwd: np.ndarray, is_node: np.ndarray, parent: np.ndarray, matmul_like: np.ndarray
) -> np.ndarray:
    """Roots of forward ops re-run inside a backward node (non-reentrant checkpoint).

    Backward formulas run with grad mode off and record no sequence number; a
    forward op re-run by a checkpoint's unpack hook records one. With
    `create_graph=True` backward formulas record one too, so a root must also
    repeat the signature (name and input shapes) of a forward root op: the
    re-run forward calls what the model's forward called (`aten::linear`,
    `aten::conv2d`, ...), a derivative formula calls `aten::mm` and friends.
    """
    has_seq = ops["seq"].is_not_null().to_numpy()
    has_parent = parent >= 0
    p = np.maximum(parent, 0)
    parent_seq = has_parent & has_seq[p]
    parent_node = has_parent & is_node[p]
    outermost = has_seq & ~is_node & (~parent_seq | parent_node)
    rows = np.flatnonzero(outermost)  # signatures of these roots only
    sub = ops.select("name", "dims")[rows]  # the two columns read, not every one of the ops'
    sig = sub["name"] + "|" + sub["dims"].fill_null("")
    forward_roots = sig.filter(pl.Series(~in_bwd[rows])).unique()
    out = np.zeros(ops.height, dtype=bool)
    out[rows] = in_bwd[rows] & sig.is_in(forward_roots.implode()).to_numpy()
    formula_like = ops["name"].is_in(_FORMULA_GEMMS).to_numpy()
    out &= ~_consumes_node_gradient(ops, out & parent_node & matmul_like & formula_like, parent)
    return out


# What a GEMM's derivative formula calls (`mm_mat1_backward`, `bmm`'s and `baddbmm`'s formulas): a recompute
# re-runs the model's own calls instead (`aten::linear`, `aten::baddbmm`, ...), so only these can be formula work.
_FORMULA_GEMMS = ("aten::mm", "aten::bmm")


def _operands(col: str | None) -> list:
    try:
        parsed = orjson.loads(col) if col else None
    except orjson.JSONDecodeError:
        return []
    return parsed if isinstance(parsed, list) else []


def _consumes_node_gradient(ops: pl.DataFrame, cand: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Which `cand` ops take their parent node's incoming gradient (same dims and strides) as an operand.

    A node's function records the gradients it receives as its Input Dims /
    Input Strides. Only the few candidate roots are looked at.
    """
    out = np.zeros(ops.height, dtype=bool)
    rows = np.flatnonzero(cand)
    if not len(rows):
        return out
    par = parent[rows]
    dims, strides = ops["dims"].gather(rows).to_list(), ops["strides"].gather(rows).to_list()
    pdims, pstrides = ops["dims"].gather(par).to_list(), ops["strides"].gather(par).to_list()
    for k, i in enumerate(rows):
        grads = {orjson.dumps(g) for g in zip(_operands(pdims[k]), _operands(pstrides[k])) if g[0]}
        mine = {orjson.dumps(g) for g in zip(_operands(dims[k]), _operands(strides[k])) if g[0]}
        out[i] = bool(grads & mine)
    return out


def compiled_recompute(
    ops: pl.DataFrame, region: np.ndarray, region_kind: np.ndarray, matmul_like: np.ndarray
) -> np.ndarray:
    """GEMMs in a compiled backward graph that repeat a GEMM of its own compiled forward exactly.

    torch.compile folds recompute into `CompiledFunctionBackward` with no marker.
    A square dgrad can have the forward's (M, N, K), so the signature includes
    the input strides (a forward `x @ W.t()` reads W transposed, a dgrad does not).
    A backward region is paired with the forward region of the same `Sequence
    number` (several compiled regions per step, such as a decoder stack and an
    LM head, each pair on its own): per signature it recomputes at most as many
    GEMMs as that forward ran, and its batched GEMMs (`bmm`) at most as many as
    it ran beyond their gradients (`_recompute_room`). Regions without a
    sequence number share one budget, a forward's worth per backward region.
    """
    n = ops.height
    out = np.zeros(n, dtype=bool)
    if not matmul_like.any():
        return out
    # Without shapes and strides there is nothing to match: such GEMMs stay backward.
    shaped = (ops["dims"].is_not_null() & ops["strides"].is_not_null()).to_numpy()
    in_fwd = matmul_like & shaped & (region_kind == 1)  # inside CompiledFunction
    in_bwd = matmul_like & shaped & (region_kind == 2)  # inside CompiledFunctionBackward
    if not in_fwd.any() or not in_bwd.any():
        return out
    rows = np.flatnonzero(in_fwd | in_bwd)  # signatures of these GEMMs only, not of every op
    sig = np.empty(n, dtype=object)
    sub = ops[rows]
    sig[rows] = (sub["name"] + "|" + sub["dims"].fill_null("") + "|" + sub["strides"].fill_null("")).to_numpy()
    seq = ops["seq"].fill_null(-1).to_numpy()
    pair = np.where(region >= 0, seq[np.maximum(region, 0)], -1)  # the region's sequence number ties fwd and bwd
    fwd_counts: dict[tuple[int, str], int] = {}
    for i in np.flatnonzero(in_fwd):
        key = (int(pair[i]), sig[i])
        fwd_counts[key] = fwd_counts.get(key, 0) + 1
    unpaired = in_fwd & (pair < 0)
    unpaired_regions = max(1, len(set(region[unpaired].tolist())))
    batched, spare = _recompute_room(ops, region, region_kind, matmul_like, pair, unpaired_regions)
    used: dict[tuple[int, str], int] = {}
    for i in np.flatnonzero(in_bwd):
        budget = fwd_counts.get((int(pair[i]), sig[i]), 0)
        if pair[i] < 0:
            budget = -(-budget // unpaired_regions)
        key = (int(region[i]), sig[i])
        k = used.get(key, 0)
        r = int(region[i])
        if k < budget and (not batched[i] or spare.get(r, 0) > 0):
            out[i] = True
            used[key] = k + 1
            if batched[i]:
                spare[r] -= 1
    return out


# Batched GEMMs of two activations (attention written as matmuls): each operand has a gradient, and a gradient
# can have the forward's shapes and strides. A Linear's GEMM reads its weight transposed in the forward and not
# in its gradients, so its signature tells them apart; a frozen weight (LoRA) has no weight gradient at all.
_BATCHED_GEMMS = ("aten::bmm", "aten::baddbmm")


def _recompute_room(
    ops: pl.DataFrame,
    region: np.ndarray,
    region_kind: np.ndarray,
    matmul_like: np.ndarray,
    pair: np.ndarray,
    unpaired_regions: int,
) -> tuple[np.ndarray, dict[int, int]]:
    """Which GEMMs are batched, and per compiled backward region how many batched GEMMs can be recompute.

    A batched forward GEMM of two activations has two gradient GEMMs (dA = dY·Bᵀ,
    dB = Aᵀ·dY), batched too; a backward region that ran more batched GEMMs than
    twice its forward's recomputed the rest. Its gradients can repeat a forward
    signature exactly (dQ = dS·K is P·V's, dP = dO·Vᵀ is Q·Kᵀ's), so without
    checkpointing signatures alone would book them as recompute.
    """
    batched = ops["name"].is_in(_BATCHED_GEMMS).to_numpy() & matmul_like
    fwd = batched & (region_kind == 1)
    bwd = batched & (region_kind == 2)
    grads = pl.DataFrame({"pair": pair[fwd]}).group_by("pair").len()
    per_pair = {int(p): 2 * int(n) for p, n in grads.iter_rows()}
    if -1 in per_pair:
        per_pair[-1] = -(-per_pair[-1] // unpaired_regions)
    ran = pl.DataFrame({"region": region[bwd], "pair": pair[bwd]}).group_by("region", "pair").len()
    return batched, {int(r): max(0, int(n) - per_pair.get(int(p), 0)) for r, p, n in ran.iter_rows()}


def _operand_numels(dims: str | None) -> set[int]:
    """Elements of each tensor operand of recorded Input Dims (JSON text), a tensor list also as its sum."""
    try:
        parsed = orjson.loads(dims) if dims else None
    except orjson.JSONDecodeError:
        return set()
    out: set[int] = set()

    def walk(d) -> int | None:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            n = 1
            for x in d:
                n *= x
            out.add(n)
            return n
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            parts = [walk(x) for x in d]
            known = [p for p in parts if p is not None]
            if len(known) == len(parts):
                out.add(sum(known))
        return None

    for d in parsed if isinstance(parsed, list) else []:
        walk(d)
    return out


def _work_kind(name: str) -> str | None:
    return HOST_COMM_WORK_KIND.get(name.split(":", 1)[-1])


def _fits(work_kind: str | None, call_kind: str | None, work_n: set[int], call_n: set[int]) -> bool:
    """Whether a call could have issued the work: kinds that agree (gloo runs a reduce-scatter as an all-reduce), a
    common payload."""
    if (
        work_kind
        and call_kind
        and work_kind != call_kind
        and not (work_kind == "allreduce" and call_kind == "reduce_scatter")
    ):
        return False
    return not work_n or not call_n or bool(work_n & call_n)


_PAIR_LOOKAHEAD = (
    64  # calls a work may skip over (other groups' calls in flight): bounds the pairing on a hostile trace
)


def host_comm_issuers(ops: pl.DataFrame, parent: np.ndarray, coded: Coded) -> np.ndarray:
    """For each CPU collective's work (`gloo:*` on the backend's thread), the row of the `c10d::` call that issued it;
    -1 elsewhere.

    The work runs outside the caller's nesting, so it cannot inherit the caller's
    phase by nesting. A process group runs its collectives in the order they were
    issued; with several groups their works interleave in another order. So each
    work, by start, takes the earliest call not yet taken that started before it
    and fits it (the same kind of collective and a payload in common); where that
    leaves a work without its call, the i-th call (outermost `c10d::` ops, by
    start) issued the i-th work. Unequal counts (a cut trace) pair nothing. `coded`: the ops' names.
    """
    out = np.full(ops.height, -1, dtype=np.int64)
    names = ops["name"]
    work = coded.contains(HOST_COMM_WORK_RE)
    call = coded.contains(HOST_COMM_CALL_RE)
    if not work.any() or not call.any():
        return out
    call &= ~((parent >= 0) & call[np.maximum(parent, 0)])  # the outermost call only
    ts = ops["ts"].to_numpy()
    w, c = np.flatnonzero(work), np.flatnonzero(call)
    if len(w) != len(c):
        return out
    w, c = w[np.argsort(ts[w], kind="stable")], c[np.argsort(ts[c], kind="stable")]
    dims, name = ops["dims"].to_list(), names.to_list()
    c_kind = [HOST_COMM_CALL_KIND.get(name[j]) for j in c]
    c_n = [_operand_numels(dims[j]) for j in c]
    free = list(range(len(c)))
    got = []
    for i in w:
        kind, n = _work_kind(name[i]), _operand_numels(dims[i])
        pick = None
        for k in free[:_PAIR_LOOKAHEAD]:  # calls by start: the earliest that fits, among the next few not yet taken
            if ts[c[k]] > ts[i]:
                break
            if _fits(kind, c_kind[k], n, c_n[k]):
                pick = k
                break
        if pick is None:
            break
        free.remove(pick)
        got.append(c[pick])
    out[w] = got if len(got) == len(w) else c
    return out


_PHASE_CODE = {p: i for i, p in enumerate(("forward", "backward", "recompute", "optimizer", "other"))}


def tag_ops(linked: Linked, matmul_like: np.ndarray, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    ops, names = linked.ops, linked.op_names
    parent = ops["parent"].to_numpy()
    nodes = _nodes(names)  # each op's own node name, and below the node it runs in, as a code into these
    is_node = (nodes != "").to_numpy()[names.codes]
    kind = names.per_row(
        names.distinct.replace_strict({COMPILED_FWD: 1, COMPILED_BWD: 2}, default=0, return_dtype=pl.Int8).to_numpy(), 0
    )
    # The nearest node, engine callback, compiled-autograd graph, optimizer step and compiled region: one climb.
    node_row, callback, compiled_autograd, optimizer, region = nearest_each(
        parent,
        [
            is_node,
            names.contains(_BACKWARD_CALLBACK_RE.pattern),
            names.contains(_COMPILED_AUTOGRAD_RE.pattern),
            names.contains(_OPT_RE.pattern),
            kind > 0,
        ],
    )
    in_bwd = (node_row >= 0) | (callback >= 0) | (compiled_autograd >= 0)
    # The node an op runs in (backward work outside any node, such as an engine callback's: none).
    node_at = np.where(in_bwd & (node_row >= 0), names.codes[np.maximum(node_row, 0)], names.distinct.len())
    node_name = nodes.gather(node_at).alias("node")  # string work stays in polars: object arrays cost most here

    opt = optimizer >= 0
    reentrant = reentrant_recompute((nodes == CHECKPOINT_NODE).to_numpy()[node_at], is_node)
    nonreentrant = grad_mode_forward_in_backward(ops, in_bwd, is_node, parent, matmul_like)
    # Recompute is inherited by everything nested under a recomputed op.
    recompute_root = reentrant | nonreentrant
    recompute = nearest(parent, recompute_root) >= 0

    region_kind = np.where(region >= 0, kind[np.maximum(region, 0)], 0)  # 1: compiled forward, 2: backward
    recompute |= compiled_recompute(ops, region, region_kind, matmul_like)

    hook = in_gradient_hook(hook_nodes(nodes)[node_at], matmul_like, parent) & ~recompute

    code = np.zeros(ops.height, dtype=np.int8)
    code[in_bwd] = _PHASE_CODE["backward"]
    code[recompute & in_bwd] = _PHASE_CODE["recompute"]
    code[hook] = _PHASE_CODE["other"]
    issuer = host_comm_issuers(ops, parent, names)
    code[issuer >= 0] = code[issuer[issuer >= 0]]  # a CPU collective's work: its call's phase
    code[opt] = _PHASE_CODE["optimizer"]
    # Step markers and bare annotations outside any model work are 'other'.
    code[names.contains(PROFILER_STEP_RE)] = _PHASE_CODE["other"]
    # each row's phase gathered from the five names by its code (a third of the time of mapping each code)
    phase_s: pl.Series | pl.Expr = pl.Series(list(_PHASE_CODE), dtype=pl.Utf8).gather(code.astype(np.int64))
    if ops["scope"].is_not_null().any():
        # Name-stack rules (JAX: jvp / transpose(jvp) / rematted_computation) decide where they apply.
        from traceflops.stages.xla_phases import tag as scope_phases

        phase_s = pl.coalesce(scope_phases(ops, steps), phase_s)
    issued_by = pl.Series(issuer, dtype=pl.Int64)
    return ops.with_columns(
        phase=phase_s,
        node=node_name,
        is_node=pl.Series(is_node),
        in_hook=pl.Series(hook),
        comm_issuer=pl.when(issued_by >= 0).then(issued_by),
    )


def tag_kernels(linked: Linked, ops: pl.DataFrame) -> pl.DataFrame:
    phase = by_row(ops, linked.kernels["op_row"], "phase").to_series()
    return linked.kernels.with_columns(phase=phase.fill_null("other"))
