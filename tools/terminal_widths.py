"""Render `traceflops analyze TRACE` in tmux at several widths and piped, and check what a reader needs.

    python tools/terminal_widths.py [TRACE ...]        # default: every shared Kineto trace and fixtures/cpu/*

Each trace is captured at 60, 80 and 120 columns (`tmux new-session -x W`, `capture-pane -p -S -`) and piped
(`| cat`, COLUMNS unset). Checked in each capture:

- cut numbers: no `…` next to a digit or a decimal point;
- long lines: none wider than the terminal (piped: wider than 100 only for a whole name on a line of its own);
- lost columns: every table row has as many cells as its header, and no header cell is empty but a bar's;
- wrapped columns: no table row that continues the row above (its first cell blank).

Prints one line per capture with its counts and a total; exits 1 when anything was found. Needs tmux.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACEFLOPS_FIXTURES", ROOT.parent / "shared" / "fixtures"))
WIDTHS = (60, 80, 120)
PIPE_WIDTH = 100
CUT_NUMBER = re.compile(r"(?<![\w.])\d[\d.,]*…|(?<!\w)\.…|…\d")  # a number cut (not a name ending in a digit)
DONE = "__traceflops_done__"


def traces() -> list[Path]:
    kineto = SHARED / "kineto"
    found = sorted(kineto.glob("*.json.gz")) + sorted(kineto.glob("*/*.json.gz")) if kineto.is_dir() else []
    return found + sorted((ROOT / "fixtures" / "cpu").glob("*.json.gz"))


# One cache for the run: each trace is analysed once, its four captures render the kept report.
CACHE = Path(tempfile.mkdtemp(prefix="traceflops_widths_"))


def command(trace: Path) -> str:
    return (
        f"{shlex.quote(sys.executable)} -m traceflops.cli analyze {shlex.quote(str(trace))} "
        f"--cache-dir {shlex.quote(str(CACHE))} --quiet"
    )


def in_tmux(trace: Path, width: int) -> str:
    session = f"tfw{os.getpid()}_{width}_{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as tmp:
        done = Path(tmp) / "done"
        script = f"cd {shlex.quote(str(ROOT))} && {command(trace)}; touch {shlex.quote(str(done))}; sleep 600"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", "50", script], check=True)
        try:
            deadline = time.monotonic() + 600
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            out = subprocess.run(
                ["tmux", "capture-pane", "-p", "-S", "-", "-t", session], capture_output=True, text=True, check=True
            ).stdout
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return out.rstrip("\n") + "\n"


def piped(trace: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        command(trace) + " | cat", shell=True, capture_output=True, text=True, env=env, cwd=ROOT
    ).stdout


def cells(line: str, sep: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split(sep)]


def check(out: str, width: int, is_piped: bool) -> dict[str, int]:
    """Counts of what a reader would trip over in one capture."""
    found = {"cut_numbers": 0, "long_lines": 0, "lost_columns": 0, "wrapped_rows": 0}
    header: list[str] | None = None
    for line in out.splitlines():
        found["cut_numbers"] += len(CUT_NUMBER.findall(line))
        if len(line) > width:
            table = line.lstrip()[:1] in "┃│┏┡└"
            name_line = is_piped and not table and line.startswith(" ")  # a whole name on a line of its own
            found["long_lines"] += not name_line
        s = line.strip()
        if s.startswith("┃"):
            header = cells(s, "┃")
            found["lost_columns"] += sum(1 for c in header if not c) > 1
        elif s.startswith("│") and header is not None:
            row = cells(s, "│")
            found["lost_columns"] += len(row) != len(header)
            found["wrapped_rows"] += not row[0] and any(row[1:])
        elif s.startswith("└"):
            header = None
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or traces()
    keeper = f"tfw{os.getpid()}_keep"  # keeps the tmux server up between captures
    subprocess.run(["tmux", "new-session", "-d", "-s", keeper, "sleep 86400"], check=True)
    try:
        return _run(paths)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", keeper], capture_output=True)
        shutil.rmtree(CACHE, ignore_errors=True)


def _run(paths: list[Path]) -> int:
    total = {"cut_numbers": 0, "long_lines": 0, "lost_columns": 0, "wrapped_rows": 0}
    for trace in paths:
        for width in (*WIDTHS, None):
            out = piped(trace) if width is None else in_tmux(trace, width)
            got = check(out, PIPE_WIDTH if width is None else width, width is None)
            for k, v in got.items():
                total[k] += v
            where = "piped" if width is None else f"{width} cols"
            print(f"{trace.name:48s} {where:8s} {len(out.splitlines()):4d} lines  {got}", flush=True)
    print(f"total over {len(paths)} traces: {total}")
    return 1 if any(total.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
