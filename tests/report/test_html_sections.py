"""The HTML report's sections read back against the JSON reports of the command line.

What to try, GEMM shapes and waves, step variance, every loss-budget term
explained in visible text, the critical path; the job page (per-rank budgets,
stragglers, collectives); the diff page. Numbers are read from the page's
`data-value` attributes and compared with `traceflops analyze|diff --format json`
(the same analysis, read by another renderer). Then each page in headless
Chromium: no console error, every section there, screenshots in /tmp/html_shots.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.builders import BF16, CPU, Builder
from tests.report.test_html import XSS_IMG, XSS_SCRIPT, assert_safe
from traceflops.cli.main import main
from traceflops.core.results import ModelOptions
from traceflops.core.sections import encode
from traceflops.report import html as H
from traceflops.run.load import analyze
from traceflops.views.diff import diff
from traceflops.views.job import job_view, summarize
from traceflops.views.path_summary import path_summary

SHOTS = Path("/tmp/html_shots")
GEMMS = "a100_torchrec_rank3.json.gz"  # GEMM shapes with wave-quantization hints, 4 advice items
DIFF = ("a100_ddp_resnet_rank0.json.gz", "mi300_resnet_act_checkpoint_rank0.json.gz")


def cli_json(*args) -> dict:
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


class Page(HTMLParser):
    """Tables by class (rows of cells with text and data-*), advice blocks, step bars, and the text a reader sees."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[dict]]] = {}
        self.advice: list[dict] = []
        self.bars: dict[tuple[str, str], dict[str, float]] = {}  # (svg class, bar label) → {part: value}
        self.visible: list[str] = []
        self.ids: set[str] = set()
        self._table: list[str | None] = []
        self._cell: dict | None = None
        self._hidden = 0  # inside <title> or <style>
        self._svg: str | None = None
        self._bar: str | None = None
        self._list: str | None = None
        self._h3: list[str] | None = None
        self._divs: list[bool] = []  # open divs: is it an advice block?

    def handle_starttag(self, tag, attrs):
        at = dict(attrs)
        if at.get("id"):
            self.ids.add(at["id"])
        cls = (at.get("class") or "").split()
        if tag in ("title", "style"):
            self._hidden += 1
        elif tag == "svg":
            self._svg = at.get("class")
        elif tag == "g" and "bar" in cls:
            self._bar = at["data-label"]
            self.bars[(self._svg, self._bar)] = {}
        elif tag == "rect" and self._bar is not None and "data-part" in at:
            self.bars[(self._svg, self._bar)][at["data-part"]] = float(at["data-value"])
        elif tag == "table":
            self._table.append(at.get("class"))
            self.tables.setdefault(at.get("class"), [])
        elif tag == "tr" and self._table:
            self.tables[self._table[-1]].append([])
        elif tag == "td" and self._table:
            self._cell = {"text": "", "key": at.get("data-key"), "value": at.get("data-value"), "class": at.get("class"),
                          "title": at.get("title")}
            self.tables[self._table[-1]][-1].append(self._cell)
        elif tag == "div":
            self._divs.append("advice" in cls)
            if "advice" in cls:
                self.advice.append({"kind": at.get("data-kind"), "title": "", "nums": {}, "evidence": [], "remedies": [], "record": []})
        elif tag == "h3" and any(self._divs):
            self._h3 = []
        elif tag in ("ul", "ol") and any(self._divs) and at.get("class") in ("evidence", "remedies", "record"):
            self._list = at["class"]
        elif tag == "li" and self._list:
            self.advice[-1][self._list].append("")
        elif tag == "span" and "num" in cls and any(self._divs):
            self.advice[-1]["nums"][at.get("data-key")] = at.get("data-value")

    def handle_endtag(self, tag):
        if tag in ("title", "style"):
            self._hidden -= 1
        elif tag == "g":
            self._bar = None
        elif tag == "div" and self._divs:
            self._divs.pop()
        elif tag == "svg":
            self._svg = None
        elif tag == "table" and self._table:
            self._table.pop()
        elif tag == "td":
            self._cell = None
        elif tag in ("ul", "ol"):
            self._list = None
        elif tag == "h3" and self._h3 is not None:
            self.advice[-1]["title"] = "".join(self._h3)
            self._h3 = None

    def handle_data(self, data):
        if self._hidden:
            return
        self.visible.append(data)
        if self._cell is not None:
            self._cell["text"] += data
        if self._h3 is not None:
            self._h3.append(data)
        if self._list and self.advice and self.advice[-1][self._list]:
            self.advice[-1][self._list][-1] += data

    def rows(self, cls: str) -> list[list[dict]]:
        return [r for r in self.tables.get(cls, []) if r]  # header rows hold no <td>

    @property
    def text(self) -> str:
        return "".join(self.visible)


