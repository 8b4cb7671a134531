"""The CI gate on the command line: `check` (thresholds on traces) and the lines `diff --fail-if` prints.

The rules and their verdicts are `views.gate`'s; this module parses the options, prints the verdicts and
exits with the gate's code (README, "Exit codes": 0 pass, 1 a rule failed, 5 cannot judge).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from traceflops.cli.common import model_options, options_from, run_command
from traceflops.core.fmt import printable

GATE_HELP = {
    "tolerance": "slack on every share threshold (MFU, HFU, loss terms), absolute, so a run within it passes; "
    "a fraction from 0 to 1 or a percentage (0.005 = 0.5%)",
    "min_steps": "fewest counted steps (after --exclude-step, cut steps and the unbounded last) a measure may rest on; "
    "fewer is 'cannot judge' (exit 5); a whole number from 1 to 1048576",
    "allow_unknown": "let a rule whose value the trace cannot know (MFU without a peak, FLOPs without shapes) pass "
    "as unknown instead of exiting 5 (too few steps still exits 5)",
}


# views.gate's defaults, written here so that `traceflops --help` loads no polars (a test holds them equal).
DEFAULT_TOLERANCE = 0.005
DEFAULT_MIN_STEPS = 2


def gate_options(fn):
    """--tolerance, --min-steps, --allow-unknown: how `check` and `diff --fail-if` judge."""
    for o in reversed(
        [
            click.option("--tolerance", default=str(DEFAULT_TOLERANCE), show_default=True, help=GATE_HELP["tolerance"]),
            click.option(
                "--min-steps", type=int, default=DEFAULT_MIN_STEPS, show_default=True, help=GATE_HELP["min_steps"]
            ),
            click.option("--allow-unknown", is_flag=True, help=GATE_HELP["allow_unknown"]),
        ]
    ):
        fn = o(fn)
    return fn


def gate_settings(tolerance: str, min_steps: int) -> tuple[float, int]:
    """The tolerance as a share and the step minimum, checked (an OptionsError, exit 2, otherwise)."""
    from traceflops.core.errors import OptionsError
    from traceflops.views.gate import share

    if not 1 <= min_steps <= 1 << 20:
        raise OptionsError(
            None, f"--min-steps {min_steps} is outside 1..1048576", "give a whole number of steps, 1 or more"
        )
    return share(tolerance, "--tolerance"), min_steps


_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def gate_lines(
    rules: list[dict[str, Any]], result: str, exit_code: int, allow_unknown: bool, err: bool = False
) -> None:
    """One line per rule (status, rule, why) and the verdict, as plain text."""
    for r in rules:
        where = f"{r['trace']}: " if r.get("trace") else ""
        mark = _MARK[r["status"]] + (
            " (allowed)" if r["status"] == "unknown" and r.get("cause") == "value" and allow_unknown else ""
        )
        click.echo(printable(f"{mark:<8} {where}{r['rule']}: {r['why']}"), err=err)
    words = {"pass": "gate passed", "fail": "gate failed", "unknown": "gate cannot judge"}[result]
    n_fail = sum(r["status"] == "fail" for r in rules)
    n_unknown = sum(r["status"] == "unknown" for r in rules)
    click.echo(
        printable(
            f"{words}: {len(rules) - n_fail - n_unknown} passed, {n_fail} failed, {n_unknown} unknown "
            f"(exit {exit_code})"
        ),
        err=err,
    )


@click.command("check")
@click.argument("traces", nargs=-1, required=True)
@click.option(
    "--min-mfu", metavar="SHARE", help="fail when the median MFU over the counted steps is below this (0.35 or 35%)"
)
@click.option(
    "--min-hfu", metavar="SHARE", help="fail when the median HFU over the counted steps is below this (0.35 or 35%)"
)
@click.option(
    "--max-loss",
    "max_loss",
    multiple=True,
    metavar="TERM=SHARE",
    help="fail when the median share of a loss-budget term is above this, e.g. communication_exposed=0.15 "
    "(repeat for more terms: idle, non_matmul, memcpy_exposed, recompute, ...)",
)
@gate_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "json"]),
    default="terminal",
    show_default=True,
    help="terminal: one line per rule and the verdict; json: the same as traceflops.check/1",
)
@model_options
def check_cmd(traces, min_mfu, min_hfu, max_loss, tolerance, min_steps, allow_unknown, fmt, **kw):
    """A CI gate: judge each trace against thresholds and exit 0 (pass), 1 (a rule failed) or 5 (cannot judge).

    Each measure is the median over the counted steps (those the report's totals
    count; --exclude-step leaves warm-up steps out), so one slow step does not
    decide it. Each trace of several (files, a folder, a glob) is judged on its own.
    Bad input exits 2 or 3 as every command does.
    """
    debug = kw.pop("debug")

    def go():
        from traceflops.core.errors import OptionsError
        from traceflops.run.inputs import expand_with_warnings
        from traceflops.run.load import analyze
        from traceflops.views.gate import check, check_rules

        tol, steps = gate_settings(tolerance, min_steps)
        rules = check_rules(min_mfu, min_hfu, max_loss)
        if not rules:
            raise OptionsError(None, "no rule to check", "give --min-mfu, --min-hfu or --max-loss TERM=SHARE")
        opts, cache_dir = options_from(kw)
        paths, left_out = expand_with_warnings(list(traces))
        for w in left_out:
            click.echo(printable(f"warning: {w}"), err=True)
        result = check([analyze(p, opts, cache_dir) for p in paths], rules, tol, steps, allow_unknown)
        if fmt == "json":
            from traceflops.report.diff import render_json

            click.echo(render_json(result))
        else:
            gate_lines(result["rules"], result["result"], result["exit_code"], allow_unknown)
        return result["exit_code"]

    sys.exit(run_command(debug, go))
