"""Every report through one door: a value (a trace's `Analysis`, a `Job`, a diff) and a format (terminal, json, html).

Each format's module keeps its own builder; the table here is the protocol that says which builder serves which
value, so the command line, the API and the profiler handler call the same three functions (`show`, `render`,
`chunks`) and a new format or value is one row of `WRITERS` / `PRINTERS`, not one more call site to find.

Builders take the value alone (`Writer`: value → text) or the value and a console (`Printer`: prints, for the
terminal, where the width decides the layout). The terminal report as text (for a file) is the printer's output on a
console of fixed width without colours.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

from traceflops.core.results import Analysis, Job

if TYPE_CHECKING:
    from rich.console import Console

Format = Literal["terminal", "json", "html"]
Kind = Literal["analysis", "job", "diff"]
FORMATS: tuple[Format, ...] = ("terminal", "json", "html")
TEXT_WIDTH = 160  # the terminal report written to a file


class Writer(Protocol):
    def __call__(self, value: Any, /) -> str: ...


class Printer(Protocol):
    def __call__(self, value: Any, console: Console | None = None, /) -> None: ...


def kind(value: Any) -> Kind:
    """Which report a value is: a trace's analysis, a job, or a diff (`views.diff.diff`'s mapping)."""
    if isinstance(value, Analysis):
        return "analysis"
    if isinstance(value, Job):
        return "job"
    if isinstance(value, Mapping):
        return "diff"
    raise TypeError(f"no report renders a {type(value).__name__}")


def _single_json(a: Analysis) -> str:
    from traceflops.report.jsonreport import render

    return render(a)


def _single_html(a: Analysis) -> str:
    from traceflops.report.html import render_html

    return render_html(a)


def _single_terminal(a: Analysis, console: Console | None = None) -> None:
    from traceflops.report.terminal import render

    render(a, console)


def _job_json(job: Job) -> str:
    from traceflops.report.jobreport import render_json

    return render_json(job)


def _job_html(job: Job) -> str:
    from traceflops.report.html import render_job_html

    return render_job_html(job)


def _job_terminal(job: Job, console: Console | None = None) -> None:
    from traceflops.report.jobreport import render

    render(job, console)


def _diff_json(d: Mapping[str, Any]) -> str:
    from traceflops.report.diff import render_json

    return render_json(dict(d))


def _diff_html(d: Mapping[str, Any]) -> str:
    from traceflops.report.html import render_diff_html

    return render_diff_html(dict(d))


def _diff_terminal(d: Mapping[str, Any], console: Console | None = None) -> None:
    from traceflops.report.diff import render_terminal

    render_terminal(dict(d), console)


# The renderers' modules load when used: `traceflops --help` and the analyzer's import stay fast.
WRITERS: dict[tuple[Kind, Format], Callable[[Any], str]] = {
    ("analysis", "json"): _single_json,
    ("analysis", "html"): _single_html,
    ("job", "json"): _job_json,
    ("job", "html"): _job_html,
    ("diff", "json"): _diff_json,
    ("diff", "html"): _diff_html,
}
PRINTERS: dict[Kind, Callable[..., None]] = {
    "analysis": _single_terminal,
    "job": _job_terminal,
    "diff": _diff_terminal,
}


def show(value: Any, console: Console | None = None) -> None:
    """The terminal report, printed (to `console`, else standard output at its width)."""
    PRINTERS[kind(value)](value, console)


def render(value: Any, fmt: Format) -> str:
    """The report as text: JSON, an HTML page, or the terminal report at `TEXT_WIDTH` columns without colours."""
    if fmt == "terminal":
        from traceflops.report.console import console

        buf = io.StringIO()
        show(value, console(file=buf, width=TEXT_WIDTH, color_system=None))
        return buf.getvalue()
    return WRITERS[(kind(value), fmt)](value)


def chunks(value: Any) -> Iterator[bytes | memoryview]:
    """The JSON report as UTF-8 pieces: a trace's steps a few thousand at a time (a report of 200 000 steps is
    hundreds of MB of text), any other report whole."""
    if isinstance(value, Analysis):
        from traceflops.report.jsonreport import render_chunks

        yield from render_chunks(value)
    else:
        yield render(value, "json").encode()
