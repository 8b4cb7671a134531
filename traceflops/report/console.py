"""The terminal renderers' console and tables: what every terminal report (a trace, a job, a diff) prints through.

Every string that comes from a trace goes through `text`: control characters
shown as `\\xNN` (no escape sequence reaches the terminal: clear-screen,
window titles, hyperlinks), then cut, then rich markup escaped (a kernel named
`[link=...]` prints as written); an unknown value prints as `—`. `console()` is
the renderers' default console and shows control characters in any string it
renders, the guard for a value a renderer did not pass through `text`.

Tables read at any width (`grid`): numbers are never cut; on a terminal a kernel
name is shortened by meaning (`fmt.kernel_short`) and cut to its column; below
the width every column needs, headers shorten, a long prose column leaves the
table for lines beneath it, and then each row is stacked (its name on one line,
its values labelled beneath): no column is dropped, none wraps word by word.

Piped (CI logs, `| tee`, `| less`) the console is `COLUMNS` wide, else
`PIPE_WIDTH`, and lines are wrapped to it; names print whole: a table whose
names do not fit its column numbers its rows and lists each whole name on a
line of its own beneath it (a log is read later, often searched, and a cut name
cannot be found).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from traceflops.core import fmt

PIPE_WIDTH = 100  # columns when the output is not a terminal and COLUMNS does not say
BAR = 40  # cells of a full (100%) bar
BAR_MIN = 10  # the fewest cells a bar column shrinks to
NAME_MIN = 16  # the fewest columns a cut name keeps on a terminal before the rows stack


class _PrintableConsole(Console):
    """A rich console whose rendered strings never carry control characters (newlines kept: rich lays out lines)."""

    def render_str(self, text: str, **kw):
        return super().render_str(fmt.printable(text, keep_newlines=True), **kw)


def pipe_width() -> int:
    """The width of output that is not a terminal: `COLUMNS` when it says one, else `PIPE_WIDTH`."""
    cols = os.environ.get("COLUMNS", "").strip()
    return int(cols) if cols.isdigit() and int(cols) >= 20 else PIPE_WIDTH


def printable_console(**kw) -> Console:
    """The console the terminal renderers print on by default (rich's Console arguments).

    Not a terminal and no width given: `pipe_width()` columns, lines wrapped to it.
    """
    c = _PrintableConsole(**kw)
    if "width" not in kw and not c.is_terminal:
        c.width = pipe_width()
    return c


console = printable_console  # the name the other renderers and the CLI import


def text(v, n: int | None = None) -> str:
    """A value from a trace as rich markup that prints literally: `—` when unknown, control characters visible, cut to
    `n`, brackets escaped."""
    return escape(fmt.printable(fmt.NONE if v is None else v, n))


# --- tables that read at any width ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column of `grid`: its header, a shorter one for narrow layouts, and its kind.

    num: right-aligned, never cut; label: a short word (a kind, a step's name), never cut; name: a kernel or module
    name (shortened by meaning and cut on a terminal, whole when piped); bar: a share (its cells shrink); prose: a
    sentence (beneath the table when the table would not fit with it).
    """

    header: str
    short: str | None = None
    kind: str = "num"


def _overhead(n: int) -> int:
    """Cells a boxed table of `n` columns spends on borders and padding."""
    return 3 * n + 1


def _bar_cells(share, full: float) -> str:
    return "" if share is None or share <= 0 else "█" * round(share * full) or "▏"


def grid(c: Console, title: str, cols: list[Col], rows: list[list], short_title: str | None = None) -> None:
    """A table that reads at the console's width: numbers whole, names shortened, else each row stacked."""
    width, piped = c.width, not c.is_terminal
    prose = [i for i, col in enumerate(cols) if col.kind == "prose"]
    shown = [i for i, col in enumerate(cols) if col.kind != "prose"]
    name_i = next((i for i in shown if cols[i].kind == "name"), None)
    bar_i = next((i for i in shown if cols[i].kind == "bar"), None)
    names_whole = (
        [fmt.printable(fmt.NONE if r[name_i] is None else r[name_i]) for r in rows] if name_i is not None else []
    )
    names = names_whole if piped else [fmt.printable(fmt.kernel_short(n)) for n in names_whole]
    bar_natural = max((len(bar(r[bar_i])) for r in rows), default=0) if bar_i is not None else 0

    def cell(r, i) -> str:
        return fmt.printable(fmt.NONE if r[i] is None else r[i])

    for headers in ("full", "short"):
        head = [(col.short if headers == "short" and col.short else col.header) for col in cols]
        fixed = {
            i: max([cell_len(head[i]), *(cell_len(cell(r, i)) for r in rows)])
            for i in shown
            if i not in (name_i, bar_i)
        }
        avail = width - _overhead(len(shown)) - sum(fixed.values())
        name_natural = max([cell_len(head[name_i]), *map(cell_len, names)]) if name_i is not None else 0
        bar_w = max(bar_natural, cell_len(head[bar_i])) if bar_i is not None else 0
        prose_natural = max((cell_len(cell(r, i)) for r in rows for i in prose), default=0)
        with_prose = prose and avail - name_natural - bar_w - 3 - max(prose_natural, 7) >= 0
        if avail < name_natural + bar_w and bar_i is not None:
            bar_w = max(min(BAR_MIN, bar_w), avail - name_natural)
        name_w = min(name_natural, avail - bar_w) if name_i is not None else 0
        if avail - bar_w < 0 or (name_i is not None and name_w < min(name_natural, NAME_MIN)):
            continue
        if headers == "full" and name_i is not None and name_w < name_natural and not piped:
            shorter = [col.short or col.header for col in cols]
            gain = sum(cell_len(a) - cell_len(b) for a, b in zip(head, shorter, strict=True))
            if gain > 0 and all(cell_len(b) <= fixed.get(i, 0) or i in (name_i, bar_i) for i, b in enumerate(shorter)):
                pass  # the short headers free no column: keep these
            elif gain > 0:
                continue  # short headers give the names more room
        legend = piped and name_i is not None and name_w < name_natural
        t = Table(title=title if headers == "full" or short_title is None else short_title)
        if legend:
            t.add_column("#", justify="right", no_wrap=True)
            name_w -= 3 + len(str(len(rows)))
            if name_w < min(name_natural, NAME_MIN):
                continue
        for i in shown + (prose if with_prose else []):
            kind = cols[i].kind
            w = {"name": name_w, "bar": bar_w}.get(kind, fixed.get(i))
            t.add_column(
                head[i],
                justify="right" if kind == "num" else "left",
                no_wrap=kind != "prose",
                width=w,
                min_width=w,
                max_width=w,
                overflow="fold" if kind == "prose" else "ellipsis",
            )
        full = BAR * bar_w / bar_natural if bar_natural > bar_w else BAR
        for k, r in enumerate(rows):
            out = [str(k + 1)] if legend else []
            for i in shown + (prose if with_prose else []):
                kind = cols[i].kind
                if kind == "name":
                    shown_name = fmt.kernel_short(names_whole[k]) if legend else names[k]
                    out.append(escape(fmt.short(shown_name, name_w)))
                elif kind == "bar":
                    out.append(_bar_cells(r[i], full)[:bar_w])
                elif kind == "prose":
                    out.append(f"[dim]{escape(cell(r, i))}[/dim]")
                else:
                    out.append(escape(cell(r, i)))
            t.add_row(*out)
        c.print(t)
        if legend:
            for k, n in enumerate(names_whole):
                c.print(f"  {k + 1}. {escape(n)}", soft_wrap=True, overflow="ignore", crop=False)
        if prose and not with_prose:
            for r in rows:
                c.print(f"  {escape(cell(r, shown[0]))}: [dim]{' '.join(escape(cell(r, i)) for i in prose)}[/dim]")
        return
    _stacked(c, title if short_title is None else short_title, cols, rows, names, piped)


def _stacked(c: Console, title: str, cols: list[Col], rows: list[list], names: list[str], piped: bool) -> None:
    """Each row as a block: its first column on a line of its own (a name whole when piped, else cut to the width),
    then its other columns as `header value` pairs, wrapped between pairs, never inside a value."""
    width = c.width
    c.print(f"[italic]{escape(title)}[/italic]")
    name_i = next((i for i, col in enumerate(cols) if col.kind == "name"), None)
    for k, r in enumerate(rows):
        first = names[k] if name_i == 0 else fmt.printable(fmt.NONE if r[0] is None else r[0])
        if piped:
            c.print(f" {escape(first)}", soft_wrap=True, overflow="ignore", crop=False)
        else:
            c.print(f" {escape(fmt.short(first, width - 1))}")
        pairs = []
        for i, col in enumerate(cols[1:], 1):
            head = col.short or col.header
            if col.kind == "bar":
                v = _bar_cells(r[i], BAR_MIN)
                if not v:
                    continue
            elif col.kind == "name":
                v = names[k]
            else:
                v = fmt.printable(fmt.NONE if r[i] is None else r[i])
            pairs.append((f"{head} {v}".strip() if head else v, col.kind == "prose"))
        line, indent = "", "    "
        for pair, is_prose in pairs:
            if is_prose:
                if line:
                    c.print(escape(line))
                    line = ""
                c.print(f"{indent}[dim]{escape(pair)}[/dim]")
                continue
            candidate = f"{line}  {pair}" if line else f"{indent}{pair}"
            if line and cell_len(candidate) > width:
                c.print(escape(line))
                candidate = f"{indent}{pair}"
            line = candidate
        if line:
            c.print(escape(line))


def bar(share) -> str:
    """A share as a bar of `BAR` cells for 100%: a thin mark for a share under half a cell, nothing for none, zero or a
    negative one."""
    if share is None or share <= 0:
        return ""
    return "█" * round(share * BAR) or "▏"
