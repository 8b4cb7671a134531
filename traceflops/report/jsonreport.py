"""The JSON report contract (`schema: traceflops.report/1`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Final

import orjson

from traceflops.core.contract import SCHEMA_ID, CommunicationRow, InputRecord, Report, rank_record, step_records
from traceflops.core.fmt import path_text
from traceflops.core.results import Analysis
from traceflops.core.sections import encode, json_default

SCHEMA: Final = SCHEMA_ID  # (Final keeps its literal type once contract's is one)


def _rows(df, n: int) -> list[dict[str, Any]] | None:
    return None if df is None else df.head(n).to_dicts()


def step_rows(a: Analysis) -> list[dict[str, Any]]:
    return encode(step_records(a.steps.iter_rows(named=True), a.meta.get("rank")))


def report(a: Analysis) -> Report:
    """The analysis as the report contract types it (`core.contract.Report`)."""
    path = path_text(a.meta.get("path"))
    return Report(
        schema=SCHEMA,
        inputs=[
            InputRecord(
                path=path,
                format=a.meta.get("format"),
                rank=a.meta.get("rank"),
                world_size=a.meta.get("world_size"),
                device=a.hardware.name if a.hardware is not None else None,
            )
        ],
        hardware=a.hardware,
        model=a.model,
        steps=step_records(a.steps.iter_rows(named=True), a.meta.get("rank")),
        ranks=[rank_record(a.meta.get("rank"), path, a.totals)],
        outside_steps=a.outside_steps,
        top_kernels=_rows(a.top_kernels, 20),
        modules=_rows(a.by_module, 50),
        idle_gaps_by_reason=a.totals.idle_us_by_reason,
        advice=a.advice,
        what_if=a.what_if,
        step_stats=a.step_stats,
        critical_path=a.path_summary,
        gemm_shapes=_rows(a.by_gemm_shape, 30),
        communication=None
        if a.communication is None
        else [CommunicationRow(**r) for r in a.communication.head(100).to_dicts()],
        totals=a.totals,
        warnings=a.warnings,
    )


def to_dict(a: Analysis) -> dict[str, Any]:
    """The JSON report as plain values: the typed report encoded."""
    return encode(report(a))


def render(a: Analysis) -> str:
    return orjson.dumps(
        to_dict(a), default=json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
    ).decode()


_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
_STEPS_AT = b'\n  "steps": []'  # the top-level key: two spaces in (a nested "steps" sits deeper)
STEP_CHUNK = 4096


def render_chunks(a: Analysis, rows: int = STEP_CHUNK) -> Iterator[bytes | memoryview]:
    """`render(a)` as UTF-8 bytes, in pieces (bytes, or views of one: never copied): the steps are made and dumped
    `rows` at a time, so a trace of 200 000 steps never holds every step's dict, nor the whole text, at once. The
    pieces joined are `render(a)`'s bytes."""
    rest = orjson.dumps(
        to_dict(replace(a, steps=a.steps.clear())), default=json_default, option=_OPTS
    )  # all but the steps: one buffer
    at = rest.find(_STEPS_AT)
    if at < 0:  # the steps are not where this splice expects them: the whole report at once
        yield render(a).encode()
        return
    view = memoryview(rest)
    head, tail = view[:at], view[at + len(_STEPS_AT) :]
    if not a.steps.height:
        yield from (head, _STEPS_AT, tail)
        return
    yield head
    yield _STEPS_AT[:-1]
    rank = a.meta.get("rank")
    for i in range(0, a.steps.height, rows):
        part = encode(step_records(a.steps.slice(i, rows).iter_rows(named=True), rank))
        text = orjson.dumps(part, option=_OPTS)  # "[\n  {...},\n  {...}\n]": its items one level deeper in the report
        yield (b"" if i == 0 else b",") + text[1:-2].replace(b"\n", b"\n  ")
    yield b"\n  ]"
    yield tail
