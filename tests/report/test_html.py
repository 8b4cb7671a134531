"""The HTML report: self-contained, every trace string escaped, and the waterfall is the loss budget."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tests.builders import (
    BF16,
    CPU,
    RANKS,
    Builder,
    rank_traces,
    scenario_trace,
    write_doc,
)
from traceflops.core.results import ModelOptions
from traceflops.report.html import render_html, render_job_html
from traceflops.run.load import analyze
from traceflops.views.job import job_view, summarize

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(1)>'
SECRET = "hf_dontLeakMe123456"


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> Tags:
    p = Tags()
    p.feed(html)
    p.close()
    return p


def hostile_trace(tmp_path) -> str:
    """A GPU trace whose op, kernel, annotation and module names are HTML injections, with a token in its metadata."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.annotation(XSS_IMG, 50, 500)  # a module name (record_function)
    b.op(XSS_SCRIPT, 100, 50, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16]})
    b.op("aten::mm", 105, 40, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16]})
    b.kernel(XSS_SCRIPT, 110, 200, 30)
    b.op("aten::add", 160, 20, **{"Input Dims": [[64, 16], [64, 16], []], "Input type": [BF16, BF16, "Scalar"]})
    b.kernel(XSS_IMG, 165, 240, 10)
    b.kernel("sm90_gemm_ok", 170, 260, 20)
    b.op("aten::mm", 300, 40, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16]})
    b.kernel(XSS_IMG + "gemm", 305, 400, 25)
    doc = b.doc()
    doc["metadata"] = {"env": {"HF_TOKEN": SECRET}, "note": XSS_SCRIPT}
    return write_doc(doc, tmp_path / "hostile.json.gz")


def assert_safe(html: str):
    p = parse(html)
    names = {t for t, _ in p.tags}
    assert "script" not in names and "img" not in names
    assert not names & {"iframe", "object", "embed", "link", "base", "form", "frame", "audio", "video", "source"}
    for tag, attrs in p.tags:
        for k, v in attrs.items():
            assert not k.startswith("on"), (tag, k)
            assert k not in ("src", "href", "xlink:href", "srcset", "action"), (tag, k, v)
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert "url(" not in html and "@import" not in html  # no CSS loads (peak sources may cite a URL as text, never as a load)
    assert SECRET not in html
    # the one meta that matters: a CSP that forbids scripts and remote loads
    csp = [a for t, a in p.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]
    return p


def test_hostile_names_are_escaped_and_nothing_loads(tmp_path):
    a = analyze(hostile_trace(tmp_path))
    names = set(a.kernels["name"]) | set(a.ops["name"])
    assert XSS_SCRIPT in names and XSS_IMG in names  # the trace really carries them
    html = render_html(a)
    p = assert_safe(html)
    text = "".join(p.text)
    # shown as text, not markup
    assert XSS_SCRIPT in text and XSS_IMG in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_waterfall_is_the_loss_budget_and_sums_to_one():
    a = analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), ModelOptions(peak_tflops=1))
    lb = a.totals["loss_budget"]
    assert all(v is not None for v in lb.values())
    p = assert_safe(render_html(a))
    bars = {at["data-term"]: float(at["data-value"]) for t, at in p.tags if t == "rect" and "wf" in at.get("class", "").split()}
    assert bars == lb  # exact: repr round-trips floats
    total = next(float(at["data-value"]) for t, at in p.tags if t == "rect" and at.get("class") == "wf-total")
    assert total == pytest.approx(1.0, abs=1e-9)
    assert list(bars) == list(lb)  # in the budget's order


def test_unknown_terms_are_marked_not_drawn():
    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"))  # a CPU trace without a peak: FLOP terms unknown
    lb = a.totals["loss_budget"]
    unknown = {k for k, v in lb.items() if v is None}
    assert unknown
    p = parse(render_html(a))
    drawn = {at["data-term"] for t, at in p.tags if t == "rect" and at.get("class") == "wf"}
    marked = {at["data-term"] for t, at in p.tags if t == "text" and at.get("class") == "wf-unknown"}
    assert drawn == set(lb) - unknown and marked == unknown


def test_gpu_report_has_every_section(tmp_path):
    a = analyze(scenario_trace(tmp_path, "modules"))
    html = render_html(a)
    p = assert_safe(html)
    svgs = {at.get("class") for t, at in p.tags if t == "svg"}
    assert {"waterfall", "steps", "roofline", "modules"} <= svgs
    # per-step bars: one rect per non-zero partition class, valued as in the steps frame
    s = a.steps.row(0, named=True)
    parts = {at["data-part"]: float(at["data-value"]) for t, at in p.tags if t == "rect" and "data-part" in at}
    assert parts["matmul"] == s["time_matmul"]
    # the module roll-up shows the checkpointed modules' recompute share
    text = "".join(p.text)
    assert "recompute 30.0%" in text and "recompute 40.0%" in text  # attn 30/100, mlp 50/125
    bars = {at["data-term"]: float(at["data-value"]) for t, at in p.tags if t == "rect" and at.get("class") == "wf"}
    assert bars == {k: v for k, v in a.totals["loss_budget"].items() if v is not None}


def test_job_report_has_a_bar_per_rank(tmp_path):
    job = job_view([summarize(analyze(p)) for p in rank_traces(tmp_path)])
    html = render_job_html(job)
    p = assert_safe(html)
    text = "".join(p.text)
    for r in range(RANKS.WORLD):
        assert f"rank {r}" in text
    ranks_svg = [at for t, at in p.tags if t == "svg" and at.get("class") == "ranks"]
    assert ranks_svg
    assert "Stragglers" in text and "compute" in text


@pytest.mark.parametrize("name", ["h100_qwen_inference.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz", "v100_resnet50_legacy2021.json.gz"])
def test_real_traces_render_safely(shared, name):
    a = analyze(str(shared / "kineto" / name))
    html = render_html(a)
    p = assert_safe(html)
    assert "HF_TOKEN" not in html
    bars = {at["data-term"]: float(at["data-value"]) for t, at in p.tags if t == "rect" and at.get("class") == "wf"}
    assert bars == {k: v for k, v in a.totals["loss_budget"].items() if v is not None}
