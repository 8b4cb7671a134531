"""The annotated trace streamed array by array: the same document whatever the arrays, and the layouts the parser reads.

Expectations come from the trace as built (which events are device activities,
in what order) and from the analysis' own rows, never from the annotator.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import traceflops.export.perfetto.prepare as annotate_module
from tests.builders import BF16, Builder, write_doc
from tests.report.test_annotate import K, M, N, gpu_doc
from tests.report.test_redaction import leaks, planted_trace
from traceflops.core.errors import FormatError
from traceflops.export.perfetto import annotate
from traceflops.run.load import analyze

DEVICE_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def device_activities(events: list) -> list[int]:
    """Positions of the events the parser numbers as device activities, by the rules as documented (file order)."""
    def numbered(e):
        return (isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and isinstance(e.get("name"), str)
                and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0)
    return [i for i, e in enumerate(events) if numbered(e)]


def read(path) -> dict:
    return json.loads(gzip.decompress(Path(path).read_bytes()))


@pytest.fixture
def tiny_arrays(monkeypatch):
    """The input read a few hundred bytes at a time: every array holds a handful of entries, ids count across them."""
    monkeypatch.setattr(annotate_module, "CHUNK", 300)


@pytest.mark.parametrize("chunked", [False, True], ids=["one array", "many arrays"])
def test_each_device_activity_gets_its_own_analysis_row(tmp_path, request, chunked):
    if chunked:
        request.getfixturevalue("tiny_arrays")
    doc = gpu_doc()
    src = write_doc(doc, tmp_path / "in.json.gz")
    a = analyze(src)
    s = annotate(src, a, str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    events = doc["traceEvents"]
    assert len(got["traceEvents"]) == len(events) + s["events_added"] and s["events_in"] == len(events)
    rows = {r["kernel_id"]: r for r in a.kernels.iter_rows(named=True)}
    positions = device_activities(events)
    assert len(positions) == a.kernels.height == 6  # the memset, three GEMMs, the optimizer and the all-reduce
    for k, i in enumerate(positions):
        args, r = got["traceEvents"][i]["args"], rows[k]
        assert got["traceEvents"][i]["name"] == events[i]["name"] == r["name"]
        assert (args["traceflops.phase"], args["traceflops.class"], args["traceflops.step"]) == (r["phase"], r["cls"], r["step"])
        assert args["traceflops.flops"] == (None if r["flops"] is None else pytest.approx(r["flops"]))
    fwd = next(got["traceEvents"][i]["args"] for i in positions if events[i]["name"] == "sm90_gemm_fwd")
    assert fwd["traceflops.flops"] == 2 * M * K * N
    marked = {i for i, e in enumerate(got["traceEvents"][: len(events)]) if "traceflops.class" in (e.get("args") or {})}
    assert marked == set(positions)
    for before, after in zip(events, got["traceEvents"]):  # everything but the added args as it was
        assert {k: v for k, v in after.items() if k != "args"} == {k: v for k, v in before.items() if k != "args"}


def test_many_small_arrays_write_the_same_document_as_one(tmp_path, monkeypatch):
    src, secrets = planted_trace(tmp_path / "planted.json.gz")
    a = analyze(src)
    one = annotate(src, a, str(tmp_path / "one.json.gz"))
    monkeypatch.setattr(annotate_module, "CHUNK", 256)
    many = annotate(src, a, str(tmp_path / "many.json.gz"))
    text = gzip.decompress((tmp_path / "many.json.gz").read_bytes()).decode()
    assert text == gzip.decompress((tmp_path / "one.json.gz").read_bytes()).decode()
    assert {k: v for k, v in many.items() if k != "path"} == {k: v for k, v in one.items() if k != "path"}
    assert leaks(text, secrets) == []
    assert many["redacted_values"] >= len(secrets) - 2


def test_top_level_keys_keep_their_order_around_the_events(tmp_path):
    doc = gpu_doc()
    events = doc.pop("traceEvents")
    doc = {"first": {"a": 1}, **doc, "traceEvents": events, "last": [1, 2]}
    src = write_doc(doc, tmp_path / "in.json.gz")
    annotate(src, analyze(src), str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    assert list(got) == [*doc, "traceflops"]
    assert got["last"] == [1, 2] and got["first"] == {"a": 1}


# --- layouts the parser reads and the whole-document decode did not -----------------------------


def two_steps() -> Builder:
    b = Builder()
    for s in range(2):
        t0 = 1000.0 * s
        b.annotation(f"ProfilerStep#{s}", t0, 900)
        b.op("aten::mm", t0 + 10, 50, **{"Input Dims": [[M, K], [K, N]], "Input type": [BF16, BF16]})
        b.kernel("sm90_gemm_fwd", t0 + 20, t0 + 100, 30)
    return b


def marked_kernels(got: dict) -> list[dict]:
    return [e for e in got["traceEvents"] if e.get("cat") == "kernel" and "traceflops.flops" in (e.get("args") or {})]


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_annotates_like_the_file_without_it(tmp_path, gz):
    raw = json.dumps(two_steps().doc()).encode()
    (tmp_path / "plain").mkdir()
    (tmp_path / "bom").mkdir()
    outs = []
    for name, data in (("plain", raw), ("bom", b"\xef\xbb\xbf" + raw)):
        src = tmp_path / name / "t.json"
        src.write_bytes(gzip.compress(data) if gz else data)
        out = tmp_path / name / "out.json.gz"
        annotate(str(src), analyze(str(src)), str(out))
        outs.append(read(out))
    assert outs[1] == outs[0]
    assert [e["args"]["traceflops.flops"] for e in marked_kernels(outs[1])] == [2 * M * K * N] * 2


def test_a_second_trace_events_array_is_annotated_and_written_as_one(tmp_path):
    doc = two_steps().doc()
    events = doc["traceEvents"]
    cut = next(i for i, e in enumerate(events) if e["name"] == "ProfilerStep#1")
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    raw = (json.dumps(head)[:-1] + ', "traceEvents": ' + json.dumps(events[:cut])
           + ', "otherKey": {"traceEvents": [1]}, "traceEvents": ' + json.dumps(events[cut:]) + "}")
    src = tmp_path / "two.json"
    src.write_text(raw)
    a = analyze(str(src))
    assert a.kernels.height == 2
    s = annotate(str(src), a, str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    assert got["traceEvents"][: len(events)] != events  # args were added
    assert [{k: v for k, v in e.items() if k != "args"} for e in got["traceEvents"][: len(events)]] == \
        [{k: v for k, v in e.items() if k != "args"} for e in events]
    assert [e["ts"] for e in marked_kernels(got)] == [100, 1100]  # one kernel of each array
    assert got["otherKey"] == {"traceEvents": [1]}
    assert s["events_in"] == len(events) and any("2 root-level traceEvents arrays" in w for w in s["warnings"])


def events_text(doc: dict, first: str) -> str:
    """The document as JSON with `first` (verbatim text) as its first traceEvents entry."""
    raw = json.dumps(doc)
    at = raw.index('"traceEvents": [') + len('"traceEvents": [')
    return raw[:at] + first + ", " + raw[at:]


@pytest.mark.parametrize("depth", [1_010, 100_000])
def test_an_event_nested_too_deeply_is_written_through_unannotated(tmp_path, depth):
    """1 010 levels: orjson reads it, the parser does not (and numbers it as nothing); 100 000: neither does."""
    doc = two_steps().doc()
    deep = '{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 1, "ts": 5, "dur": 1, "args": {"junk": ' \
        + "[" * depth + "]" * depth + "}}"
    src = tmp_path / "deep.json"
    src.write_text(events_text(doc, deep))
    a = analyze(str(src))
    assert a.ops.height == 4  # two steps and two mm: the deep op is not one of them
    out = tmp_path / "out.json"
    s = annotate(str(src), a, str(out))
    text = out.read_text()
    assert deep in text  # its bytes, unchanged
    got = json.loads(text.replace(deep, '{"ph": "X", "name": "stand-in"}'))
    assert got["traceEvents"][0] == {"ph": "X", "name": "stand-in"}
    assert [e["args"]["traceflops.flops"] for e in marked_kernels(got)] == [2 * M * K * N] * 2
    mm = [e for e in got["traceEvents"] if e.get("name") == "aten::mm"]
    assert [e["args"]["traceflops.flops"] for e in mm] == [2 * M * K * N] * 2
    assert s["events_in"] == len(doc["traceEvents"]) + 1
    assert any("1 traceEvents entries that do not decode" in w for w in s["warnings"])


def test_a_trace_that_disagrees_late_is_refused_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(annotate_module, "CHUNK", 300)
    b = two_steps()
    src = b.write(tmp_path / "t.json.gz")
    a = analyze(src)
    doc = b.doc()
    doc["traceEvents"][-1]["name"] = "renamed"  # the last kernel: found only after earlier arrays were written
    other = write_doc(doc, tmp_path / "other.json.gz")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(FormatError, match="device activity 1 is 'renamed' here"):
        annotate(other, a, str(out_dir / "x.json.gz"))
    assert list(out_dir.iterdir()) == []


def test_a_cut_file_is_refused(tmp_path):
    raw = json.dumps(two_steps().doc()).encode()
    src = tmp_path / "t.json"
    src.write_bytes(raw)
    a = analyze(str(src))
    src.write_bytes(raw[: len(raw) - 40])
    with pytest.raises(FormatError, match="not a complete JSON document"):
        annotate(str(src), a, str(tmp_path / "out.json.gz"))
    assert not (tmp_path / "out.json.gz").exists()


def test_the_output_is_one_valid_document_with_its_record_last(tmp_path):
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    s = annotate(src, analyze(src), str(tmp_path / "o.json"))
    doc = orjson.loads((tmp_path / "o.json").read_bytes())
    assert list(doc)[-1] == "traceflops" and doc["traceflops"]["events_in"] == len(gpu_doc()["traceEvents"])
    assert "warnings" not in s  # a plain trace: nothing left out


def test_annotating_holds_one_array_not_the_trace(tmp_path):
    """A 30 MB trace: annotate's peak stays within tens of MB of what the analysis already took (KiB on Linux).

    Decoding the whole document as Python objects takes about ten times its size.
    """
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 4e6)
    for i in range(90_000):
        b.kernel(f"sgemm_kernel_{i % 97}", 10 + 50 * i, 20 + 50 * i, 30, grid=[i, 1, 1], block=[128, 1, 1])
    src = b.write(tmp_path / "big.json", gz=False)
    assert Path(src).stat().st_size > 25 << 20
    # In a fresh process: this one's lifetime peak may already be above anything annotate reaches.
    code = ("import resource, sys\n"
            "from traceflops.run.load import analyze\n"
            "from traceflops.export.perfetto import annotate\n"
            "a = analyze(sys.argv[1])\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "s = annotate(sys.argv[1], a, sys.argv[2])\n"
            "print(s['kernels_annotated'], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    out = subprocess.run([sys.executable, "-c", code, src, str(tmp_path / "out.json.gz")], capture_output=True, text=True, check=True)
    annotated, grew_kib = map(int, out.stdout.split())
    assert annotated == 90_000
    assert grew_kib < 64 << 10


def test_a_top_level_field_nested_too_deeply_is_left_out_and_counted(tmp_path):
    b = two_steps()
    b.distributed = {"rank": 1, "world_size": 4}
    raw = json.dumps(b.doc())
    src = tmp_path / "deep_head.json"
    src.write_text(raw[:-1] + ', "junk": ' + '{"a": [' * 5000 + "]}" * 5000 + ', "after": 7}')
    s = annotate(str(src), analyze(str(src)), str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    assert "junk" not in got and got["after"] == 7 and got["distributedInfo"] == {"rank": 1, "world_size": 4}
    assert [e["args"]["traceflops.flops"] for e in marked_kernels(got)] == [2 * M * K * N] * 2
    assert any(w.startswith("1 top-level fields") for w in s["warnings"])


@pytest.mark.parametrize("which", ["gpu", "cpu", "shared gpu", "shared graph replay", "xplane"])
def test_the_analysis_kept_for_annotating_writes_the_same_trace(tmp_path, which, shared):
    """`for_annotation` lets go of what annotating never reads: the output must not change (a column it dropped and
    annotate reads would fail or write nulls here)."""
    from tests.builders import ROOT
    from traceflops.export.perfetto import for_annotation
    from traceflops.views.rollup import launching_rows, module_of

    src = {"gpu": lambda: write_doc(gpu_doc(), tmp_path / "in.json.gz"),
           "cpu": lambda: str(next(iter(sorted((ROOT / "fixtures" / "cpu").glob("*.json.gz"))))),
           "shared gpu": lambda: str(shared / "kineto" / "v100_transformer_rank1.json.gz"),
           "shared graph replay": lambda: str(shared / "kineto" / "vllm_graphs_piecewise" / "graph_execution.json.gz"),
           "xplane": lambda: str(next(iter(sorted((ROOT / "fixtures").rglob("*.xplane.pb")))))}[which]()
    a = analyze(src)
    named = a.kernels.height and a.meta.get("format") != "xplane"
    full = annotate(src, a, str(tmp_path / "full.json.gz"), module_of(a.ops) if named else None)
    slim = for_annotation(a)  # modules named after slimming, from the ops that launched kernels (as the command does)
    kept = annotate(src, slim, str(tmp_path / "kept.json.gz"), module_of(slim.ops, launching_rows(slim.kernels)) if named else None)
    assert {**full, "path": None} == {**kept, "path": None}
    got = read(tmp_path / "kept.json.gz")
    assert read(tmp_path / "full.json.gz") == got
    if which != "xplane":  # every device activity and op the file holds is given its args, and counted as such
        marked = [e for e in got["traceEvents"] if e.get("cat") != "traceflops" and "traceflops.phase" in (e.get("args") or {})]
        assert len(marked) == kept["kernels_annotated"] + kept["ops_annotated"]


@pytest.mark.parametrize("user", [None, "narenas:2"])
def test_annotating_hands_freed_pages_back_promptly_not_at_once_unless_the_user_set_the_allocator(tmp_path, user):
    """Freed pages go back after polars' prompt decay, as in `analyze`: handing them back at once faulted three times
    the pages (a fifth of annotate's time) for a peak 1% lower. A user's own allocator setting is kept as given."""
    from tests.run.test_job_memory import CONF, last_values

    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    code = ("import os, sys; from click.testing import CliRunner; from traceflops.cli.main import main\n"
            f"r = CliRunner().invoke(main, ['annotate', '--no-cache', {src!r}, '-o', {str(tmp_path / 'out.json.gz')!r}])\n"
            "assert r.exit_code == 0, r.output\n"
            f"print(os.environ[{CONF!r}])")
    env = {k: v for k, v in os.environ.items() if k != CONF} | ({CONF: user} if user else {})
    conf = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
    if user:  # polars puts its own defaults first, as it loads
        assert conf.endswith(user) and "dirty_decay_ms:0" not in conf, conf
    else:
        assert last_values(conf)["dirty_decay_ms"] == "300" and last_values(conf)["muzzy_decay_ms"] == "0", conf


def test_a_document_appended_after_the_trace_is_left_out_and_counted(tmp_path):
    """What follows the root object's close is no part of the trace: the parser does not read it, nor does annotate."""
    first = orjson.dumps(gpu_doc())
    appended = b'\n{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "extra", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}'
    src = tmp_path / "cat.json"
    src.write_bytes(first + appended)
    s = annotate(str(src), analyze(str(src)), str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    assert s["events_in"] == len(gpu_doc()["traceEvents"])
    assert not any(e.get("name") == "extra" for e in got["traceEvents"])
    non_blank = len(appended.translate(None, b" \n"))
    assert any(f"{non_blank} bytes after the end" in w for w in s["warnings"])


def test_an_event_with_a_number_no_double_holds_is_numbered_as_the_parser_does(tmp_path):
    """1e400 in a field the parser does not read: the parser keeps the kernel, orjson cannot decode it. The ids after
    it must still be the parser's (else the analysis and the trace disagree), and it is written through as it was."""
    doc = gpu_doc()
    fwd = next(e for e in doc["traceEvents"] if e.get("name") == "sm90_gemm_fwd")
    fwd["junk"] = 987654321987
    raw = json.dumps(doc).encode().replace(b"987654321987", b"1e400")
    src = tmp_path / "huge.json.gz"
    src.write_bytes(gzip.compress(raw))
    a = analyze(str(src))
    assert "sm90_gemm_fwd" in a.kernels["name"].to_list()  # the parser read it
    s = annotate(str(src), a, str(tmp_path / "out.json.gz"))
    out = gzip.decompress((tmp_path / "out.json.gz").read_bytes())
    assert b'"junk": 1e400' in out  # its own bytes
    got = json.loads(out)
    marked = marked_kernels(got)
    assert "sm90_gemm_fwd" not in [e["name"] for e in marked]
    # every other kernel carries its own FLOPs: an id shifted by one would give a kernel its neighbour's
    assert sorted(e["args"]["traceflops.flops"] for e in marked if e["name"] == "sm90_gemm_bwd") == [2 * M * K * N] * 2
    assert any("a number no double holds" in w for w in s["warnings"])


@pytest.mark.parametrize("junk", ["1e400", "[" * 100_000 + "]" * 100_000])
def test_a_metadata_entry_that_does_not_decode_is_left_out_not_written_through(tmp_path, junk):
    """A process label's args are redacted by key; one that cannot be decoded (a number no double holds: the parser
    still reads it; nested too deeply: nobody does) cannot be, so it is left out and counted, not copied as it was."""
    doc = two_steps().doc()
    meta = '{"ph": "M", "name": "process_labels", "pid": 100, "args": {"api_token": "hunter2hunter2", "junk": ' + junk + "}}"
    src = tmp_path / "meta.json"
    src.write_text(events_text(doc, meta))
    a = analyze(str(src))
    out = tmp_path / "out.json"
    s = annotate(str(src), a, str(out))
    text = out.read_text()
    assert "hunter2" not in text
    assert "process_labels" not in text
    got = json.loads(text)
    assert [e["args"]["traceflops.flops"] for e in marked_kernels(got)] == [2 * M * K * N] * 2
    assert s["events_in"] == len(doc["traceEvents"]) + 1
    assert any("1 metadata ('M') entries that do not decode left out" in w for w in s["warnings"])


@pytest.mark.parametrize("twice", [False, True], ids=["keys once", "a key before and after the events"])
def test_a_key_given_again_after_the_events_is_written_as_a_json_reader_reads_it(tmp_path, twice):
    """A key given again after the events (a JSON reader keeps the last value, in the key's first place) is written
    once, with its last value, where a reader puts it."""
    doc = gpu_doc()
    body = orjson.dumps({"run": "first", **doc})[:-1]
    if twice:
        body += b',"run":"second"'
    src = tmp_path / "in.json"
    src.write_bytes(body + b"}")
    annotate(str(src), analyze(str(src)), str(tmp_path / "out.json.gz"))
    got = read(tmp_path / "out.json.gz")
    assert got["run"] == ("second" if twice else "first")
    assert list(got)[0] == "run"  # where a JSON reader puts the key: its first place
    assert len(got["traceEvents"]) > len(doc["traceEvents"])
