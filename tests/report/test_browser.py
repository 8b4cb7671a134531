"""The HTML reports in a real headless browser: they load cleanly, every plot is drawn, hostile trace text runs nothing.

Chromium is started by the tests and driven over the DevTools protocol
(`websocket-client`); screenshots are decoded by a small zlib-based PNG reader
below, so no imaging library is needed. Skipped when no chromium binary is found
(set TRACEFLOPS_CHROMIUM to point at one).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest

from tests.builders import Builder
from traceflops.report.html import render_html, render_job_html
from traceflops.run.load import analyze
from traceflops.views.job import job_view, summarize

websocket = pytest.importorskip("websocket", reason="websocket-client is not installed (pip install -e '.[test]')")

WIDTH, HEIGHT = 1280, 900  # fixed viewport; screenshots are the full page at this width
BG = (255, 255, 255)  # the report's background
HOSTILE_SCRIPT = "<script>document.title='pwned'</script>"
HOSTILE_IMG = "\"><img src=x onerror=\"document.title='pwned'\">"
# Each top-level <svg> and each drawn mark (bars, points, roofs) that can be selected.
PLOTS_JS = r"""
(() => {
  const out = [];
  const box = (el, kind, i) => {
    const r = el.getBoundingClientRect();
    out.push({kind, i, cls: el.getAttribute('class') || '', x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height});
  };
  document.querySelectorAll('svg').forEach((s, i) => { if (!s.parentElement.closest('svg')) box(s, 'svg', i); });
  document.querySelectorAll('svg rect, svg circle, svg polyline').forEach((m, i) => box(m, m.tagName.toLowerCase(), i));
  return JSON.stringify({marks: out, width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
                         title: document.title, imgs: document.getElementsByTagName('img').length,
                         scripts: document.getElementsByTagName('script').length});
})()
"""


def chromium_binary() -> str | None:
    env = os.environ.get("TRACEFLOPS_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


# --- a tiny PNG reader (8-bit, non-interlaced, gray/RGB/RGBA: what Chromium writes) ----------


def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw pixel bytes, row-major) of an 8-bit non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and interlace == 0 and ctype in (0, 2, 4, 6), f"unsupported PNG: depth {depth} type {ctype} interlace {interlace}"
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride = w * ch
    out = bytearray(h * stride)
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(ch, stride):
                line[i] = (line[i] + line[i - ch]) & 0xFF
        elif f == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - ch] if i >= ch else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif f == 4:
            for i in range(stride):
                a = line[i - ch] if i >= ch else 0
                b, c = prev[i], (prev[i - ch] if i >= ch else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return w, h, ch, bytes(out)


def inked(img, x: float, y: float, w: float, h: float) -> int:
    """How many pixels inside the box differ from the background."""
    iw, ih, ch, px = img
    x0, y0 = max(int(x), 0), max(int(y), 0)
    x1, y1 = min(int(x + w + 0.999), iw), min(int(y + h + 0.999), ih)
    n = 0
    for yy in range(y0, y1):
        row = px[(yy * iw + x0) * ch:(yy * iw + x1) * ch]
        for i in range(0, len(row), ch):
            rgb = (row[i],) * 3 if ch < 3 else tuple(row[i:i + 3])
            if rgb != BG:
                n += 1
    return n


# --- a minimal DevTools-protocol client -----------------------------------------------------


class Browser:
    """Headless chromium on a temporary profile, one page target, over one websocket."""

    def __init__(self, binary: str, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="traceflops-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage", "--hide-scrollbars",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.ws = None
        try:
            browser_url = self._devtools_url()
            self.ws = websocket.create_connection(browser_url, timeout=timeout, suppress_origin=True)
            self.ids = itertools.count(1)
            self.events: list[dict] = []
            targets = self.call("Target.getTargets")["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            tid = page["targetId"] if page else self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=tid, flatten=True)["sessionId"]
        except BaseException:
            self.close()
            raise

    def _devtools_url(self) -> str:
        """The `DevTools listening on ws://…` line of chromium's stderr (read on a thread, so a silent browser times out)."""
        found: list[str] = []
        lines: list[str] = []
        done = threading.Event()

        def reader():
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace")
                lines.append(line)
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                if m:
                    found.append(m.group(1))
                    done.set()
            done.set()

        threading.Thread(target=reader, daemon=True).start()  # keeps draining stderr so chromium never blocks on it
        done.wait(self.timeout)
        if not found:
            raise RuntimeError("chromium printed no DevTools URL:\n" + "".join(lines[-30:]))
        return found[0]

    def call(self, method: str, session: bool = False, **params):
        i = next(self.ids)
        msg = {"id": i, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            r = json.loads(self.ws.recv())
            if r.get("id") == i:
                if "error" in r:
                    raise RuntimeError(f"{method}: {r['error']}")
                return r.get("result", {})
            if "method" in r:
                self.events.append(r)
        raise TimeoutError(method)

    def page(self, method: str, **params):
        return self.call(method, session=True, **params)

    def wait_event(self, method: str) -> dict:
        for ev in self.events:
            if ev["method"] == method:
                return ev
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            r = json.loads(self.ws.recv())
            if "method" in r:
                self.events.append(r)
                if r["method"] == method:
                    return r
        raise TimeoutError(method)

    def open(self, path: Path) -> None:
        """Navigate to a file and wait until it has loaded (and rendered: two animation frames)."""
        for domain in ("Runtime", "Log", "Page"):
            self.page(f"{domain}.enable")
        self.page("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        self.events.clear()
        self.page("Page.navigate", url=path.resolve().as_uri())
        self.wait_event("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))", await_promise=True)

    def eval(self, expr: str, await_promise: bool = False):
        r = self.page("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=await_promise)
        if "exceptionDetails" in r:
            raise RuntimeError(f"evaluation failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP violations included) seen so far."""
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')} {p['exceptionDetails'].get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']} ({p['entry'].get('source')}): {p['entry'].get('text')}")
        return out

    def screenshot(self, width: int, height: int):
        """The page, top-left `width` × `height` CSS pixels at scale 1 (the viewport is fixed)."""
        self.page("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        shot = self.page("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        return decode_png(base64.b64decode(shot["data"]))

    def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(OSError, websocket.WebSocketException):
                self.ws.close()
        try:
            os.killpg(self.proc.pid, 9)  # chromium and its helpers (own session, started above)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)




def check_plots(browser: Browser, path: Path, min_svgs: int) -> dict:
    """Load `path`; no console errors; every top-level svg and every mark has a box and ink in the screenshot."""
    browser.open(path)
    info = json.loads(browser.eval(PLOTS_JS))
    assert browser.errors() == []
    marks = info["marks"]
    svgs = [m for m in marks if m["kind"] == "svg"]
    assert len(svgs) >= min_svgs, f"expected at least {min_svgs} plots, found {len(svgs)}"
    bad = [m for m in marks if not (m["w"] > 0 and m["h"] > 0)]
    assert not bad, f"{len(bad)} plot elements with an empty box, e.g. {bad[:3]}"
    bottom = max(m["y"] + m["h"] for m in marks)
    img = browser.screenshot(WIDTH, min(int(bottom) + 2, 16000))
    assert img[0] == WIDTH
    blank = [m for m in marks if m["y"] < img[1] and inked(img, m["x"], m["y"], m["w"], m["h"]) == 0]
    assert not blank, f"{len(blank)} plot elements drew nothing, e.g. {blank[:3]}"
    for s in svgs:  # a whole plot: more than a hairline of ink
        assert inked(img, s["x"], s["y"], s["w"], s["h"]) > 50, s
    return info


def test_single_report_renders_in_a_browser(shared, browser, tmp_path):
    a = analyze(str(shared / "kineto" / "mi300_resnet_act_checkpoint_rank0.json.gz"))
    p = tmp_path / "report.html"
    p.write_text(render_html(a), encoding="utf-8")
    info = check_plots(browser, p, min_svgs=3)
    classes = {m["cls"] for m in info["marks"] if m["kind"] == "svg"}
    assert {"waterfall", "steps", "roofline"} <= classes, classes
    assert any(m["kind"] == "circle" for m in info["marks"]), "no roofline points"
    assert info["scripts"] == 0


def test_job_report_renders_in_a_browser(shared, browser, tmp_path):
    ranks = sorted((shared / "kineto" / "dlrm_8rank").glob("rank*.json.gz"))
    assert len(ranks) == 8
    job = job_view([summarize(analyze(str(r))) for r in ranks])
    p = tmp_path / "job.html"
    p.write_text(render_job_html(job), encoding="utf-8")
    info = check_plots(browser, p, min_svgs=1)
    assert any(m["cls"] == "ranks" for m in info["marks"] if m["kind"] == "svg")
    assert sum(m["kind"] == "rect" for m in info["marks"]) >= 8  # at least one bar per rank


def hostile_trace(path: Path) -> str:
    """A GEMM trace whose module, op and kernel names are markup."""
    b = Builder()
    for i in range(2):
        t = 1000.0 * i
        b.annotation(f"ProfilerStep#{i}", t, 900)
        b.annotation(HOSTILE_SCRIPT, t + 5, 300)
        b.op(HOSTILE_IMG, t + 8, 80)
        b.op("aten::mm", t + 10, 30, **{"Input Dims": [[256, 128], [128, 64]], "Input type": ["c10::BFloat16"] * 2})
        b.kernel(HOSTILE_SCRIPT, t + 12, t + 100, 40)
        b.op(HOSTILE_SCRIPT, t + 50, 20)
        b.kernel(HOSTILE_IMG, t + 52, t + 150, 10)
    return b.write(path)


def test_hostile_names_run_nothing(browser, tmp_path):
    a = analyze(hostile_trace(tmp_path / "hostile.json.gz"))
    html = render_html(a, title="hostile names")
    names = set(a.kernels["name"].to_list())
    assert HOSTILE_SCRIPT in names and HOSTILE_IMG in names  # the names did reach the report's input
    p = tmp_path / "hostile.html"
    p.write_text(html, encoding="utf-8")
    browser.open(p)
    info = json.loads(browser.eval(PLOTS_JS))
    assert info["title"] == "hostile names"
    assert info["imgs"] == 0 and info["scripts"] == 0
    assert browser.errors() == []
    text = browser.eval("document.body.innerText")
    assert "document.title='pwned'" in text  # shown as text, not run
    time.sleep(0.2)  # an onerror would fire asynchronously
    assert browser.eval("document.title") == "hostile names"
