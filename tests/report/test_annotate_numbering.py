"""Annotate numbers a proven array's entries from their decoded fields (`positions`, column operations); the
decoded way (`numbering`, the parser's rules as polars casts) is the independent truth on the same entries."""

from __future__ import annotations

import json
import random

import pytest

from traceflops.export.perfetto.entries import Complete, Fields, claim_parts, numbering, positions

CATS = ["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "Operator", "user_annotation", "cuda_runtime",
        "python_function", "Trace", "", 7, None, ["kernel"], {"a": 1}]
PHS = ["X", "X", "X", "B", "E", "i", "M", "f", 1, None, ["X"]]
LISTED = ["X", "X", "X", "B", "E", "i", "M", "f", "s", "C"]  # phases the tagged decode names: no entry falls back
NUMBERS = [0, 5, -3, 2.5, -0.0, 1e300, 12345678901234567890123, -7.25, float("1e-9")]


def entry(rng: random.Random, numeric: bool, phases: list = PHS) -> dict:
    e: dict = {}
    for key, pool in (("ph", phases), ("cat", CATS), ("name", ["gemm", "aten::mm", "", 3, None, ["n"]])):
        if rng.random() < 0.92 or phases is LISTED and key == "ph":
            e[key] = rng.choice(pool)
    for key in ("ts", "dur"):
        r = rng.random()
        if r < 0.85:
            e[key] = rng.choice(NUMBERS)
        elif r < 0.93:
            e[key] = None
        elif not numeric:
            e[key] = rng.choice(["12", True, [1], {"x": 1}])
    if rng.random() < 0.5:
        e["args"] = {"k": rng.randint(0, 9)}
    return e


@pytest.mark.parametrize("phases", [PHS, LISTED], ids=["any phase", "listed phases"])
@pytest.mark.parametrize("seed", range(40))
def test_positions_number_as_the_decoded_way_does(seed, phases):
    rng = random.Random(seed)
    events = [entry(rng, numeric=True, phases=phases) for _ in range(rng.choice([0, 1, 300, 400]))]
    text = json.dumps(events).encode()  # the standard library's: integers of any size
    fields = claim_parts(bytearray(text)).fields
    got = positions(fields)
    kernels, ops = numbering(json.loads(text))
    assert got == (kernels.tolist(), ops.tolist())
    assert len(events) < 300 or (got[0] and got[1])  # the generator makes both kinds
    # both decodes are exercised: the phases' union where every entry names a listed phase, else every entry's fields
    plain = [f.__class__ is Fields for f in fields]
    assert all(plain) or not any(plain)  # one decode or the other, for the whole array
    assert not any(plain) if phases is LISTED else all(plain) or len(events) < 300
    assert phases is not LISTED or len(events) < 300 or any(f.__class__ is Complete for f in fields)


def test_positions_defer_to_the_decoded_way_on_a_numbered_entry_with_other_times():
    ok = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}
    for bad in ("12", True, [1]):
        for key in ("ts", "dur"):
            events = [ok, {**ok, key: bad}, ok]
            assert positions(claim_parts(bytearray(json.dumps(events).encode())).fields) is None
    # an entry nobody numbers may hold anything there
    events = [ok, {**ok, "cat": "python_function", "ts": "12"}, {**ok, "ph": "B", "dur": True}]
    assert positions(claim_parts(bytearray(json.dumps(events).encode())).fields) == ([0], [])


def test_a_duration_no_double_holds_is_compared_as_an_integer():
    big = int("9" * 400)
    text = b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":' + str(big).encode() + b'},' \
        b'{"ph":"X","cat":"cpu_op","name":"o","ts":1,"dur":-' + str(big).encode() + b"}]"
    parts = claim_parts(bytearray(text))
    assert positions(parts.fields) == ([0], [])


@pytest.mark.parametrize("phs", [("X", "f"), ("f", "X"), ("X", "X"), ("X", "B")])
def test_an_entry_that_names_its_phase_twice_is_numbered_by_the_last_as_the_decoded_way_does(phs):
    # JSON readers keep a repeated key's last value; the tagged decode must not number by the first
    first, last = (f'"ph":"{p}"' for p in phs)
    text = f'[{{{first},"cat":"kernel","name":"k","ts":1,"dur":2,{last}}},{{"ph":"X","cat":"cpu_op","name":"o","ts":3,"dur":1}}]'
    kernels, ops = numbering(json.loads(text))
    assert positions(claim_parts(bytearray(text.encode())).fields) == (kernels.tolist(), ops.tolist())
    assert (kernels.tolist(), ops.tolist()) == (([0] if phs[1] == "X" else []), [1])  # by construction
