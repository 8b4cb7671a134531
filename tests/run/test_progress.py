"""Progress for long work: the analysis says each stage as it starts, a job each rank as it is done (on a terminal only)."""

from __future__ import annotations

from tests.builders import FIXTURES
from traceflops.core.results import ModelOptions
from traceflops.run.load import analyze
from traceflops.run.ranks import summarize_all


class Recorder:
    """Stands in for the CLI's progress display."""

    def __init__(self):
        self.stages, self.bytes = [], []

    def __call__(self, done, total):
        self.bytes.append((done, total))

    def stage(self, name):
        self.stages.append(name)


def test_every_analysis_stage_is_announced_in_order():
    rec = Recorder()
    analyze(str(FIXTURES / "dist" / "ddp" / "rank0.json.gz"), ModelOptions(), None, rec)
    assert rec.stages == ["clean", "link, phases, FLOPs", "steps", "timeline, critical path, roofline", "advice"]


def test_a_job_counts_its_ranks_as_they_finish():
    seen = []
    paths = [str(FIXTURES / "dist" / "ddp" / f"rank{r}.json.gz") for r in (0, 1)]
    summarize_all(paths, ModelOptions(), 1, on_done=lambda n, total: seen.append((n, total)))
    assert seen == [(1, 2), (2, 2)]


def test_no_progress_reaches_a_pipe(tmp_path):
    from click.testing import CliRunner

    from traceflops.cli.main import main

    r = CliRunner().invoke(main, ["analyze", str(FIXTURES / "dist" / "ddp"), "--no-cache", "--format", "json"])
    assert r.exit_code == 0 and "ranks:" not in r.stderr and "analysing:" not in r.stderr


def test_the_last_stage_stays_shown_while_it_runs_and_is_cleared_after(capsys):
    from traceflops.cli.common import Progress

    p = Progress(quiet=False)
    p.on = p.big = True  # a terminal and a big file
    p.stage("advice")
    assert capsys.readouterr().err.endswith("analysing: advice")
    p.done()
    assert capsys.readouterr().err == "\r\x1b[2K"
