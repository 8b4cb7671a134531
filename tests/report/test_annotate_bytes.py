"""The annotated trace keeps the input's own bytes where nothing changes them, and decodes what a rule could change.

Expectations come from the input's bytes and from the values annotate is documented to add to an event
(`add_kernel_args`, `add_op_args` below, written from the README's list), never from the splice.
"""

from __future__ import annotations

import gzip
import json
import math
import re

import numpy as np
import orjson
import polars as pl
import pytest

from tests.report.test_annotate import gpu_doc
from traceflops.core.redact import MAY_CHANGE, MAY_CHANGE_LITERALS, REDACTED
from traceflops.export.perfetto import annotate, for_annotation
from traceflops.export.perfetto.added import FORMS, holes, kernel_members, op_members
from traceflops.export.perfetto.redact import PlainKeys
from traceflops.export.perfetto.stream import _kernel_args
from traceflops.export.perfetto.tracks import num, tflops
from traceflops.run.load import analyze


def event_args(e: dict) -> dict:
    """The event's args object, created if absent (args that are not an object gain nothing)."""
    if e.get("args") is None:
        e["args"] = {}
    return e["args"] if isinstance(e["args"], dict) else {}


def add_kernel_args(e: dict, r: dict) -> None:
    """What a device activity gains, by the list in the README and `stream`'s docstring."""
    args = event_args(e)
    args["traceflops.phase"] = r["phase"]
    args["traceflops.class"] = r["cls"]
    args["traceflops.flops"] = num(r["flops"])
    args["traceflops.achieved_tflops"] = tflops(r["flops"], r["dur"])
    args["traceflops.step"] = r["step"]
    for key in ("module", "bound", "intensity", "recoverable_us"):
        if r[key] is not None:
            args[f"traceflops.{key}"] = r[key]


def add_op_args(e: dict, r: dict) -> None:
    """What an op gains: its phase; a matmul-class op also its FLOPs and whether it ran."""
    args = event_args(e)
    args["traceflops.phase"] = r["phase"]
    if r["matmul"]:
        args["traceflops.flops"] = num(r["flops"])
        args["traceflops.ran"] = bool(r["ran"])


def written(doc_bytes: bytes, tmp_path) -> tuple[bytes, dict]:
    src = tmp_path / "in.json"
    src.write_bytes(doc_bytes)
    a = analyze(str(src))
    s = annotate(str(src), a, str(tmp_path / "out.json.gz"))
    return gzip.decompress((tmp_path / "out.json.gz").read_bytes()), s


def odd_layout(doc: dict) -> tuple[bytes, list[bytes]]:
    """The document with each event written in a layout orjson would not write (spaces, `1.50` for 1.5, keys in an
    unusual order, args last as profilers write them); the events' bytes."""
    texts = []
    for e in doc["traceEvents"]:
        keys = [k for k in reversed(list(e)) if k != "args"] + (["args"] if "args" in e else [])
        body = json.dumps({k: e[k] for k in keys}, separators=(" ,  ", " :  "))
        texts.append(body.replace(".5,", ".50,").encode())
    return b'{"traceEvents": [\n' + b",\n".join(texts) + b'\n], "displayTimeUnit": "ms"}', texts


def test_entries_that_gain_nothing_keep_their_bytes_and_annotated_ones_their_own_around_the_args(tmp_path):
    doc = gpu_doc()
    data, texts = odd_layout(doc)
    out, s = written(data, tmp_path)
    got = orjson.loads(out)
    marked = [i for i, e in enumerate(got["traceEvents"][: len(texts)]) if "traceflops.phase" in (e.get("args") or {})]
    assert marked and s["events_in"] == len(texts)
    for i, text in enumerate(texts):
        if i in marked:
            if b'"args"' in text:  # the bytes up to the args' last member, as they were
                head = text[: text.rindex(b"}", 0, text.rindex(b"}"))]
                assert head in out
        else:
            assert text in out, text  # byte for byte, spaces and number spelling included
    for before, after in zip(doc["traceEvents"], got["traceEvents"]):
        assert {k: v for k, v in after.items() if k != "args"} == {k: v for k, v in before.items() if k != "args"}


