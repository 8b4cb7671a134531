"""Hostile content inside a readable Kineto JSON trace: what is valid is analysed, what is not is counted.

Byte-order marks, a second traceEvents array, nesting thousands deep, one
value of tens of MiB, step numbers and ranks out of range, integers beyond 64
bits: each run exits 0 with the good events' FLOPs intact and a warning that
counts what was left out (never a traceback, never exit 4). FLOPs are
2·M·K·N of the recorded mm shapes, computed here from the shapes written.
"""

from __future__ import annotations

import gzip
import json
import resource
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import Builder
from traceflops.cli.main import main
from traceflops.core.errors import NotATraceError
from traceflops.parsers.jsonstream import stream_events
from traceflops.parsers.kineto import parse_kineto

M, K, N = 64, 32, 16
MM = 2 * M * K * N  # one recorded aten::mm


def two_steps(first: int = 0, m: tuple[int, int] = (M, M)) -> Builder:
    """Two steps of one mm each (rows m[0] then m[1]), each with its kernel."""
    b = Builder()
    for s in range(2):
        t0 = 1000.0 * s
        b.annotation(f"ProfilerStep#{first + s}", t0, 900)
        b.op("aten::mm", t0 + 10, 50, **{"Input Dims": [[m[s], K], [K, N]], "Input type": ["float", "float"]})
        b.kernel("sgemm_kernel", t0 + 20, t0 + 100, 30)
    return b


def analyze(path: Path, code: int = 0) -> dict:
    # parsing is under test, not step windows: both steps in the totals (the unbounded last is left out by default)
    r = CliRunner().invoke(main, ["analyze", str(path), "--format", "json", "--peak-tflops", "1", "--no-cache", "--keep-last-step"])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert r.exit_code == code, (r.exit_code, r.stderr, r.exception)
    if code:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), r.stderr
        return {"error": lines[0]}
    return json.loads(r.stdout)


def write(path: Path, raw: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(raw, 1) if gz else raw)
    return path


def warned(d: dict, *needles: str) -> str:
    """The one warning that holds every needle."""
    hits = [w for w in d["warnings"] if all(n in w for n in needles)]
    assert len(hits) == 1, (needles, d["warnings"])
    return hits[0]


def executed(d: dict) -> int:
    return d["totals"]["flops"]["executed"]


def with_event(doc: dict, event_text: str) -> bytes:
    """The document as JSON with one more traceEvents entry, written verbatim (it need not be valid Python JSON)."""
    raw = json.dumps(doc)
    assert raw.endswith("]}") and '"traceEvents": [' in raw
    events_end = raw.rindex("]")
    return (raw[:events_end] + ", " + event_text + raw[events_end:]).encode()


# ------------------------------------------------------------------ 1. byte-order mark


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_is_analysed_like_the_file_without_it(tmp_path, gz):
    raw = json.dumps(two_steps().doc()).encode()
    plain = analyze(write(tmp_path / "plain.json", raw, gz))
    bom = analyze(write(tmp_path / "bom.json", b"\xef\xbb\xbf" + raw, gz))
    assert executed(bom) == executed(plain) == 2 * MM
    assert bom["warnings"] == plain["warnings"]
    assert [s["step"] for s in bom["steps"]] == [s["step"] for s in plain["steps"]] == [0, 1]


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 1 << 20])
def test_a_byte_order_mark_split_across_tiny_chunks_is_dropped(tmp_path, chunk):
    doc = {"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}], "distributedInfo": {"rank": 0}}
    p = write(tmp_path / "t.json", b"\xef\xbb\xbf" + json.dumps(doc).encode())
    events, res = [], None
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk):
        for text in arrays:
            events += json.loads(bytes(text))
    assert events == doc["traceEvents"] and json.loads(res.head)["distributedInfo"] == {"rank": 0}


# ------------------------------------------------------------------ 2. two traceEvents arrays


def two_arrays(first: list, second: list, doc: dict) -> bytes:
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    return (json.dumps(head)[:-1] + ', "traceEvents": ' + json.dumps(first)
            + ', "otherKey": {"traceEvents": [1]}, "traceEvents": ' + json.dumps(second) + "}").encode()


