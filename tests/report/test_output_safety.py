"""What traceflops writes must not harm the user: devices and inputs are never replaced, files are whole or absent,
trace strings cannot drive the terminal or a spreadsheet, and impossible numbers on the command line are usage errors.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import os
import re
import stat
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from tests.builders import SCENARIOS, Builder, shapes
from tests.cli.test_bad_input import one_line
from traceflops.cli.main import main
from traceflops.core.files import write_atomic
from traceflops.core.fmt import printable

# a window title, clear-screen, a one-byte CSI (C1), an OSC 8 hyperlink and rich markup, in one name
PLANT = "\x1b]0;pwned\x07\x1b[2J\x9b31m\x1b]8;;http://x\x1b\\[link=http://x]x[/link][bold red]"
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # what must never reach a terminal (newlines are layout)


def run(*args):
    """The command line in process, on a wide terminal (no line breaks inside a name)."""
    return CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "400"})


def assert_printable(result) -> None:
    """No control character (escape, bell, C1 CSI) in stdout or stderr, and no traceback."""
    for name, out in (("stdout", result.stdout), ("stderr", result.stderr)):
        bad = CONTROL.findall(out)
        assert not bad, (name, bad[:5], out[:2000])
        assert not {0x1b, 0x07} & set(out.encode()), name
        assert "Traceback" not in out


def planted_trace(path: Path, tag: str = PLANT, kernel_ms: float = 0.25) -> str:
    """A one-step GPU trace whose kernel, op, module and category names carry `tag`."""
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 2000)
    b.annotation("block" + tag, 50, 500)
    b.op("aten::mm", 100, 50, **shapes([[1024, 1024], [1024, 1024]]))
    b.kernel("gemm" + tag, 105, 100, kernel_ms * 1e3)
    b.op("aten::add", 200, 20)
    b.kernel("add" + tag, 205, 400, 100)
    b.events.append({"ph": "X", "cat": "cat" + tag, "name": "odd" + tag, "pid": 100, "tid": 1, "ts": 300, "dur": 5, "args": {}})
    return b.write(path)


@pytest.fixture
def trace(tmp_path) -> str:
    return planted_trace(tmp_path / "t.json.gz")


def cache(tmp_path) -> list[str]:
    return ["--cache-dir", str(tmp_path / "cache")]


# ------------------------------------------------------------------ devices and FIFOs are written in place, never replaced


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there, so the writer's open does not block
    try:
        write_atomic(fifo, lambda p: p.write_text("the report", encoding="utf-8"))
        try:
            got = os.read(reader, 1 << 16)
        except BlockingIOError:
            got = b""
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got == b"the report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary file left beside it


def _device_link(tmp_path) -> Path:
    link = tmp_path / "out.link"
    link.symlink_to("/dev/null")
    return link


def _assert_device_intact(link: Path) -> None:
    assert os.path.islink(link) and os.readlink(link) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert stat.S_ISCHR(os.stat(link).st_mode)


@pytest.mark.parametrize("command", ["analyze --html", "summarize -o", "annotate -o", "diff -o", "diff json -o"])
def test_a_link_to_a_device_stays_a_link_to_the_device(tmp_path, trace, command):
    link = _device_link(tmp_path)
    args = {
        "analyze --html": ["analyze", trace, "--html", link],
        "summarize -o": ["summarize", trace, "-o", link],
        "annotate -o": ["annotate", trace, "-o", link],
        "diff -o": ["diff", trace, trace, "-o", link],
        "diff json -o": ["diff", trace, trace, "--format", "json", "-o", link],
    }[command]
    r = run(*args, *cache(tmp_path))
    assert r.exit_code == 0, (r.stderr, r.exception)
    _assert_device_intact(link)


def test_a_block_device_is_refused(tmp_path):
    dev = tmp_path / "disk"
    try:
        os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(7, 200))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a block device node here ({e})")
    with pytest.raises(OSError) as e:
        write_atomic(dev, lambda p: p.write_text("x"))
    assert e.value.errno == errno.EPERM
    assert stat.S_ISBLK(os.lstat(dev).st_mode)


# ------------------------------------------------------------------ an input is never an output


def _same_file_cases(tmp_path, trace) -> dict:
    t = Path(trace)
    linked_dir = tmp_path / "via"
    linked_dir.symlink_to(tmp_path)
    hard = tmp_path / "hard.json.gz"
    os.link(t, hard)
    tables_dir = tmp_path / "tables"
    tables_dir.mkdir()
    in_tables = Path(planted_trace(tables_dir / "steps.csv", tag="x"))
    return {
        "analyze --html itself": (["analyze", t, "--html", t], t, "--html"),
        "analyze --html a hard link": (["analyze", t, "--html", hard], t, "--html"),
        "analyze --tables where a table is the input": (["analyze", in_tables, "--tables", tables_dir], in_tables, "--tables"),
        "summarize -o itself": (["summarize", t, "-o", t], t, "-o"),
        "annotate -o through a linked folder": (["annotate", t, "-o", linked_dir / t.name], t, "-o"),
        "diff -o the after trace": (["diff", hard, t, "-o", t], t, "-o"),
    }


CASES = ["analyze --html itself", "analyze --html a hard link", "analyze --tables where a table is the input",
         "summarize -o itself", "annotate -o through a linked folder", "diff -o the after trace"]


@pytest.mark.parametrize("case", CASES)
def test_an_output_that_is_an_input_is_refused(tmp_path, trace, case):
    args, victim, option = _same_file_cases(tmp_path, trace)[case]
    before = victim.read_bytes()
    r = run(*args, *cache(tmp_path))
    one_line(r, 2, option, "input")
    assert victim.read_bytes() == before


# ------------------------------------------------------------------ every file is whole or not written


def test_diff_to_a_file_in_terminal_format_is_whole_or_untouched(tmp_path, trace, monkeypatch):
    out = tmp_path / "diff.txt"
    out.write_text("the previous report\n")

    def render_then_fail(d, console=None):
        console.print("before ... (the first lines of a report)")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("traceflops.report.diff.render_terminal", render_then_fail)
    run("diff", trace, trace, "-o", out, *cache(tmp_path))
    assert out.read_text() == "the previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".diff")) == []


def test_diff_to_a_file_in_terminal_format_holds_the_report(tmp_path, trace):
    out = tmp_path / "diff.txt"
    r = run("diff", trace, trace, "-o", out, *cache(tmp_path))
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert "Headline" in text and "\x1b" not in text


# ------------------------------------------------------------------ trace strings cannot drive the terminal


def test_analyze_terminal_shows_trace_strings_without_control_characters(tmp_path, trace):
    r = run("analyze", trace, *cache(tmp_path))
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert_printable(r)
    assert "gemm\\x1b]0;pwned\\x07" in r.stdout  # visible, not dropped
    assert "[bold red]" in r.stdout  # markup printed as written


def test_a_file_name_in_an_error_line_is_printable(tmp_path):
    missing = tmp_path / f"run{PLANT}.json"
    for command in (["analyze", missing], ["summarize", missing, "-o", tmp_path / "s.tfsum"], ["diff", missing, missing]):
        r = run(*command, *cache(tmp_path))
        one_line(r, 2)
        assert_printable(r)


def test_an_internal_error_line_is_printable(tmp_path, trace, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("bad kernel " + PLANT)

    monkeypatch.setattr("traceflops.run.load.analyze", boom)
    r = run("analyze", trace, "--no-cache")
    assert r.exit_code == 4
    assert_printable(r)
    assert len(r.stderr.strip().splitlines()) == 1


def _rank_traces(tmp_path) -> list[str]:
    paths = []
    for rank in range(2):
        b = SCENARIOS["rank"](rank=rank)
        for e in b.events:
            if "Process Group Name" in e.get("args", {}):
                e["args"]["Process Group Name"] = "pg" + PLANT
        paths.append(b.write(tmp_path / f"rank{rank}.json.gz"))
    return paths


def test_job_terminal_shows_process_groups_without_control_characters(tmp_path):
    r = run("analyze", *_rank_traces(tmp_path), *cache(tmp_path))
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert_printable(r)
    assert "pg\\x1b" in r.stdout


def test_merge_shows_summary_warnings_without_control_characters(tmp_path):
    from traceflops.storage.summary import read_summary, write_summary

    sums = []
    for i, p in enumerate(_rank_traces(tmp_path)):
        s = tmp_path / f"r{i}.tfsum"
        assert run("summarize", p, "-o", s, *cache(tmp_path)).exit_code == 0
        planted = dataclasses.replace(read_summary(s), warnings=["from the summary " + PLANT], path=f"rank{i}{PLANT}")
        write_summary(planted, s)
        sums.append(s)
    r = run("merge", *sums)
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert_printable(r)
    assert "from the summary \\x1b" in r.stdout


def test_diff_terminal_shows_kernel_names_without_control_characters(tmp_path):
    before = planted_trace(tmp_path / "before.json.gz", kernel_ms=0.25)
    after = planted_trace(tmp_path / "after.json.gz", kernel_ms=0.5)
    r = run("diff", before, after, *cache(tmp_path))
    assert r.exit_code == 0, (r.stderr, r.exception)
    assert_printable(r)
    assert "gemm\\x1b" in r.stdout


def test_printable_escapes_before_it_cuts():
    from traceflops.core.fmt import printable

    out = printable("kernel\x1b]0;pwned\x07", 10)
    assert not CONTROL.search(out) and len(out) == 10
    assert printable("a\nb") == "a\\x0ab"  # one value never makes a second line


# ------------------------------------------------------------------ CSV cells are never formulas


FORMULAS = ['=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A2)", "\t=1", "\r=1"]


def test_tables_csv_text_cells_cannot_start_a_formula(tmp_path):
    b = Builder()
    b.annotation("ProfilerStep#1", 0, 5000)
    for i, name in enumerate(FORMULAS):
        b.op("aten::mm", 100 + 100 * i, 50, **shapes([[64, 64], [64, 64]]))
        b.kernel(name, 105 + 100 * i, 1000 + 100 * i, 20)
    trace = b.write(tmp_path / "f.json.gz")
    r = run("analyze", trace, "--tables", tmp_path / "tables", *cache(tmp_path))
    assert r.exit_code == 0, (r.stderr, r.exception)
    with open(tmp_path / "tables" / "kernels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    names = [row["name"] for row in rows]
    # a leading tab or carriage return is shown as the terminal shows it (`\x09`): no longer a formula's start
    assert sorted(names) == sorted(printable(n) if n[0] in "\t\r" else "'" + n for n in FORMULAS)
    for row in rows:
        for cell in row.values():
            assert not cell or cell[0] not in "=+-@\t\r" or _is_number(cell), cell
    assert sorted(pl.read_parquet(tmp_path / "tables" / "kernels.parquet")["name"].to_list()) == sorted(FORMULAS)  # parquet as is


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_negative_numbers_stay_numbers_in_csv(tmp_path):
    from traceflops.report.tables import write_frames

    df = pl.DataFrame({"name": ["-1.5", "=1+1", "ok"], "delta": [-1.5, -2.0, 3.0], "n": [-1, 0, 1]})
    write_frames({"t": df}, tmp_path)
    back = pl.read_csv(tmp_path / "t.csv")
    assert back["delta"].dtype == pl.Float64 and back["delta"].to_list() == [-1.5, -2.0, 3.0]
    assert back["n"].to_list() == [-1, 0, 1]
    assert back["name"].to_list() == ["'-1.5", "'=1+1", "ok"]


def test_every_table_a_report_writes_is_named(tmp_path, trace):
    """The input check of --tables knows every file a report can write."""
    from traceflops.api import analyze
    from traceflops.report.tables import TABLE_NAMES, frames

    assert set(frames(analyze(trace))) <= set(TABLE_NAMES)


# ------------------------------------------------------------------ impossible numbers are usage errors


BAD_NUMBERS = [
    ("--peak-tflops", "-1"), ("--peak-tflops", "nan"), ("--peak-tflops", "1e-300"), ("--peak-tflops", "inf"),
    ("--params", "inf"), ("--layers", "-2"), ("--world-size", "-4"), ("--world-size", "30000000"),
    ("--tokens-per-step", "-1"), ("--seq-len", "0"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_NUMBERS)
def test_a_bad_number_for_analyze_is_one_line_exit_2(tmp_path, trace, flag, value):
    r = run("analyze", trace, flag, value, *cache(tmp_path))
    one_line(r, 2, flag)


@pytest.mark.parametrize(("flag", "value"), [("--devices", "0"), ("--peak-tflops", "-1"), ("--tokens-per-second", "nan"),
                                             ("--layers", "0"), ("--executed-flops-per-token", "-5")])
def test_a_bad_number_for_mfu_is_one_line_exit_2(flag, value):
    base = {"--tokens-per-second": "1e6", "--params": "1e9", "--layers": "24", "--heads": "16", "--head-dim": "64",
            "--seq-len": "2048", "--peak-tflops": "100"}
    base[flag] = value
    r = run("mfu", *[x for kv in base.items() for x in kv])
    one_line(r, 2, flag)


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--pipeline-stages", "-1"], ["--microbatches", "0"]])
def test_a_bad_job_number_is_one_line_exit_2(tmp_path, trace, args):
    one_line(run("analyze", trace, *args, *cache(tmp_path)), 2, args[0])


MODEL = {"params": 1e9, "layers": 24, "heads": 16, "head_dim": 64, "seq_len": 2048}


@pytest.mark.parametrize("kw", [{"peak_tflops": -1.0}, {"peak_tflops": float("nan")}, {"world_size": 0}, {"layers": -2},
                                {"tokens_per_step": float("inf")}, {"layers": True}, {"seq_len": 2.5}, {"heads": 0}])
def test_the_api_refuses_the_same_numbers(trace, kw):
    """A full model description, so that only the one bad number can be what is refused."""
    from traceflops.api import analyze
    from traceflops.core.errors import OptionsError

    with pytest.raises(OptionsError) as e:
        analyze(trace, **{**MODEL, **kw})
    assert next(iter(kw)) in str(e.value)


def test_help_texts_state_the_bounds():
    from traceflops.run.options import BOUNDS, bounds_text

    checked = 0
    for name in ("analyze", "mfu", "merge", "summarize", "diff", "annotate"):
        for p in main.commands[name].params:
            if p.name in BOUNDS:
                assert bounds_text(p.name) in (p.help or ""), (name, p.name, p.help)
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize("kw", [{"jobs": 0}, {"pipeline_stages": -1}, {"microbatches": 0}])
def test_the_job_api_refuses_bad_numbers_before_reading(kw, tmp_path):
    from traceflops.api import analyze_job
    from traceflops.core.errors import OptionsError

    with pytest.raises(OptionsError) as e:
        analyze_job(tmp_path / "no-such-dir", **kw)  # refused before the path is looked at
    assert next(iter(kw)) in str(e.value)
