"""An XLA profile written as a trace for Perfetto: it has no JSON of its own to keep, so its ops and device activities
are the events.

Its ops and device activities become complete events with what traceflops
found in their args, then the same added tracks (`tracks`), the same
redaction and record (`redact`).
"""

from __future__ import annotations

from typing import Any

from traceflops.core.results import Analysis
from traceflops.export.perfetto.redact import redact_metadata, write_redacted
from traceflops.export.perfetto.tracks import (
    added_events,
    meta,
    new_pid,
    num,
    tflops,
    used_pids,
)


def xla_events(a: Analysis) -> list[dict]:
    """An XLA profile's ops and device activities as trace events, with what traceflops found in their args.

    Processes and threads are numbered in order of first appearance and named
    after the profile's planes and lines.
    """
    events: list[dict] = []
    pids: dict[Any, int] = {}
    tids: dict[tuple, int] = {}
    # polars stubs type a column's min as any literal: a ts column's is a number
    t0: float = min(  # type: ignore[assignment]
        [
            x
            for x in (a.kernels["ts"].min() if a.kernels.height else None, a.ops["ts"].min() if a.ops.height else None)
            if x is not None
        ],
        default=0.0,
    )

    def lane(process: Any, thread: Any) -> tuple[int, int]:
        if process not in pids:
            pids[process] = len(pids) + 1
            events.append(meta(pids[process], 0, "process_name", str(process), t0))
        key = (process, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == process]) + 1
            events.append(meta(pids[process], tids[key], "thread_name", str(thread), t0))
        return pids[process], tids[key]

    ops = a.ops.select(
        "op_id", "name", "cat", "pid", "tid", "ts", "dur", "scope", "phase", "matmul", "ran", "flops", "step"
    )
    for r in ops.iter_rows(named=True):
        pid, tid = lane(r["pid"], r["tid"])
        args = {"op_id": r["op_id"], "traceflops.phase": r["phase"], "traceflops.step": r["step"]}
        if r["scope"] is not None:
            args["scope"] = r["scope"]
        if r["matmul"]:
            args["traceflops.flops"] = num(r["flops"])
            args["traceflops.ran"] = bool(r["ran"])
            args["traceflops.achieved_tflops"] = tflops(r["flops"], r["dur"])
        events.append(
            {
                "ph": "X",
                "cat": r["cat"] or "xla_op",
                "name": r["name"],
                "pid": pid,
                "tid": tid,
                "ts": r["ts"],
                "dur": r["dur"],
                "args": args,
            }
        )
    if a.kernels.height:
        k = a.kernels.select(
            "kernel_id", "name", "kind", "cls", "phase", "device", "stream", "ts", "dur", "flops", "step"
        )
        for r in k.iter_rows(named=True):
            pid, tid = lane(f"device {r['device']}", f"stream {r['stream']}")
            events.append(
                {
                    "ph": "X",
                    "cat": r["kind"] or "kernel",
                    "name": r["name"],
                    "pid": pid,
                    "tid": tid,
                    "ts": r["ts"],
                    "dur": r["dur"],
                    "args": {
                        "kernel_id": r["kernel_id"],
                        "traceflops.phase": r["phase"],
                        "traceflops.class": r["cls"],
                        "traceflops.flops": num(r["flops"]),
                        "traceflops.achieved_tflops": tflops(r["flops"], r["dur"]),
                        "traceflops.step": r["step"],
                    },
                }
            )
    return events


def annotate_xla(trace_path: str, analysis: Analysis, out_path: str) -> dict[str, Any]:
    """An XLA profile has no JSON of its own to keep: a new trace of its ops and device activities, and the same
    tracks."""
    events = xla_events(analysis)
    n_in = len(events)
    pid = new_pid(used_pids(events))
    new = added_events(analysis, pid).dicts()
    doc, redacted = redact_metadata({"traceEvents": events + new, "displayTimeUnit": "ms"})
    summary = {
        "events_in": n_in,
        "events_added": len(new),
        "kernels_annotated": analysis.kernels.height,
        "ops_annotated": analysis.ops.height,
        "pid": pid,
        "redacted_values": redacted,
    }
    summary = write_redacted(
        out_path, doc, summary, trace_path, "an XLA profile's ops and device activities; args prefixed 'traceflops.'"
    )
    return {**summary, "path": str(out_path)}
