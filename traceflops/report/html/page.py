"""The page shell and its building blocks: head, CSS, Content-Security-Policy, footer, and the escaped
cards, tables, legends and headings every report is made of.

One place for what makes a page safe: the Jinja2 environment (`render`, `macros`) that fills `templates/`
escapes every value as `e` (`html.escape`) does, unless the template marks it `|safe` (markup we built), and the
CSP forbids scripts and every remote load, so a hostile name can neither run nor phone home. `Num`
keeps a number's exact value (`data-value`, the float's repr) next to its formatted text, for whoever reads
the page back (tests, people).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from html import escape
from pathlib import Path
from typing import Any, NamedTuple

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from jinja2.ext import Extension
from markupsafe import Markup

from traceflops.core import fmt
from traceflops.core.version import VERSION

MAX_ROWS = 25
NAME_CHARS = 140  # kernel names longer than this are cut (the full name is the cell's tooltip)

CSS = """
:root{--fg:#1a202c;--mute:#4a5568;--line:#e2e8f0;--bg:#fff;--card:#f7fafc}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg);margin:0;padding:24px 32px;max-width:1200px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
p.sub,.mute{color:var(--mute)}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:14px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:150px}
.card .k{font-size:12px;color:var(--mute);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:24px;font-weight:600}
.card .s{font-size:12px;color:var(--mute)}
table{border-collapse:collapse;width:auto;min-width:560px;max-width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:right;vertical-align:top}
th{background:var(--card);font-weight:600}
td.l,th.l{text-align:left}
td:not(.name):not(.l):not(.explain){white-space:nowrap}
td.name{text-align:left;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;max-width:560px}
ul.warn li{color:#975a16;margin:2px 0;word-break:break-word}
svg{display:block;max-width:100%;height:auto}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#2d3748}
svg .axis{stroke:#a0aec0;stroke-width:1}
svg .grid{stroke:#edf2f7;stroke-width:1}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;color:var(--mute);margin:4px 0}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px;border-radius:2px}
footer{margin-top:32px;color:var(--mute);font-size:12px}
h3{font-size:15px;margin:18px 0 6px}
.advice{border:1px solid var(--line);border-left:4px solid #dd6b20;border-radius:6px;padding:8px 14px;margin:10px 0;background:var(--card)}
.advice h3{margin:2px 0 4px}
.advice ul,.advice ol{margin:4px 0 6px;padding-left:22px}
.advice li{margin:2px 0;word-break:break-word}
.advice .lbl{font-size:12px;color:var(--mute);text-transform:uppercase;letter-spacing:.04em;margin-top:6px}
td.explain{text-align:left;color:var(--mute);white-space:normal;min-width:240px;max-width:420px}
table.gemm-shapes td.explain{min-width:200px;max-width:300px}
.pair{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
details summary{cursor:pointer;color:var(--mute);margin:6px 0}
"""  # noqa: E501 (CSS rules one a line, as the page writes them: splitting one would change the page)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


# --- formatting -------------------------------------------------------------


def e(v: Any) -> str:
    """Escaped text of any value (every trace string passes through here, or through a template)."""
    return escape("" if v is None else str(v), quote=True)


def _escaped(v: Any) -> Any:
    """A template's `{{ value }}`: escaped as `e` escapes (byte for byte), unless it is markup already (`|safe`, a
    macro)."""
    return v if hasattr(v, "__html__") else Markup(e(v))


class _OneLine(Extension):
    """Templates are written one element a line; the page is one line: each line's indentation and line break are
    dropped
    (a line break the page needs is written `{{ "\\n" }}`)."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return "".join(line.lstrip() for line in source.splitlines())


@cache
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        finalize=_escaped,
        extensions=[_OneLine],
        auto_reload=False,
    )
    env.filters["e"] = env.filters["escape"] = (
        _escaped  # never markupsafe's (it writes quotes as &#39; / &#34;, `e` as &#x27; / &quot;)
    )
    env.filters["repr"] = repr
    return env


def render(template: str, **values: Any) -> str:
    """A template of `templates/` filled with `values` (escaped unless marked `|safe`), as plain text to join with
    others."""
    return str(_env().get_template(template).render(**values))


def macros(template: str) -> Any:
    """The macros of a template of `templates/`, to call from Python (each returns markup: wrap it in `str` before
    joining)."""
    return _env().get_template(template).module


# --- page -------------------------------------------------------------------


def page(title: str, body: Iterable[str]) -> str:
    """The document shell: CSP forbids scripts and every remote load."""
    return render(
        "page.html", title=fmt.printable(title), csp=CSP, css=CSS, body=list(body), pkg="traceflops", version=VERSION
    )


def cards(items: list[tuple[str, str, str]]) -> str:
    return str(macros("blocks.html").cards(items))


def legend(colors: dict[str, str], labels: dict[str, str] | None = None) -> str:
    return str(macros("blocks.html").legend(colors, labels or {}))


class Num(NamedTuple):
    """A formatted number that keeps its exact value (`data-value`, the repr) for whoever reads the page back."""

    text: str
    value: Any
    key: str = ""

    def attrs(self) -> str:
        return str(macros("blocks.html").num_attrs(self))


def num(text: str, value: Any, key: str = "") -> Num:
    return Num(text, value, key)


def span(n: Num, cls: str = "num") -> str:
    """A number inline in running text."""
    return str(macros("blocks.html").span(n, cls))


def table(
    headers: list[str],
    rows: list[list[Any]],
    left: Iterable[int] = (0,),
    name_cols: Iterable[int] = (),
    css_class: str = "",
    explain_last: bool = False,
) -> str:
    """A table of escaped cells; `name_cols` are monospace, wrapped (kernel names); `Num` cells keep their value;
    `explain_last`: the last column is a one-line explanation (wrapped, muted)."""
    left, name_cols = set(left), set(name_cols)
    explain = len(headers) - 1 if explain_last else -1
    cls = lambda i: "explain" if i == explain else "name" if i in name_cols else ("l" if i in left else "")
    head = [(h, "l" if i in left or i in name_cols or i == explain else "") for i, h in enumerate(headers)]

    def cell(i: int, c: Any) -> dict[str, Any]:
        if isinstance(c, Num):
            return {"cls": cls(i), "title": None, "num": c, "text": c.text}
        if i in name_cols and c is not None and len(str(c)) > NAME_CHARS:
            return {"cls": "name", "title": c, "num": None, "text": fmt.short(c, NAME_CHARS)}
        return {"cls": cls(i), "title": None, "num": None, "text": c}

    body = [[cell(i, c) for i, c in enumerate(r)] for r in rows]
    return str(macros("blocks.html").table(head, body, css_class))


def warnings_list(warnings: list[str]) -> str:
    return str(macros("blocks.html").warnings_list(warnings))


def h2(title: str, anchor: str) -> str:
    return str(macros("blocks.html").h2(title, anchor))
