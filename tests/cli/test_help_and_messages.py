"""Every option says what it is for, and commands that write a file say what they wrote."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tests.builders import CPU
from traceflops.cli.main import main


def commands(group: click.Group):
    for name, cmd in group.commands.items():
        yield name, cmd
        if isinstance(cmd, click.Group):
            yield from commands(cmd)


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_option_of_every_command_has_help(name):
    cmd = main.commands[name]
    missing = [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert missing == [], f"{name}: options without help: {missing}"


def test_the_commands_are_all_walked():
    assert {"analyze", "summarize", "merge", "mfu", "diff", "annotate", "check"} <= set(main.commands)


def test_summarize_says_what_it_wrote(tmp_path):
    out = tmp_path / "r.tfsum"
    r = CliRunner().invoke(main, ["summarize", str(CPU / "ns_eager_sdpa.json.gz"), "-o", str(out), "--no-cache", "--peak-tflops", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert out.exists()
    assert f"wrote {out}" in r.stderr and "steps" in r.stderr
    assert r.stdout == ""  # stdout stays free, as analyze's --html and --tables keep it


def test_a_diff_with_no_largest_change_says_why_without_pointing_at_absent_warnings():
    from traceflops.api import analyze
    from traceflops.report.diff import largest_change_text
    from traceflops.views.diff import diff

    a = analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1)
    d = diff(a, a)
    assert d["largest_change"] is None and d["warnings"] == []
    line = largest_change_text(d)
    assert "warnings" not in line and "no phase's matmul FLOPs moved" in line


def test_the_html_report_counts_the_steps_the_totals_count(tmp_path):
    """A step left out (here --exclude-step) is not counted in the headline's step count."""
    from traceflops.api import analyze, to_html

    a = analyze(CPU / "ns_eager_sdpa.json.gz", peak_tflops=1, exclude_steps=(1,))
    sc = a.totals["step_count"]
    assert sc["counted"] < sc["in_trace"]
    page = to_html(a)
    assert f"{sc['counted']} of {sc['in_trace']} steps counted" in page
    assert f"{sc['in_trace']} step(s)" not in page