def test_an_entry_a_rule_changes_is_decoded_and_redacted_its_neighbours_kept(tmp_path):
    doc = gpu_doc()
    kernel = next(e for e in doc["traceEvents"] if e.get("name") == "sm90_gemm_fwd")
    kernel.setdefault("args", {})["api_key"] = "PLANTEDsecret1"  # a secret key: only the key rules see it
    doc["traceEvents"].append(
        {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 1, "s": "t", "args": {"Env": {"HOME": "PLANTED2"}}}
    )
    data, texts = odd_layout(doc)
    out, s = written(data, tmp_path)
    assert b"PLANTED" not in out
    got = orjson.loads(out)
    k = next(e for e in got["traceEvents"] if e.get("name") == kernel["name"] and e.get("cat") == "kernel")
    assert k["args"]["api_key"] == REDACTED and "traceflops.phase" in k["args"]
    assert s["redacted_values"] >= 2
    for i, text in enumerate(texts):  # every other entry that gains nothing as it was
        if b"PLANTED" not in text and "traceflops.phase" not in (got["traceEvents"][i].get("args") or {}):
            assert text in out


@pytest.mark.parametrize("planted", ['"url": "tcp://u:pw@h:1"', '"n": "a\\u0020b"', '"n": "caf\\u00e9"', '"x": 1e400'])
def test_any_entry_a_rule_could_change_is_found_in_its_array(planted):
    """Each reason to decode first, in an entry among plain ones, is found for that entry alone."""
    from traceflops.export.perfetto.entries import claim_parts
    from traceflops.export.perfetto.prepare import _decode_first

    plain = (
        b'{"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"a": 1}}'
    )
    odd = b'{"ph": "i", "name": "m", "pid": 1, "tid": 1, "ts": 1, ' + planted.encode() + b', "args": {"b": 2}}'
    p = claim_parts(bytearray(b"[" + b", ".join([plain] * 5 + [odd] + [plain] * 5) + b"]"))
    assert _decode_first(p, PlainKeys()) == [5]


def test_every_may_change_alternative_is_found_by_its_literals():
    samples = [
        "a=b",
        "--x",
        "s://",
        "BeArEr x",
        "BASIC y",
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "hf_",
        "sk-",
        "xoxa-",
        "xoxb-",
        "xoxp-",
        "xoxo-",
        "xoxs-",
        "xoxr-",
        "AKIA",
        "ASIA",
        "AIza",
        "glpat-",
        "npm_",
        "eyJ",
        "-----BEGIN",
    ]
    for s in samples:
        assert re.search(MAY_CHANGE, s), s
        assert any(lit in s.lower() for lit in MAY_CHANGE_LITERALS), s


def test_the_literal_search_is_its_definition_on_random_texts():
    """What sends an entry to be decoded, by its definition: text other than ASCII, 309 digits in a row, or a literal
    in any ASCII case with every digit read as '0' (so '0e' is any digit before an 'e'). Checked by translating and
    lowering each text in Python, against the one search the array gets."""
    import random

    from traceflops.export.perfetto.prepare import _LITERALS, _literal

    rng = random.Random(7)
    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _:/.,{}\"[]-=\\")
    planted = [*MAY_CHANGE_LITERALS, "traceflops.", "7E", "0e", "\u00e9", "\u212a"]  # Kelvin sign: not ASCII 'k'
    texts = []
    for _ in range(20000):
        s = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.3:
            lit = "".join(c.upper() if rng.random() < 0.5 else c for c in rng.choice(planted))
            k = rng.randint(0, len(s))
            s = s[:k] + lit + s[k:]
        texts.append(s.encode())
    texts += [b"1" * 309, b"x" + b"9" * 309, b"1" * 308 + b"x", b"\xff\xfe", b""]
    digits_as_zero = bytes.maketrans(b"123456789", b"000000000")

    def by_definition(t: bytes) -> bool:
        shown = t.translate(digits_as_zero)
        if not t.isascii() or b"0" * 309 in shown:
            return True
        return any(lit.lower().encode() in shown.lower() for lit in _LITERALS)

    want = [by_definition(t) for t in texts]
    assert 0.2 < sum(want) / len(want) < 0.8  # both answers are well represented
    assert _literal(texts).to_list() == want