def read(html: str) -> Page:
    p = Page()
    p.feed(html)
    p.close()
    return p


def value(cell: dict):
    return None if cell["value"] is None else float(cell["value"])


def by_key(row: list[dict]) -> dict[str, float | None]:
    return {c["key"]: value(c) for c in row if c["key"]}


# --- single trace -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemm_report():
    from tests.builders import shared_fixtures

    path = shared_fixtures() / "kineto" / GEMMS
    if not path.is_file():
        pytest.skip(f"shared fixture {path} not found")
    return analyze(str(path)), cli_json("analyze", path, "--format", "json")


def test_advice_items_match_the_json_report(gemm_report):
    a, js = gemm_report
    page = read(H.render_html(a))
    assert js["advice"] and len(page.advice) == len(js["advice"])
    for shown, item in zip(page.advice, js["advice"]):  # same order: largest recoverable share first
        assert shown["kind"] == item["kind"]
        assert item["title"] in shown["title"]
        assert float(shown["nums"]["share"]) == item["share"]
        assert float(shown["nums"]["recoverable_us"]) == item["recoverable_us"]
        assert shown["evidence"] == item["evidence"]
        assert shown["remedies"] == item["remedies"]
        assert shown["record"] == item["record"]


def test_gemm_shapes_and_waves_match_the_json_report(gemm_report):
    a, js = gemm_report
    rows = read(H.render_html(a)).rows("gemm-shapes")
    want = js["gemm_shapes"][: H.MAX_ROWS]
    assert any(g["wave_hint"] for g in want)  # the fixture does lose time to wave quantization
    assert len(rows) == len(want)
    for row, g in zip(rows, want):
        got = by_key(row)
        for k in ("M", "N", "K", "batch", "count", "time_us", "share", "tflops", "tiles", "waves", "wave_efficiency", "last_wave_fill"):
            assert got[k] == g[k], (k, got[k], g[k])
        assert row[-1]["text"] == (g["hint"] or "")
        assert row[-1]["class"] == "explain"


@pytest.mark.parametrize("name", ["rtx2080ti_linear_train.json.gz", "mi250_toy_train.json.gz"])
def test_step_statistics_match_the_json_report(shared, name):
    path = shared / "kineto" / name
    ss = cli_json("analyze", path, "--format", "json")["step_stats"]
    assert ss["outliers"] or ss["warmup"]  # each fixture has one or the other
    page = read(H.render_html(analyze(str(path))))
    spread = by_key(page.rows("step-spread")[0])
    for k in ("count", "mean_us", "median_us", "std_us", "cv", "mad_us"):
        assert spread[k] == ss[k], k
    outl = [by_key(r) for r in page.rows("step-outliers")]
    assert [(o["step"], o["window_us"], o["deviation_frac"], o["term_delta_us"]) for o in outl] == [
        (o["step"], o["window_us"], o["deviation_frac"], o["term_delta_us"]) for o in ss["outliers"]]
    warm = [by_key(r) for r in page.rows("step-warmup")]
    assert [(w["step"], w["window_us"], w["ratio"]) for w in warm] == [(w["step"], w["window_us"], w["ratio"]) for w in ss["warmup"]]