@pytest.mark.parametrize("gz", [False, True])
def test_a_second_trace_events_array_is_read_and_counted(tmp_path, gz):
    doc = two_steps(m=(M, 3 * M)).doc()  # step 1's mm is 3 × step 0's: the halves are told apart by their FLOPs
    events = doc["traceEvents"]
    step1 = next(i for i, e in enumerate(events) if e["name"] == "ProfilerStep#1")
    d = analyze(write(tmp_path / "two.json", two_arrays(events[:step1], events[step1:], doc), gz))
    assert executed(d) == MM + 3 * MM  # the sum of both halves
    assert [s["flops"]["executed"] for s in d["steps"]] == [MM, 3 * MM]
    warned(d, "2 root-level traceEvents arrays")


@pytest.mark.parametrize("chunk", [1, 5, 13, 64, 1 << 20])
def test_every_trace_events_array_streams_in_order_whatever_the_chunk(tmp_path, chunk):
    a = [{"ph": "X", "name": f"a{i} }}, {{", "ts": i, "dur": 1} for i in range(5)]
    b = [{"ph": "X", "name": f"b{i} ]", "ts": i, "dur": 1} for i in range(4)]
    doc = {"deviceProperties": [{"id": 0}]}
    p = write(tmp_path / "t.json", two_arrays(a, b, doc))
    events, res = [], None
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk):
        for text in arrays:
            events += json.loads(bytes(text))
    assert events == a + b and res.arrays == 2 and not res.truncated
    head = json.loads(res.head)
    assert head["deviceProperties"] == [{"id": 0}] and head["otherKey"] == {"traceEvents": [1]}


# ------------------------------------------------------------------ 2b. bytes after the document


@pytest.mark.parametrize("gz", [False, True])
def test_a_second_document_appended_is_not_read_and_its_bytes_are_counted(tmp_path, gz):
    """`cat a.json b.json`: the second document is no part of the first trace (its mm would add 3 × MM)."""
    first = json.dumps(two_steps().doc()).encode()
    second = b'\n' + json.dumps(two_steps(m=(3 * M, 3 * M)).doc()).encode() + b'\n'
    d = analyze(write(tmp_path / "cat.json", first + second, gz))
    assert executed(d) == 2 * MM
    blanks_aside = len(second.translate(None, b" \t\r\n"))
    assert f"({blanks_aside})" in warned(d, "after the end of the trace's JSON document")
    assert not any("root-level traceEvents arrays" in w or "before its JSON closes" in w for w in d["warnings"])


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_a_document_without_events_followed_by_a_trace_is_no_trace(tmp_path, chunk):
    """`cat meta.json trace.json`: the file's document has no traceEvents; the appended one's are not read as its own."""
    raw = b'{"displayTimeUnit": "ms"}\n' + json.dumps(two_steps().doc()).encode()
    p = write(tmp_path / "t.json", raw)
    with pytest.raises(NotATraceError, match="no traceEvents array"):
        for _ in stream_events(str(p), 1 << 30, chunk=chunk):
            pass


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_garbage_after_the_document_is_counted_whatever_the_chunk(tmp_path, chunk):
    doc = {"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}], "displayTimeUnit": "ms"}
    garbage = b' }]} {"traceEvents": [{"ph": "X", "name": "b", "ts": 2, "dur": 1}]} trailing'
    p = write(tmp_path / "t.json", json.dumps(doc).encode() + garbage)
    events, res = [], None
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk):
        for text in arrays:
            events += json.loads(bytes(text))
    assert events == doc["traceEvents"] and res.arrays == 1 and not res.truncated
    assert json.loads(res.head)["displayTimeUnit"] == "ms"
    assert res.trailing == len(garbage.translate(None, b" \t\r\n"))  # its bytes, blanks aside