def test_plain_keys_learn_plain_names_and_refuse_secret_ones():
    keys = PlainKeys()
    assert keys.plain(b'[{"External id": 1, "grid": [1, 2]}, {"Ev Idx": 3}]')
    assert keys.plain(b'[{"External id": 4}]')
    for bad in (
        b'[{"apiKey": 1}]',
        b'[{"environ": {}}]',
        b'[{"tok\xe2\x84\xaaen": 1}]',
        b"[[1]]",
        b'[{"password": "x"}]',
    ):
        assert not keys.plain(bad), bad


SPLICE_CASES = [  # (entry, the args text a strict decode reads, or None where it has no args key, takes members)
    (b'{"ph": "X", "args": {"a": 1}}', b'{"a": 1}', True),
    (b'{"ph":"X","args":{ }\n}', b"{ }", True),
    (b'{"ph":"X","args":{}}', b"{}", True),
    (b'{"ph":"X"}', None, True),
    (b"{}", None, True),
    (b'{ "ph" : "X" ,\n  "args" :\t{"a": {"b": [1, 2]}}  \n\t}', b'{"a": {"b": [1, 2]}}', True),
    (b'{"args": {"a": 1}, "ph": "X"}', b'{"a": 1}', False),  # args not last
    (b'{"ph": "X", "args": null}', b"null", False),
    (b'{"ph": "X", "args": [1]}', b"[1]", False),
    (b'{"x": {"args": {"a": 1}}}', b'{"a": 1}', False),  # the args of another object: this entry has none
    (b'{"w": "args", "args": {"a": 1}}', b'{"a": 1}', True),
    (b'{"a": "{\\"args\\": 1}"}', None, True),  # "args" inside a string
]


@pytest.mark.parametrize("absent", [None, b""])  # no args key: as written, or as the fields' decode leaves it
def test_the_args_are_inserted_where_a_decoded_event_would_gain_them(absent):
    """Each entry that can take members as bytes, given them at its place, reads back as the decoded entry with the
    members added to its args (created last where it had none); the others are refused (decoded instead)."""
    m = '"traceflops.phase":"forward","traceflops.flops":12'
    fits, offset, form = holes([e for e, _, _ in SPLICE_CASES], [absent if a is None else a for _, a, _ in SPLICE_CASES])
    assert fits.tolist() == [ok for _, _, ok in SPLICE_CASES]
    inserted = [FORMS[f][0] + m.encode() + FORMS[f][1] for f in form[fits].tolist()]
    for (entry, _, _), at, new in zip([c for c in SPLICE_CASES if c[2]], offset[fits].tolist(), inserted):
        want = orjson.loads(entry)
        event_args(want).update({"traceflops.phase": "forward", "traceflops.flops": 12})
        assert orjson.loads(entry[:at] + new + entry[at:]) == want, entry
        assert list(orjson.loads(entry[:at] + new + entry[at:])) == list(want), entry  # args where a decode puts it
    assert set(form[fits].tolist()) == set(FORMS)  # every form met