def test_every_budget_term_is_explained_in_visible_text():
    path = CPU / "ns_ckpt_nonreentrant.json.gz"
    lb = cli_json("analyze", path, "--peak-tflops", "1", "--format", "json")["totals"]["loss_budget"]
    page = read(H.render_html(analyze(str(path), ModelOptions(peak_tflops=1))))
    rows = page.rows("budget-terms")
    assert [r[0]["text"] for r in rows] == [k.replace("_", " ") for k in lb]
    explanations = []
    for row, (k, v) in zip(rows, lb.items()):
        assert by_key(row)[k] == v
        assert row[-1]["class"] == "explain" and len(row[-1]["text"].split()) >= 4, (k, row[-1]["text"])
        explanations.append(row[-1]["text"])
    assert len(set(explanations)) == len(lb)  # one line per term, none shared
    for x in explanations:
        assert x in page.text  # visible, not only inside a <title> tooltip


def test_critical_path_bars_are_each_steps_window(gemm_report):
    a, js = gemm_report
    ps = js["critical_path"]  # the JSON report's (views.path_summary.path_summary of the same analysis)
    assert ps["available"] and ps == json.loads(json.dumps(encode(path_summary(a))))
    page = read(H.render_html(a))  # the analysis' own summary, as the JSON report has it
    windows = {s["step"]: s["dur_us"] for s in js["steps"]}
    bars = {label: parts for (svg, label), parts in page.bars.items() if svg == "critical-path"}
    assert set(bars) == {f"step {s['step']}" for s in ps["steps"]}
    for s in ps["steps"]:
        parts = bars[f"step {s['step']}"]
        assert parts == {k: v for k, v in s["us"].items() if v > 0}
        assert sum(parts.values()) == pytest.approx(windows[s["step"]], rel=1e-6)  # the path's length is the step's window
    kinds = {r[0]["text"]: by_key(r) for r in page.rows("cp-kinds")}
    for k, us in ps["us"].items():
        assert (kinds[k.replace("_", " ")][k], kinds[k.replace("_", " ")][f"{k}:share"]) == (us, ps["share"][k])
    meanings = [r[-1]["text"] for r in page.rows("cp-kinds")]
    assert meanings == [ps["meaning"][k] for k in ps["us"]]
    top = [(r[0]["text"], r[1]["title"] or r[1]["text"], value(r[2]), value(r[3])) for r in page.rows("cp-top")]
    assert top == [(t["kind"].replace("_", " "), t["name"], t["us"], t["segments"]) for t in ps["top"]]  # a long name in full as its tooltip


def test_no_critical_path_says_why():
    a = analyze(str(CPU / "ns_eager_sdpa.json.gz"))
    ps = path_summary(a)
    assert not ps["available"]
    page = read(H.render_html(a, critical_path=ps))
    assert ps["why"] in page.text
    assert "critical-path" in page.ids and not page.rows("cp-kinds")


# --- job -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm_job():
    from tests.builders import shared_fixtures

    ranks = sorted((shared_fixtures() / "kineto" / "dlrm_8rank").glob("rank*.json.gz"))
    if len(ranks) != 8:
        pytest.skip("shared fixture dlrm_8rank not found")
    job = job_view([summarize(analyze(str(r))) for r in ranks])
    return ranks, job, cli_json("analyze", *ranks, "--format", "json"), H.render_job_html(job)


def test_job_per_rank_budgets_side_by_side(dlrm_job):
    ranks, _, js, html = dlrm_job
    page = read(html)
    rows = page.rows("rank-budget-terms")
    got = {}
    for row in rows:
        got.update(by_key(row))
        assert row[-1]["class"] == "explain" and row[-1]["text"]
    for i, r in enumerate(js["ranks"]):  # each rank's own budget, as its single-trace JSON report has it
        lb = cli_json("analyze", ranks[i], "--format", "json")["totals"]["loss_budget"]
        assert {k: got[f"{r['rank']}:{k}"] for k in lb} == lb
        bar = page.bars[("rank-budgets", f"rank {r['rank']}")]
        assert bar == {k: v for k, v in lb.items() if v is not None and v > 0}