# ------------------------------------------------------------------ 3. deep nesting


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_an_event_nested_too_deeply_is_counted_and_the_rest_analysed(tmp_path, depth):
    doc = two_steps().doc()
    deep = "[" * depth + "]" * depth
    bad = '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": 20, "dur": 1, "args": {"junk": ' + deep + "}}"
    d = analyze(write(tmp_path / "deep.json", with_event(doc, bad)))
    assert executed(d) == 2 * MM
    assert warned(d, "nested too deeply").startswith("events nested too deeply to decode (skipped)")


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_deep_top_level_key_is_ignored_and_the_other_fields_read(tmp_path, depth):
    b = two_steps()
    b.distributed = {"rank": 1, "world_size": 4}
    raw = json.dumps(b.doc())
    p = write(tmp_path / "deep_head.json", (raw[:-1] + ', "junk": ' + "{\"a\": [" * depth + "]}" * depth + "}").encode())
    d = analyze(p)
    assert executed(d) == 2 * MM
    warned(d, "top-level fields", "nested too deeply")
    trace = parse_kineto(str(p))
    assert (trace.meta["rank"], trace.meta["world_size"]) == (1, 4)
    assert trace.meta["device_properties"] == b.device_properties


# ------------------------------------------------------------------ 4. one huge value


def huge_kernel_name_file(tmp_path: Path, size: int) -> Path:
    doc = two_steps().doc()
    bad = '{"ph": "X", "cat": "kernel", "name": "' + "A" * size + '", "pid": 0, "tid": 7, "ts": 50, "dur": 1, "args": {"correlation": 1}}'
    return write(tmp_path / "huge.json.gz", with_event(doc, bad), gz=True)


