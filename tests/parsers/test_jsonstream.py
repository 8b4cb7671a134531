"""The streaming splitter against json.loads, with chunk sizes that cut every token."""

import gzip
import json
import random

import pytest

from traceflops.core.errors import FormatError
from traceflops.parsers.jsonstream import stream_events

TRICKY = {
    "schemaVersion": 1,
    "note": 'a string with "traceEvents": [ {inside} ] and \\ backslashes \\\\" and braces }}]]',
    "deviceProperties": [{"id": 0, "name": "GPU {0}"}],
    "traceEvents": [
        {"ph": "X", "name": 'aten::mm "quoted" {brace} [bracket]', "ts": 1, "dur": 2, "args": {"Input Dims": [[2, 3], [3, 4]]}},
        {"ph": "X", "name": "ends with backslash \\\\", "ts": 3, "dur": 1, "args": {}},
        {"ph": "X", "name": "\\\"escaped quote\\\"", "ts": 4, "dur": 1},
        {"ph": "i", "name": "nested", "args": {"a": {"b": [{"c": "}"}]}}},
    ],
    "distributedInfo": {"rank": 3, "world_size": 8},
}


def run(path, chunk, limit=1 << 30):
    events, res = [], None
    for arrays, res in stream_events(str(path), limit, chunk=chunk):
        for text in arrays:  # each a JSON array of whole entries
            events += json.loads(bytes(text))
    return events, res


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 13, 64, 1 << 20])
@pytest.mark.parametrize("gz", [False, True])
def test_events_and_head_match_json_loads(tmp_path, chunk, gz):
    raw = json.dumps(TRICKY, indent=1).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    events, res = run(path, chunk)
    assert events == TRICKY["traceEvents"]
    head = json.loads(res.head)
    assert head["distributedInfo"] == TRICKY["distributedInfo"] and head["note"] == TRICKY["note"]
    assert head["traceEvents"] == [] and not res.truncated


@pytest.mark.parametrize("seed", range(20))
def test_a_cut_file_yields_every_complete_event(tmp_path, seed):
    rng = random.Random(seed)
    doc = {"traceEvents": [{"ph": "X", "name": f"op{i} \\\" {{", "ts": i, "dur": 1, "args": {"k": [i, {"x": "]"}]}} for i in range(50)]}
    raw = json.dumps(doc).encode()
    cut = rng.randrange(len(b'{"traceEvents": [') + 1, len(raw) - 2)
    path = tmp_path / "cut.json"
    path.write_bytes(raw[:cut])
    events, res = run(path, rng.choice([3, 17, 1 << 16]))
    assert res.truncated
    # every event that was wholly inside the cut is there, in order, and nothing else
    complete = [e for e in doc["traceEvents"] if raw.find(json.dumps(e).encode()) + len(json.dumps(e)) <= cut]
    assert events == complete


def test_not_an_object_is_a_format_error(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b"[1, 2, 3]")
    with pytest.raises(FormatError):
        run(p, 4)


def test_no_trace_events_is_a_format_error(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b'{"a": "traceEvents", "b": 1}')
    with pytest.raises(FormatError):
        run(p, 4)


def test_progress_reports_bytes_read(tmp_path):
    raw = json.dumps(TRICKY).encode() * 1
    p = tmp_path / "t.json"
    p.write_bytes(raw)
    seen = []
    for _ in stream_events(str(p), 1 << 30, chunk=16, progress=lambda done, total: seen.append((done, total))):
        pass
    assert seen[-1] == (len(raw), len(raw))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("chunk", [40, 97, 256, 4096])
