"""The JSON report written in pieces (steps a few thousand at a time) is the report's text, byte for byte."""

from __future__ import annotations

from dataclasses import replace

from click.testing import CliRunner

from tests.builders import Builder
from traceflops.cli.main import main
from traceflops.report.jsonreport import render, render_chunks
from traceflops.run.load import analyze


def _many_steps(tmp_path, n: int = 30) -> str:
    b = Builder()
    for i in range(n):
        ts = 1000.0 + 50.0 * i
        b.annotation(f"ProfilerStep#{i}", ts, 40.0)
        b.op("aten::add", ts + 2.0, 10.0)
        b.kernel("elementwise_kernel", ts + 3.0, ts + 6.0, 5.0 + i % 3)
    return b.write(tmp_path / "steps.json.gz")


def test_the_pieces_are_the_report(tmp_path):
    a = analyze(_many_steps(tmp_path))
    assert a.steps.height >= 29
    whole = render(a).encode()
    for rows in (1, 7, 4096):
        assert b"".join(render_chunks(a, rows)) == whole
    none = replace(a, steps=a.steps.clear())
    assert b"".join(render_chunks(none, 7)) == render(none).encode()


def test_the_command_writes_the_report_in_pieces(tmp_path):
    path = _many_steps(tmp_path)
    r = CliRunner().invoke(main, ["analyze", path, "--no-cache", "--format", "json", "--quiet"])
    assert r.exit_code == 0, r.output
    assert r.output == render(analyze(path)) + "\n"