def test_the_added_members_are_the_decoded_events_own(tmp_path):
    """Per analysis row, the members' text reads as the values `add_kernel_args` / `add_op_args` add, numbers
    included (an integral FLOP count as an integer, NaN as null)."""
    src = tmp_path / "in.json.gz"
    src.write_bytes(gzip.compress(json.dumps(gpu_doc()).encode()))
    a = for_annotation(analyze(str(src)))
    k = _kernel_args(a, None).sort("kernel_id")
    k = k.vstack(k.head(1).with_columns(flops=pl.lit(float("nan")), kernel_id=pl.lit(10**6, pl.Int64)))
    members = kernel_members(k)
    for m, r in zip(members.run(0, k.height), k.iter_rows(named=True), strict=True):
        want: dict = {}
        add_kernel_args({"args": want}, r)
        got = orjson.loads(b"{" + m + b"}")
        assert got.keys() == want.keys()
        for key, v in want.items():
            assert got[key] == (None if isinstance(v, float) and math.isnan(v) else v), key
            assert type(got[key]) is type(orjson.loads(orjson.dumps(v))), key
    o = a.ops.select("op_id", "name", "ts", "phase", "matmul", "ran", "flops").sort("op_id")
    members = op_members(o)
    for m, r in zip(members.run(0, o.height), o.iter_rows(named=True), strict=True):
        want = {}
        add_op_args({"args": want}, r)
        assert orjson.loads(b"{" + m + b"}") == orjson.loads(orjson.dumps(want))


def test_the_added_rates_are_the_decoded_routes_to_the_last_bit():
    """`traceflops.achieved_tflops` spliced as text is `tracks.tflops` of the same FLOPs and duration exactly: a
    division computed another way (by a constant's reciprocal) differs in the last bit for some values."""
    from traceflops.export.perfetto.tracks import tflops

    rng = np.random.default_rng(7)
    flops = np.concatenate([rng.integers(1, 10**12, 500).astype(float), rng.random(500) * 1e9])
    dur = np.concatenate([rng.integers(1, 10**5, 500).astype(float), rng.random(500) * 1e3 + 0.001])
    n = len(flops)
    k = pl.DataFrame({"phase": ["forward"] * n, "cls": ["matmul"] * n, "flops": flops, "dur": dur, "step": [1] * n,
                      "module": [None] * n, "bound": [None] * n, "intensity": [None] * n, "recoverable_us": [None] * n},
                     schema_overrides={"module": pl.Utf8, "bound": pl.Utf8, "intensity": pl.Float64,
                                       "recoverable_us": pl.Float64})
    got = [orjson.loads(b"{" + m + b"}")["traceflops.achieved_tflops"] for m in kernel_members(k).run(0, n)]
    assert got == [tflops(f, d) for f, d in zip(flops.tolist(), dur.tolist())]


def test_floats_are_written_as_orjson_writes_them():
    """The spliced members and added events write floats in polars; the decoded route writes them with orjson: the
    same text for every double (random bit patterns over every exponent, the edges of integers and notations), null
    for what JSON cannot hold."""
    from traceflops.export.perfetto.added import json_floats

    rng = np.random.default_rng(11)
    v = rng.integers(0, 2**64 - 1, 300_000, dtype=np.uint64, endpoint=True).view(np.float64)
    edges = [0.0, -0.0, 0.1, 1.0, 123.0, 2.0**53, 2.0**53 + 2, 1e15 + 0.5, 1e16, 1e21, 1e22, 1e-5, 1e-7, 5e-324,
             1.7976931348623157e308, -2.5e-308, 9.999999999999999e22]
    finite = [*v[np.isfinite(v)].tolist(), *edges]
    assert json_floats(pl.Series(finite)).to_list() == orjson.dumps(finite).decode()[1:-1].split(",")
    odd = [math.nan, math.inf, -math.inf, None, 2.5]
    assert json_floats(pl.Series(odd, dtype=pl.Float64)).to_list() == ["null", "null", "null", "null", "2.5"]
    assert json_floats(pl.Series([3, None, -7], dtype=pl.Int64)).to_list() == ["3.0", "null", "-7.0"]  # float(v)