def test_job_stragglers_and_collectives_match_the_json_report(dlrm_job):
    _, _, js, html = dlrm_job
    page = read(html)
    assert js["stragglers"]
    st = page.rows("stragglers")
    assert len(st) == len(js["stragglers"])
    for row, s in zip(st, js["stragglers"]):
        got = by_key(row)
        for k in ("step", "rank", "wait_us", "excess_compute_us", "excess_idle_us", "excess_input_pipeline_us"):
            assert got[k] == s[k], k
        assert row[-2]["text"] == s["reason"] and len(row[-1]["text"].split()) >= 4  # the reason, explained
    co = [by_key(r) for r in page.rows("collectives")]
    want = sorted(js["collectives"], key=lambda c: -c["arrival_skew_us"])[: H.MAX_ROWS]
    assert len(co) == len(want)
    for got, c in zip(co, want):
        for k in ("seq", "step", "ranks", "arrival_skew_us", "last_rank", "transfer_us", "algbw_gbps", "busbw_gbps"):
            assert got.get(k) == c[k], k
    # The job's own "what to try" (waits on late ranks, the ranks' top items), the same items as the JSON's.
    assert all(H.e(x["title"]) in html for x in js["advice"])
    assert ("job-advice-none" in html) == (not js["advice"])


# --- diff ------------------------------------------------------------------------------


def test_diff_matches_the_diff_json(shared):
    before, after = (shared / "kineto" / n for n in DIFF)
    js = cli_json("diff", before, after, "--format", "json")
    for d in (diff(analyze(str(before)), analyze(str(after))), js):  # the view itself, and its JSON read back
        page = read(H.render_diff_html(d))
        rows = page.rows("diff-budget")
        assert [r[0]["text"] for r in rows] == [t["term"].replace("_", " ") for t in js["loss_budget"]]
        for row, t in zip(rows, js["loss_budget"]):
            got = by_key(row)
            assert (got[f"{t['term']}:before"], got[f"{t['term']}:after"], got[f"{t['term']}:delta"]) == (t["before"], t["after"], t["delta"])
            assert row[-1]["class"] == "explain" and len(row[-1]["text"].split()) >= 4
        for p, v in js["flops_per_step"].items():
            got = next(by_key(r) for r in page.rows("diff-steps") if r[0]["text"] == f"{p} FLOPs")
            assert got[f"flops_{p}:delta"] == v["delta"]
        kernels = [by_key(r)["kernel:delta"] for r in page.rows("diff-kernels")]
        assert kernels == [k["delta_per_step"] for k in js["kernels"]]
        if js["largest_change"] is None:  # the before trace has no shapes: its FLOPs, and so any change, are unknown
            assert js["flops_per_step"]["executed"]["before"] is None and "unknown" in js["largest_change_why"]
            assert f"Largest change: none: {js['largest_change_why']}" in page.text
        else:
            assert js["largest_change"]["phase"] in page.text


# --- hostile strings ----------------------------------------------------------------------


def hostile_gemms(path: Path, rank: int = 0) -> str:
    """Two steps of GEMMs whose kernel, op and module names are markup (so they reach advice, GEMMs, the path)."""
    b = Builder()
    dims = {"Input Dims": [[4096, 1024], [1024, 4096]], "Input type": [BF16, BF16]}
    for i in range(3):
        t = 2000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 1900)
        b.annotation(XSS_IMG, t + 5, 1500)
        for j in range(4):
            b.op("aten::mm", t + 10 + 300 * j, 30, **dims)
            b.kernel(XSS_SCRIPT + "gemm", t + 12 + 300 * j, t + 100 + 300 * j, 150)
            b.op(XSS_IMG, t + 50 + 300 * j, 20)
            b.kernel(XSS_IMG, t + 52 + 300 * j, t + 260 + 300 * j, 30)
    doc = b.doc()
    doc["distributedInfo"] = {"rank": rank, "world_size": 2}
    from tests.builders import write_doc

    return write_doc(doc, path)


def test_hostile_names_are_escaped_in_every_section(tmp_path):
    a = analyze(hostile_gemms(tmp_path / "hostile.json.gz"))
    ps = path_summary(a)
    html = H.render_html(a, critical_path=ps)
    page = read(html)
    assert_safe(html)
    shown = [c["text"] for r in page.rows("cp-top") for c in r]
    assert any(XSS_SCRIPT in t or XSS_IMG in t for t in shown)  # the names did reach the new sections
    assert any(XSS_SCRIPT in x or XSS_IMG in x for it in page.advice for x in it["evidence"])
    d = H.render_diff_html(diff(a, analyze(hostile_gemms(tmp_path / "hostile2.json.gz"))))
    assert_safe(d)
    assert any(XSS_SCRIPT in r[0]["text"] for r in read(d).rows("diff-kernels"))
    named = tmp_path / XSS_IMG
    named.mkdir()
    job = job_view([summarize(analyze(hostile_gemms(named / f"rank{r}.json.gz", r))) for r in range(2)])
    j = H.render_job_html(job)
    assert_safe(j)
    assert XSS_IMG in read(j).text


