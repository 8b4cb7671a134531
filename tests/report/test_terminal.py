"""The terminal reports survive a pipe: whole names and numbers, `—` for unknowns, repeated warnings said once, what bounded the steps.

The CLI runs through CliRunner (its stdout is not a terminal, as in `| cat`, CI logs
and `| tee`); the sections that need a caller's value (the critical path) render on a
console that is not a terminal either. Expected values come from the trace files or
from the Analysis' own tables, never from the renderer.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.builders import CPU
from traceflops.cli.main import main
from traceflops.core.sections import StepOutlier, StepStats, WarmupStep

NS_CKPT = CPU / "ns_ckpt_nonreentrant.json.gz"
GPU = "kineto/v100_transformer_rank1.json.gz"  # no Input Dims: every matmul's FLOPs unknown
DLRM = "kineto/dlrm_8rank"
CUT_NUMBER = re.compile(r"(?<![\w.])\d[\d.,]*…|(?<!\w)\.…|…\d")  # a number cut (not a name ending in a digit)


def cli(*args) -> str:
    r = CliRunner().invoke(main, ["analyze", *[str(a) for a in args]])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def piped(render, value, width=None, **kw) -> str:
    """What `render` prints on a console that is not a terminal (as the CLI's, piped; its own width unless given)."""
    from traceflops.report.console import console

    buf = io.StringIO()
    render(value, console(file=buf, color_system=None, **({"width": width} if width else {})), **kw)
    return buf.getvalue()


def rows(out: str, title: str) -> list[list[str]]:
    """The body rows of the table whose title line contains `title`, cells stripped."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line and "│" not in line)
    body = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            body.append([c.strip() for c in line.strip("│").split("│")])
    return body


def assert_whole(out: str, step_names) -> None:
    assert "None" not in out
    assert not CUT_NUMBER.search(out), CUT_NUMBER.search(out)
    for n in step_names:
        assert re.search(rf"{re.escape(n)}(\s|$)", out), n


def step_events(path) -> list[tuple[str, float]]:
    with gzip.open(path) as f:
        doc = json.load(f)
    return sorted((e["ts"], e["name"]) for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))


# --- one CPU trace ------------------------------------------------------------


def test_cpu_trace_piped_has_whole_step_names_and_starts_in_ms_from_the_first_step():
    out = cli(NS_CKPT, "--peak-tflops", "1", "--no-cache")
    (t1, n1), (t2, n2) = step_events(NS_CKPT)
    assert_whole(out, [n1, n2])
    steps = {r[0]: r for r in rows(out, "Steps")}
    assert steps[n1][1] == "0.000"
    assert float(steps[n2][1]) == pytest.approx((t2 - t1) / 1e3, abs=0.001)  # 39.612 ms after step 1 began
    assert "rank —" in out


def test_cpu_trace_says_what_its_mfu_band_means_against_a_known_peak_only():
    arbitrary = cli(NS_CKPT, "--peak-tflops", "1", "--no-cache")
    assert not any(line.startswith("band:") for line in arbitrary.splitlines())  # against an arbitrary peak: no band
    lines = cli(NS_CKPT, "--hardware", "a100", "--no-cache").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("band: likely broken"))
    assert "under 20% MFU" in lines[i + 1]


def test_band_meanings_cover_every_band_with_its_range():
    from traceflops.flops.model import verdict_band
    from traceflops.report.terminal import BAND_MEANING

    for mfu in (0.05, 0.19, 0.2, 0.3, 0.35, 0.5, 0.55, 0.7, 0.75, 0.8, 0.99):
        meaning = BAND_MEANING[verdict_band(mfu)]
        lo_hi = re.match(r"(\d+)-(\d+)% MFU", meaning)
        under, over = re.match(r"under (\d+)% MFU", meaning), re.match(r"over (\d+)% MFU", meaning)
        pct = mfu * 100
        if lo_hi:
            assert int(lo_hi[1]) <= pct <= int(lo_hi[2]), (mfu, meaning)
        elif under:
            assert pct < int(under[1]), (mfu, meaning)
        else:
            assert over and pct > int(over[1]), (mfu, meaning)


def test_cpu_trace_critical_path_says_why_there_is_none():
    from traceflops.report.terminal import render
    from traceflops.run.load import analyze
    from traceflops.views.path_summary import path_summary

    a = analyze(str(NS_CKPT), _opts())
    out = piped(render, a, critical_path=path_summary(a))
    line = next(line for line in out.splitlines() if line.startswith("What bounded the steps (critical path)"))
    assert "CPU-only trace" in line


def test_repeated_warnings_are_said_once_with_their_count():
    from traceflops.report.terminal import render
    from traceflops.run.load import analyze

    a = analyze(str(NS_CKPT), _opts())
    out = piped(render, replace(a, warnings=["copies overlap", "steps renumbered", "copies overlap", "copies overlap"]))
    warns = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warns == ["warning: copies overlap (×3)", "warning: steps renumbered"]


def test_a_step_both_warm_up_and_outlier_says_why():
    from traceflops.report.terminal import render
    from traceflops.run.load import analyze

    a = analyze(str(NS_CKPT), _opts())
    first, second = a.steps["step"].to_list()
    # the fields these lines do not read are unknown (None) or empty
    ss = StepStats(count=3, mean_us=None, median_us=10_000.0, std_us=None, cv=0.5, mad_us=None,
                   warmup=[WarmupStep(step=first, window_us=30_000.0, ratio=3.0)],
                   outliers=[StepOutlier(step=first, window_us=30_000.0, deviation_us=20_000.0, deviation_frac=2.0, rules=["relative"],
                                         term="idle", term_delta_us=18_000.0, term_us=None, term_median_us=None, deltas_us={},
                                         warmup=True, last=False),
                             StepOutlier(step=second, window_us=5_000.0, deviation_us=-5_000.0, deviation_frac=-0.5,
                                         rules=["mad", "relative"], term="matmul", term_delta_us=-4_000.0, term_us=None,
                                         term_median_us=None, deltas_us={}, warmup=False, last=False)])
    out = piped(render, replace(a, step_stats=ss), width=400)  # one line per flagged step
    lines = [line.strip() for line in out.splitlines()]
    both = [line for line in lines if line.startswith("ProfilerStep#1:")]
    only = [line for line in lines if line.startswith("ProfilerStep#2:")]
    assert len(both) == 1 and len(only) == 1  # each flagged step once, not once per list
    assert "warm-up and outlier" in both[0] and "because it is warm-up" in both[0]
    assert "3.00× the median" in both[0] and "+20.000 ms" in both[0] and "idle moved most" in both[0]
    assert f"--exclude-step {first}" in both[0]
    assert only[0].startswith("ProfilerStep#2: outlier:") and "-5.000 ms" in only[0] and "warm-up" not in only[0]
    # the rules as step statistics apply them (its module docstring): 3 MADs and 5% of the median, or 20% of it
    assert "more than 3 median absolute deviations (and 5%) from the median and more than 20% from the median" in only[0]
    from traceflops.report.html import step_stats_section

    rows = step_stats_section(ss)
    assert "more than 3 median absolute deviations (and 5%) from the median, more than 20% from the median" in rows


def _opts():
    from traceflops.core.results import ModelOptions

    return ModelOptions(peak_tflops=1.0)


# --- a GPU trace (shared) -----------------------------------------------------


def test_gpu_trace_unknown_flops_read_as_unknown_never_zero(shared):
    path = shared / GPU
    out = cli(path, "--no-cache")
    names = [n for _, n in step_events(path)]
    assert_whole(out, names)
    phases = {r[0]: r for r in rows(out, "Matmul FLOPs by phase")}
    assert phases["forward"][2] == "—" and phases["backward"][2] == "—"  # 915 and 1750 matmuls, none with shapes
    steps = rows(out, "Steps")
    assert [r[0].removesuffix(" (last)") for r in steps] == names
    for r in steps:
        assert r[3] == "—" and r[4] == "—" and r[5] == "—" and r[6] == "—", r  # executed, recompute, MFU, HFU
    assert "HFU —" in out


def test_gpu_trace_piped_kernel_table_keeps_headers_and_numbers(shared):
    out = cli(shared / GPU, "--no-cache")
    header = next(line for line in out.splitlines() if line.startswith("┃") and "┃ kernel" in line)
    assert "bound" in header and "time (ms)" in header and "recov. (ms)" in header
    body = rows(out, "Top recoverable kernels")
    # names too long for the column: rows numbered, each whole name on a line of its own beneath the table
    legend = dict(m.groups() for m in re.finditer(r"^  (\d+)\. (.+)$", out, re.M))
    nccl = next(r for r in body if legend[r[0]].startswith("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"))
    assert nccl[3] == "—" and nccl[6] == "—"  # bound and recoverable time unknown: no FLOPs or bytes


def test_gpu_trace_on_a_narrow_terminal_never_cuts_a_number(shared):
    from traceflops.report.terminal import render
    from traceflops.run.load import analyze

    a = analyze(str(shared / GPU), _opts_gpu())
    buf = io.StringIO()
    render(a, Console(file=buf, width=80, force_terminal=True, color_system=None))
    out = buf.getvalue()
    steps, kernels = rows(out, "Steps"), rows(out, "Top recoverable kernels")
    assert [r[2] for r in steps] == [f"{w / 1e3:.3f}" for w in a.steps["window"].to_list()]
    assert len(kernels) == 8  # a name a line, cut on a terminal
    for r in steps + kernels:
        assert all("…" not in cell for cell in r[1:]), r


def _opts_gpu():
    from traceflops.core.results import ModelOptions

    return ModelOptions()


def test_gpu_trace_critical_path_shares_add_to_100_percent(shared):
    from traceflops.report.terminal import render
    from traceflops.run.load import analyze
    from traceflops.views.path_summary import path_summary

    a = analyze(str(shared / GPU), _opts_gpu())
    ps = path_summary(a)
    out = piped(render, a, critical_path=ps)
    kinds = rows(out, "What bounded the steps (critical path)")
    assert {r[0] for r in kinds} == set(ps["us"])
    assert sum(float(r[1].rstrip("%")) for r in kinds) == pytest.approx(100.0, abs=0.1)
    host = next(r for r in kinds if r[0] == "host")
    assert float(host[1].rstrip("%")) > 99  # the host thread ran the whole step: 709 ms of 1.73 s idle is host_bound
    stretches = rows(out, "Longest stretches on the path")
    assert stretches[0][0] == "between ops (Python)" and stretches[0][1] == "host"
    assert [r[0] for r in stretches] == [t["name"] for t in ps["top"]]


def test_cli_shows_what_bounded_the_steps(shared):
    out = cli(shared / GPU, "--no-cache")
    kinds = rows(out, "What bounded the steps (critical path)")
    assert len(kinds) == 8 and sum(float(r[1].rstrip("%")) for r in kinds) == pytest.approx(100.0, abs=0.1)
    assert rows(out, "Longest stretches on the path")[0][:2] == ["between ops (Python)", "host"]
    cpu = cli(NS_CKPT, "--peak-tflops", "1", "--no-cache")
    assert any(line.startswith("What bounded the steps (critical path): none:") and "CPU-only trace" in line for line in cpu.splitlines())


# --- eight ranks (shared) -----------------------------------------------------


def test_dlrm_job_warnings_group_identical_lines_across_ranks(shared):
    out = cli(shared / DLRM, "--no-cache")
    assert "None" not in out
    warns = [line for line in out.splitlines() if line.startswith("warning:")]
    assert "warning: ranks 0-7: the last step ends at its last device activity (no next step to bound it)" in warns
    assert not any(w.startswith("warning: rank 0:") for w in warns)
    assert sum("launch is not in the trace" in w for w in warns) == 1 and any(w.startswith("warning: ranks 1, 3: device activities") for w in warns)
    assert len(warns) == len(set(warns))


def test_dlrm_job_budget_chart_has_every_rank_summing_to_100_percent(shared):
    out = cli(shared / DLRM, "--no-cache")
    body = rows(out, "Where each rank's peak x time went")
    assert [r[0] for r in body] == [str(r) for r in range(8)]
    for r in body:
        shares = [float(c.rstrip("%")) for c in r[1:-1]]
        assert sum(shares) == pytest.approx(100.0, abs=0.5), r  # one decimal per term
        assert r[-1].count("c") > 0  # every rank's all-reduces were exposed


def test_job_advice_headlines_once_per_title_on_its_worst_rank(shared):
    from traceflops.api import analyze_job
    from traceflops.core.sections import RankAdvice
    from traceflops.report.jobreport import render
    from traceflops.views.job_advice import job_advice

    job = analyze_job(shared / DLRM)
    item = lambda title, share: RankAdvice(kind=None, title=title, share=share, recoverable=share, term=None)
    summaries = [replace(s, advice=[item("Communication is exposed", 0.5 if s.rank == 5 else 0.4),
                                    *([item("Idle", 0.3 if s.rank == 1 else 0.2)] if s.rank in (1, 3) else [])])
                 for s in job.summaries]
    out = piped(render, replace(job, summaries=summaries, advice=job_advice(summaries, job.stragglers, job.collectives)))
    lines = [line.strip() for line in out.splitlines()]
    head = next(i for i, line in enumerate(lines) if line.startswith("What to try on the worst ranks"))
    assert "(shares of that rank's step time at peak, biggest first)" in lines[head]
    assert lines[head + 1] == "1. Communication is exposed  50.0% on rank 5"
    assert lines[head + 2].startswith("also on ranks 0-4, 6-7: 40.0% of their step time")
    assert lines[head + 3] == "2. Idle  30.0% on rank 1"
    assert lines[head + 4].startswith("also on rank 3: 20.0% of their step time")


def test_dlrm_job_on_a_narrow_terminal_never_cuts_a_number(shared):
    from traceflops.api import analyze_job
    from traceflops.report.jobreport import render

    job = analyze_job(shared / DLRM)
    buf = io.StringIO()
    render(job, Console(file=buf, width=80, force_terminal=True, color_system=None))
    out = buf.getvalue()
    coll = rows(out, "Collectives")
    assert sorted(int(r[1]) for r in coll) == sorted(job.collectives["seq"].to_list())  # the order within the group, whole
    for r in coll + rows(out, "Ranks") + rows(out, "Where each rank's peak x time went"):
        assert all("…" not in cell for cell in r[1:]), r


def test_diff_says_a_repeated_warning_once():
    from traceflops.report.diff import render_terminal
    from traceflops.run.load import analyze
    from traceflops.views.diff import diff

    a = analyze(str(NS_CKPT), _opts())
    d = diff(a, a)
    d["warnings"] = ["peaks differ", "peaks differ", "steps differ"]
    out = piped(render_terminal, d)
    assert [line for line in out.splitlines() if line.startswith("warning:")] == ["warning: peaks differ (×2)", "warning: steps differ"]


# --- the text helpers ---------------------------------------------------------


def test_rank_sets_read_as_runs():
    from traceflops.core.fmt import counted, ranks, times

    assert ranks([3]) == "rank 3"
    assert ranks(range(8)) == "ranks 0-7"
    assert ranks([7, 1, 3, 5, 6]) == "ranks 1, 3, 5-7"
    assert counted(["a", "b", "a"]) == [("a", 2), ("b", 1)]
    assert times("a", 2) == "a (×2)" and times("b", 1) == "b"


def test_an_fp32_or_tf32_run_reads_with_its_article():
    """'an fp32 run' (eff), 'a tf32 run' (tee): the headline and the advice name the run's precision as read aloud."""
    from traceflops.core import fmt

    assert fmt.precision_words({"fp32": 0.1, "bf16": 0.05}).startswith(": an fp32 run, graded against its own peak")
    assert fmt.precision_words({"tf32": 0.1, "bf16": 0.05}).startswith(": a tf32 run, graded against its own peak")
    assert fmt.precision_words({"bf16": 0.1}) == ""  # a tensor-core precision: nothing to add


def test_a_tf32_trace_headline_says_a_tf32_run(shared):
    out = cli(shared / "kineto" / "a100_torchrec_rank3.json.gz", "--no-cache")
    assert "a tf32 run, graded against its own peak" in " ".join(out.split())
    assert "an tf32" not in out
