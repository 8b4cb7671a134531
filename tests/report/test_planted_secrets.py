"""Secrets in what a trace records (event names, labels, kernel names, categories, recorded inputs, args) reach no output.

One trace carries a secret in every kind of field a report or an annotation can
copy; each output format is checked for every planted value. Every planted
value contains PLANTED, so one substring search finds a leak of any part of one.
Also here: the raw-input rules every output shares (control characters in an
HTML title and in CSV cells, `annotate -o -`, `--html` into a new folder).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from tests.builders import BF16, Builder, write_doc
from tests.report.test_redaction import MARK, TOKENS, leaks, output_text, run
from traceflops.core.redact import redact_string

# what each kind of field holds; the parts of a label that are not secret stay
PLANTED = {
    "op name": "custom::fetch Bearer PLANTEDopbearer0",
    "record_function label": "load https://u:PLANTEDurlpw@host/x",
    "module label": "nn.Module: Loader_password=PLANTEDmodule",
    "kernel name": "sm90_gemm_bf16 AWS_SECRET_ACCESS_KEY=PLANTEDkernel",
    "token-shaped kernel name": f"triton_poi {TOKENS['hugging_face']}",
    "unknown category": "custom token=PLANTEDcategory",
    "concrete input": "token=PLANTEDconcrete",
    "concrete token": TOKENS["github"],
}
ARGS = {  # args the parser does not read: only an annotated copy of the trace holds them
    "password": "PLANTEDargpassword",
    "secret": "PLANTEDargsecret",
    "note": "password=PLANTEDargpair Bearer PLANTEDargbearer0 AWS_SECRET_ACCESS_KEY=PLANTEDargaws",
    "nested": {"api_key": "PLANTEDargnested", "ok": [1, 2]},
    TOKENS["openai"]: "a key that is a token",
}


def planted_names_trace(path: Path, rank: int = 0, world: int = 1) -> str:
    """A GPU trace with a secret in every kind of recorded field (PLANTED), and in its metadata."""
    b = Builder()
    b.distributed = {"backend": "nccl", "rank": rank, "world_size": world, "init_method": "tcp://u:PLANTEDinit@10.0.0.1:29500"}
    b.events.append({"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "ts": 0,
                     "args": {"name": "python train.py --password PLANTEDmeta1", "secret": "PLANTEDmeta2"}})
    b.annotation("ProfilerStep#1", 50, 950)
    b.annotation(PLANTED["module label"], 60, 900)
    b.annotation(PLANTED["record_function label"], 70, 800)
    b.op("aten::mm", 100, 40, **{"Input Dims": [[64, 32], [32, 16], []], "Input type": [BF16, BF16, "Scalar"],
                                 "Concrete Inputs": ["", "", PLANTED["concrete input"]], **ARGS})
    b.kernel(PLANTED["kernel name"], 105, 160, 30)
    b.op("aten::mm", 300, 40, **{"Input Dims": [[64, 16], [16, 32], []], "Input type": [BF16, BF16, "Scalar"],
                                 "Concrete Inputs": ["", "", PLANTED["concrete token"]]})
    b.kernel(PLANTED["kernel name"], 305, 400, 30)
    b.op(PLANTED["op name"], 500, 100)
    b.kernel(PLANTED["token-shaped kernel name"], 505, 520, 40)
    b.events.append({"ph": "X", "cat": PLANTED["unknown category"], "name": "custom event", "pid": 100, "tid": 1, "ts": 600, "dur": 5})
    doc = b.doc()
    doc["secret"] = "PLANTEDtoplevel"
    return write_doc(doc, path)


@pytest.fixture
def planted(tmp_path):
    return planted_names_trace(tmp_path / "rank0.json.gz")


def _no_leak(text: str) -> list[str]:
    return leaks(text, [MARK])


def test_terminal_report_copies_no_secret(planted):
    code, said, err = run("analyze", planted, "--no-cache")
    assert code == 0, err
    assert _no_leak(said + err) == []
    assert "Loader_password=<redacted>" in said or "sm90_gemm_bf16 AWS_SECRET_ACCESS_KEY=<redacted>" in said


def test_json_report_copies_no_secret(planted):
    code, said, err = run("analyze", planted, "--format", "json", "--no-cache")
    assert code == 0, err
    assert _no_leak(said + err) == []
    report = json.loads(said)
    # what is not secret stays: the kernel's name before the pair, the analysis' FLOPs
    assert "sm90_gemm_bf16 AWS_SECRET_ACCESS_KEY=<redacted>" in said
    assert report["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16


def test_html_report_copies_no_secret(planted, tmp_path):
    html = tmp_path / "report.html"
    code, _, err = run("analyze", planted, "--html", html, "--no-cache")
    assert code == 0, err
    assert _no_leak(output_text(html)) == []


def test_tables_copy_no_secret(planted, tmp_path):
    out = tmp_path / "tables"
    code, _, err = run("analyze", planted, "--tables", out, "--no-cache")
    assert code == 0, err
    files = sorted(out.iterdir())
    assert {p.suffix for p in files} == {".csv", ".parquet"}
    text = {p.name: p.read_text() if p.suffix == ".csv" else pl.read_parquet(p).write_ndjson() for p in files}
    assert {k: _no_leak(v) for k, v in text.items()} == {k: [] for k in text}
    ops = pl.read_parquet(out / "ops.parquet")
    assert "load https://u:<redacted>@host/x" in ops["name"].to_list()
    assert json.loads(ops.filter(pl.col("concrete").is_not_null())["concrete"][0])[2] == "token=<redacted>"


def test_summary_merge_and_job_copy_no_secret(tmp_path):
    ranks = [planted_names_trace(tmp_path / f"rank{r}.json.gz", rank=r, world=2) for r in range(2)]
    sums = []
    for r, src in enumerate(ranks):
        out = tmp_path / f"rank{r}.tfsum"
        code, said, err = run("summarize", src, "-o", out, "--no-cache")
        assert code == 0, err
        assert _no_leak(output_text(out)) == [] and _no_leak(said + err) == []
        sums.append(out)
    for fmt in ("terminal", "json"):
        code, said, err = run("merge", *sums, "--format", fmt)
        assert code == 0, err
        assert _no_leak(said + err) == [], fmt
    code, said, err = run("analyze", *ranks, "--format", "json", "--html", tmp_path / "job.html", "--tables", tmp_path / "jt", "--no-cache")
    assert code == 0, err
    written = [tmp_path / "job.html", *sorted((tmp_path / "jt").iterdir())]
    assert _no_leak(said + err) == [] and {str(p): _no_leak(output_text(p)) for p in written} == {str(p): [] for p in written}


@pytest.mark.parametrize("fmt", ["terminal", "json", "html"])
def test_diff_copies_no_secret(planted, tmp_path, fmt):
    other = tmp_path / "other.json.gz"
    other.write_bytes(Path(planted).read_bytes())
    code, said, err = run("diff", planted, other, "--format", fmt, "--no-cache")
    assert code == 0, err
    assert _no_leak(said + err) == []


def test_annotate_copies_no_secret(planted, tmp_path):
    assert gzip.decompress(Path(planted).read_bytes()).decode().count(MARK) >= len(PLANTED) + 10  # every kind is there
    out = tmp_path / "annotated.json"
    code, said, err = run("annotate", planted, "-o", out, "--no-cache")
    assert code == 0, err
    text = out.read_text()
    assert _no_leak(text) == [] and _no_leak(said + err) == []
    events = json.loads(text)["traceEvents"]
    mm = next(e for e in events if e.get("name") == "aten::mm" and "password" in e.get("args", {}))
    assert mm["args"]["password"] == "<redacted by traceflops>" and mm["args"]["nested"]["ok"] == [1, 2]
    assert mm["args"]["Input Dims"] == [[64, 32], [32, 16], []]  # what is no secret is kept as it was
    assert "traceflops.flops" in mm["args"]  # and the annotation still matched the analysis' (redacted) names
    code, again, err = run("analyze", out, "--format", "json", "--no-cache")
    assert code == 0, err
    assert json.loads(again)["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16


def test_annotate_to_standard_output(planted, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, said, err = run("annotate", planted, "-o", "-", "--no-cache")
    assert code == 0, err
    assert not (tmp_path / "-").exists()
    doc = json.loads(said)
    assert doc["traceflops"]["events_added"] > 0 and _no_leak(said) == []


# --- the rules over columns and events ------------------------------------------------


@pytest.mark.parametrize("text", [*PLANTED.values(), *TOKENS.values(), ARGS["note"], "redis://:PLANTEDpw@cache:6379/0",
                                  "x --password PLANTED", "Authorization: Basic PLANTEDbasic0", "ok", "aten::mm"])
def test_may_change_finds_every_string_a_rule_changes(text):
    """The column prefilter is sound: a string it passes over is one no rule changes."""
    import re

    from traceflops.core.redact import MAY_CHANGE

    if redact_string(text)[1]:
        assert re.search(MAY_CHANGE, text)


def test_redact_column_runs_once_per_distinct_value():
    from traceflops.core.redact import redact_column

    s = pl.Series(["aten::mm", PLANTED["kernel name"], None] * 1000)
    got, n = redact_column(s)
    assert n == 1 and got.null_count() == 1000 and not got.str.contains(MARK).any()
    same = pl.Series(["aten::mm", "sm90_gemm"] * 10)
    assert redact_column(same)[0] is same  # nothing to change: the column itself


@pytest.mark.parametrize("name", ["kineto/h100_qwen_inference.json.gz", "kineto/mi300_xdit_flux_aiter_sage.json.gz",
                                  "kineto/dlrm_8rank/rank2.json.gz", "xplane/v100_tf_multiworker.xplane.pb",
                                  "xplane/tpu_v6e_inference.xplane.pb"])
def test_real_traces_are_not_redacted(shared, name):
    """Real kernel names, labels, recorded inputs and XLA op text hold no secret: the parsed trace is unchanged."""
    from traceflops.core.redact import redact_trace
    from traceflops.parsers.kineto import parse_kineto
    from traceflops.parsers.xla import parse_xplane

    path = shared / name
    if not path.exists():
        pytest.skip(f"{name} not among the shared fixtures")
    trace = parse_kineto(str(path)) if name.startswith("kineto") else parse_xplane(str(path))
    assert redact_trace(trace) is trace


def test_redactor_applies_key_and_value_rules_to_events():
    from traceflops.core.redact import Redactor

    r = Redactor()
    e = {"ph": "X", "cat": PLANTED["unknown category"], "name": PLANTED["op name"], "args": dict(ARGS)}
    r.event(e)
    assert MARK not in json.dumps(e) and r.count >= 8
    assert e["args"]["nested"]["ok"] == [1, 2] and e["name"].startswith("custom::fetch Bearer ")


# --- raw input that is not a secret -----------------------------------------------------

CONTROL = "x\x1b]0;owned\x07\u202e\x85\x9by"


def test_html_title_and_heading_show_control_characters(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 50, 950)
    b.op("aten::mm", 100, 40, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16]})
    b.kernel("sm90_gemm", 105, 160, 30)
    src = b.write(tmp_path / f"t{CONTROL}.json.gz")
    html = tmp_path / "report.html"
    code, _, err = run("analyze", src, "--html", html, "--no-cache")
    assert code == 0, err
    page = html.read_text()
    head = page[page.index("<title>"): page.index("</h1>")]
    assert not any(c in head for c in "\x1b\x07\u202e\x85\x9b")
    assert "\\x1b" in head and "\\u202e" in head


def test_csv_cells_show_control_characters(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 50, 950)
    b.op("aten::mm", 100, 40, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16]})
    b.kernel(f"gemm{CONTROL}", 105, 160, 30)
    src = b.write(tmp_path / "t.json.gz")
    out = tmp_path / "tables"
    code, _, err = run("analyze", src, "--tables", out, "--no-cache")
    assert code == 0, err
    for p in out.glob("*.csv"):
        text = p.read_text()
        assert not any(c in text for c in "\x1b\x07\u202e\x85\x9b"), p.name
    kernels = (out / "kernels.csv").read_text()
    assert "gemm" + "x\\x1b]0;owned\\x07\\u202e\\x85\\x9by" in kernels
    assert CONTROL in pl.read_parquet(out / "kernels.parquet")["name"].to_list()[0]  # parquet keeps the value


def test_html_into_a_new_folder_is_written(planted, tmp_path):
    html = tmp_path / "new" / "folder" / "report.html"
    code, _, err = run("analyze", planted, "--html", html, "--no-cache")
    assert code == 0, err
    assert html.read_text().startswith("<!DOCTYPE html>") or "<html" in html.read_text()