# --- in a browser ------------------------------------------------------------------------------


SECTIONS = {
    "single": ["budget", "critical-path", "advice", "steps", "step-stats", "gemm", "roofline", "kernels"],
    "job": ["budget", "stragglers", "collectives", "advice"],
    "diff": ["headline", "budget", "steps", "kernels"],
}
PLOTS = {"single": 5, "job": 2, "diff": 1}  # waterfall, critical path, steps, roofline, modules; ranks, budgets per rank; budget pairs
READ_BACK = r"""JSON.stringify([...document.querySelectorAll('[data-key][data-value]')].map(x => [x.closest('table, div.advice')?.className || '',
  x.getAttribute('data-key'), Number(x.getAttribute('data-value')), x.innerText]))"""


def shot(browser, name: str) -> Path:
    """The whole page at 1400 CSS px wide, to /tmp/html_shots/NAME.png (for a person to look at)."""
    import base64

    h = int(browser.eval("document.documentElement.scrollHeight"))
    browser.page("Emulation.setDeviceMetricsOverride", width=1400, height=min(h, 16000), deviceScaleFactor=1, mobile=False)
    data = browser.page("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": 1400, "height": min(h, 16000), "scale": 1})["data"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    out = SHOTS / f"{name}.png"
    out.write_bytes(base64.b64decode(data))
    return out


@pytest.mark.parametrize("name", list(SECTIONS))
def test_reports_load_in_a_browser_with_their_numbers(name, browser, request, shared, tmp_path):
    from tests.report.test_browser import check_plots

    if name == "single":
        a, js = request.getfixturevalue("gemm_report")
        html = H.render_html(a, critical_path=path_summary(a))
        want = {("advice", "share"): [it["share"] for it in js["advice"]],
                ("gemm-shapes", "time_us"): [g["time_us"] for g in js["gemm_shapes"][: H.MAX_ROWS]]}
    elif name == "job":
        _, _, js, html = request.getfixturevalue("dlrm_job")
        want = {("stragglers", "wait_us"): [s["wait_us"] for s in js["stragglers"]]}
    else:
        js = cli_json("diff", *(shared / "kineto" / n for n in DIFF), "--format", "json")
        html = H.render_diff_html(js)
        want = {("diff-budget", f"{t['term']}:delta"): [t["delta"]] for t in js["loss_budget"] if t["delta"] is not None}
    p = tmp_path / f"{name}.html"
    p.write_text(html, encoding="utf-8")
    info = check_plots(browser, p, min_svgs=PLOTS[name])  # loads; no console error; every plot drew ink
    assert info["scripts"] == 0 and info["imgs"] == 0
    for anchor in SECTIONS[name]:
        assert browser.eval(f"!!document.getElementById('{anchor}')"), anchor
    cells = json.loads(browser.eval(READ_BACK))
    for (where, key), values in want.items():
        got = [(v, text) for cls, k, v, text in cells if k == key and where in cls.split()]
        assert [v for v, _ in got] == values, (where, key)
        assert all(text.strip() for _, text in got)  # shown, not only stored
    assert shot(browser, name).stat().st_size > 10_000


def test_job_warnings_are_said_once_for_the_ranks_that_gave_them(shared, tmp_path):
    out = tmp_path / "job.html"
    r = CliRunner().invoke(main, ["analyze", str(shared / "kineto" / "dlrm_8rank"), "--html", str(out), "--no-cache", "--quiet"])
    assert r.exit_code == 0, r.stderr
    html = out.read_text()
    # All eight ranks give "the last step ends at its last device activity": one line for ranks 0-7, not eight.
    assert html.count("the last step ends at its last device activity") == 1 and "ranks 0-7: the last step ends" in html