def test_a_64_mib_kernel_name_is_skipped_as_it_streams(tmp_path):
    p = huge_kernel_name_file(tmp_path, 64 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = analyze(p)
    assert executed(d) == 2 * MM
    warned(d, "longer than 16 MiB", "skipped")
    # the value was never held: far less than its 64 MiB more than the process already peaked at (KiB on Linux)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 48 << 10


@pytest.mark.parametrize("chunk", [1, 7, 64, 150])
def test_entries_over_the_bound_are_skipped_whole_whatever_the_chunk(tmp_path, chunk):
    """Braces, quotes and escapes inside the long entries do not end them early; a long non-object entry is skipped too.

    Chunks no longer than the bound, as in real use (8 MiB chunks, a 16 MiB bound).
    """
    small = [{"ph": "X", "name": f"e{i}", "ts": i, "dur": 1} for i in range(4)]
    long_obj = {"ph": "X", "name": 'x}]"{' * 40 + "\\", "args": {"l": [{"a": "]}"}] * 20}}
    long_str = "q\\\"}{" * 60
    entries = [small[0], long_obj, small[1], long_str, small[2], long_obj, long_obj, small[3]]
    p = write(tmp_path / "t.json", json.dumps({"traceEvents": entries, "distributedInfo": {"rank": 2}}).encode())
    events, res = [], None
    for arrays, res in stream_events(str(p), 1 << 30, chunk=chunk, max_entry=200):
        for text in arrays:
            events += json.loads(bytes(text))
    assert events == small and res.oversized == 4 and not res.truncated
    assert json.loads(res.head)["distributedInfo"] == {"rank": 2}


def test_huge_top_level_fields_are_refused_quickly(tmp_path):
    raw = json.dumps(two_steps().doc())
    p = write(tmp_path / "huge_head.json.gz", (raw[:-1] + ', "junk": "' + "B" * (65 << 20) + '"}').encode(), gz=True)
    assert "top-level fields" in analyze(p, 3)["error"]


# ------------------------------------------------------------------ 5. step labels


def test_a_step_number_beyond_64_bits_is_left_out_with_a_count(tmp_path):
    b = two_steps()
    b.annotation("ProfilerStep#99999999999999999999", 2000, 900)
    b.op("aten::mm", 2010, 50, **{"Input Dims": [[M, K], [K, N]], "Input type": ["float", "float"]})
    b.kernel("sgemm_kernel", 2020, 2100, 30)
    d = analyze(b.write(Path(tmp_path) / "big_step.json.gz"))
    assert executed(d) == 2 * MM  # the steps' totals
    assert d["outside_steps"]["flops"]["forward"] == MM  # the left-out span's work, reported outside every step
    assert [s["step"] for s in d["steps"]] == [0, 1]
    warned(d, "ProfilerStep", "beyond 64 bits")


def test_a_repeated_step_number_is_renumbered_after_the_largest(tmp_path):
    b = two_steps(first=1, m=(M, 3 * M))
    b.annotation("ProfilerStep#1", 2000, 900)  # a third span, numbered like the first
    b.op("aten::mm", 2010, 50, **{"Input Dims": [[5 * M, K], [K, N]], "Input type": ["float", "float"]})
    b.kernel("sgemm_kernel", 2020, 2100, 30)
    d = analyze(b.write(Path(tmp_path) / "dup_step.json.gz"))
    assert [(s["step"], s["name"], s["flops"]["executed"]) for s in d["steps"]] == [
        (1, "ProfilerStep#1", MM), (2, "ProfilerStep#2", 3 * MM), (3, "ProfilerStep#1", 5 * MM)]
    assert "(1 → 3)" in warned(d, "step numbers used by more than one step span")


# ------------------------------------------------------------------ 6. ranks and world sizes


@pytest.mark.parametrize(
    "dist, needle",
    [
        ({"rank": 1 << 63, "world_size": 4}, "rank"),
        ({"rank": -1, "world_size": 4}, "rank"),
        ({"rank": 0, "world_size": -8}, "world_size"),
        ({"rank": 0, "world_size": 3e7}, "world_size"),
        ({"rank": 0, "world_size": 30_000_000}, "world_size"),
        ({"rank": 0, "world_size": 4.5}, "world_size"),
        ({"rank": 0, "world_size": 0}, "world_size"),
        ({"rank": 5, "world_size": 4}, "not below"),
    ],
)
def test_unusable_ranks_and_world_sizes_are_ignored_with_a_warning(tmp_path, dist, needle):
    b = two_steps()
    b.distributed = dist
    d = analyze(b.write(Path(tmp_path) / "dist.json.gz"))
    assert executed(d) == 2 * MM
    usable = {k: v for k, v in dist.items() if needle not in ("not below", k)}
    assert d["inputs"][0]["world_size"] == usable.get("world_size")
    assert d["inputs"][0]["rank"] == usable.get("rank")
    warned(d, "distributedInfo", needle)


def test_a_usable_rank_and_world_size_are_kept(tmp_path):
    b = two_steps()
    b.distributed = {"rank": 3, "world_size": 8}
    d = analyze(b.write(Path(tmp_path) / "dist.json.gz"))
    assert (d["inputs"][0]["rank"], d["inputs"][0]["world_size"]) == (3, 8)
    assert not [w for w in d["warnings"] if "distributedInfo" in w]


# ------------------------------------------------------------------ 7. integers beyond 64 bits


HUGE = ["99999999999999999999999", "-99999999999999999999999", "1e400"]


@pytest.mark.parametrize("number", HUGE)
@pytest.mark.parametrize("field", ["ts", "dur", "pid"])
def test_a_huge_number_in_an_event_field_is_counted(tmp_path, field, number):
    doc = two_steps().doc()
    fields = {"ts": 20, "dur": 1, "pid": 100} | {field: "@"}
    bad = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1, **fields}).replace('"@"', number)
    d = analyze(write(tmp_path / "huge_number.json", with_event(doc, bad)))
    assert executed(d) == 2 * MM
    if field != "pid":  # a pid is an identifier, kept as text
        assert any("skipped" in w for w in d["warnings"]), d["warnings"]


@pytest.mark.parametrize("number", ["99999999999999999999999", "-99999999999999999999999"])
@pytest.mark.parametrize("arg", ["correlation", "External id", "Sequence number", "device", "bytes", "Input Dims"])
def test_an_integer_beyond_64_bits_in_an_arg_is_counted(tmp_path, arg, number):
    doc = two_steps().doc()
    value = f"[[{number}, 2]]" if arg == "Input Dims" else number
    bad = json.dumps({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 9, "ts": 150, "dur": 1,
                      "args": {"correlation": 5, "device": 0, "stream": 9, arg: "@"}}).replace('"@"', value)
    if arg in ("External id", "Sequence number", "Input Dims"):  # args of an op
        bad = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": 15, "dur": 1,
                          "args": {arg: "@"}}).replace('"@"', value)
    d = analyze(write(tmp_path / "huge_arg.json", with_event(doc, bad)))
    assert executed(d) == 2 * MM
    warned(d, f"'{arg}' values", "read as missing")