@pytest.mark.parametrize("indent", [None, 2])
def test_likely_cuts_inside_strings_and_args_are_refused(tmp_path, chunk, indent):
    """'}, {' inside a name or between objects of an args list is not a boundary between events."""
    rng = random.Random(chunk)
    traps = ['a}, {"ph": "X"', "}, {", "x\\\"}, {\\\""]
    events = []
    for i in range(300):
        ev = {"ph": "X", "name": rng.choice(traps) + str(i), "ts": i, "dur": 1}
        if i % 3 == 0:
            ev["args"] = {"l": [{"a": i}, {"b": "}, {"}, {"c": [{}, {}]}]}
        events.append(ev)
    doc = {"traceEvents": events, "deviceProperties": [{"id": 0}, {"id": 1}]}
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps(doc, indent=indent).encode())
    got, fast = [], 0
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk):
        for text in arrays:
            fast += isinstance(text, bytearray)  # the proven path builds its array in one buffer
            got += json.loads(bytes(text))
    assert got == events and not res.truncated
    assert json.loads(res.head)["deviceProperties"] == doc["deviceProperties"]
    assert fast  # the fast path did run, and its refusals fell back without loss


@pytest.mark.parametrize("chunk", [97, 4096])
def test_a_claim_that_decodes_proves_the_cut_and_a_refusal_falls_back(tmp_path, chunk):
    """A strict decode by the caller stands in for the skim; a refused cut goes through the scanner, losing nothing."""
    from traceflops.parsers.jsonstream import REFUSED, Claimed

    events = [{"ph": "X", "name": ("}, {" if i % 7 == 0 else "op") + str(i), "ts": i, "dur": 1,
               "args": {"l": [{"a": i}, {"b": "}, {"}]} if i % 3 == 0 else {}} for i in range(300)]
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps({"traceEvents": events}).encode())

    def claim(text):
        try:
            return json.loads(bytes(text))
        except ValueError:
            return REFUSED

    got, claimed = [], 0
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk, claim=claim):
        for item in arrays:
            if isinstance(item, Claimed):
                claimed += 1
                got += item.value
            else:
                got += json.loads(bytes(item))
    assert got == events and not res.truncated
    assert claimed


@pytest.mark.parametrize("shift", [-40, -14, -13, -12, -1, 0, 1, 2, 30, 70_000])
@pytest.mark.parametrize("after", [b"", b' {"traceEvents": [{"ph": "X", "name": "second document"}]}'])
def test_the_array_is_found_wherever_it_opens_about_the_first_piece_of_a_chunk(tmp_path, shift, after):
    """The first 64 KiB of a chunk are searched alone first: a key, a decoy in a string or the '[' straddling that
    boundary (or far past it) must read as they do in tiny chunks, which json.loads checks above."""
    from traceflops.parsers.jsonstream import HEAD_PIECE

    doc = dict(TRICKY)
    prefix = json.dumps({"pad": "", "note": doc["note"]})[:-1] + ', "traceEvents": '
    doc = {"pad": "x" * max(0, HEAD_PIECE + shift - len(prefix)), "note": doc["note"], "traceEvents": doc["traceEvents"],
           "distributedInfo": doc["distributedInfo"]}
    raw = json.dumps(doc).encode() + after
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    events, res = run(path, 8 << 20)
    small_events, small = run(path, 7)
    assert events == small_events == TRICKY["traceEvents"]
    assert (res.head, res.trailing, res.arrays) == (small.head, small.trailing, small.arrays)
    assert res.trailing == (len(after.replace(b" ", b"")) if after else 0)


@pytest.mark.parametrize("blank", [0, 70_000])
def test_a_document_that_closes_in_the_first_piece_counts_what_follows_it(tmp_path, blank):
    """The whole trace inside a chunk's first 64 KiB: what follows its close, there or past the boundary, is trailing."""
    after = b" " * blank + b'{"traceEvents": [{"ph": "X", "name": "second"}]}'
    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(TRICKY).encode() + after)
    events, res = run(path, 8 << 20)
    small_events, small = run(path, 7)
    assert events == small_events == TRICKY["traceEvents"]
    assert res.trailing == small.trailing == len(after.replace(b" ", b""))
