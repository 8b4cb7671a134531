"""Report commands for the command line: `annotate`, `diff`, and analyze's `--html` / `--tables`.

Registered by `cli.py`:

    from .cli_reports import annotate_cmd, diff_cmd
    main.add_command(annotate_cmd)
    main.add_command(diff_cmd)

and `analyze` calls `write_extras(result, html, tables)` for one trace or a job. Errors are one line with the
README's exit codes (`cli.run_command`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from traceflops.cli.check import gate_lines, gate_options, gate_settings
from traceflops.cli.common import (
    cache_dir_from,
    model_options,
    model_options_from,
    options_from,
    refuse_overwrite,
    run_command,
)
from traceflops.core.errors import InputError
from traceflops.core.fmt import printable


def _opts(kw: dict):
    """(ModelOptions, cache dir, debug) from the shared options, parsed inside `run_command`."""
    debug = kw.pop("debug")
    kw.pop("quiet", None)
    return kw, debug


def _write_text(path: str, text: str) -> None:
    """Every text file a command writes: the one writer (atomic; a failed write is exit 2 naming the path)."""
    from traceflops.core.files import write_text

    write_text(path, text)


def refuse_extras_over(inputs, html: str | None = None, tables: str | None = None) -> None:
    """analyze's `--html` file and `--tables` files checked against the input traces, before any analysis."""
    from traceflops.report.tables import table_files

    refuse_overwrite(inputs, **{"--html": html, "--tables": table_files(tables) if tables else None})
    if html:  # a missing folder is made when the report is written (as --tables, summarize -o make theirs)
        folder = next(p for p in (Path(html).absolute().parent, *Path(html).absolute().parents) if p.exists())
        if not folder.is_dir():
            raise InputError(html, f"--html's folder {folder} is not a folder", "write the report elsewhere")
        if not os.access(folder, os.W_OK):
            raise InputError(html, f"--html's folder {folder} is not writable", "write the report elsewhere")


def _write_tables(fn, what, directory: str) -> dict:
    """The tables' files go through the one writer; this catches what comes before them (the folder made)."""
    try:
        return fn(what, directory)
    except OSError as e:
        raise InputError(
            directory, f"cannot write tables ({e.strerror or e})", "check the directory is writable"
        ) from None


def write_extras(result, html: str | None = None, tables: str | None = None) -> None:
    """`analyze --html PATH --tables DIR` for one trace (an Analysis) or many ranks (a Job).

    Says what it wrote on stderr, so stdout stays the report.
    """
    if html:
        from traceflops.report.formats import render

        page = render(result, "html")
        try:
            Path(html).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(
                html, f"cannot make its folder ({e.strerror or e})", "check the directory is writable"
            ) from None
        _write_text(html, page)
        click.echo(printable(f"wrote {html}"), err=True)
    if tables:
        from traceflops.core.results import Job
        from traceflops.report.tables import write_job_tables, write_tables

        done = _write_tables(write_job_tables if isinstance(result, Job) else write_tables, result, tables)
        click.echo(printable(f"wrote {len(done)} tables (parquet and csv) to {tables}"), err=True)


@click.command("annotate")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="annotated trace to write (gzipped unless it ends in .json; '-': plain JSON to standard output)",
)
@model_options
def annotate_cmd(trace, output, **kw):
    """Write TRACE back with phases, FLOPs and counters, for Perfetto or chrome://tracing.

    Input events are kept (one left out, such as a metadata entry that does
    not decode, is counted in the warnings); device kernels (and ops) gain `traceflops.*`
    args; a new `traceflops` process holds per-phase tracks, step windows and
    counters (achieved TFLOP/s, MFU and HFU per step). Secrets in the trace
    (environment variables, tokens, keys, passwords: in metadata, event names
    and args) are redacted. `-o -` writes plain JSON to standard output.
    """
    kw, debug = _opts(kw)

    def go():
        from contextlib import ExitStack

        from traceflops.core.limits import usable_cores
        from traceflops.core.memory import prefer_threads
        from traceflops.export.perfetto.reader_start import reads_beside, start_reading

        beside_wanted = reads_beside(trace)
        if beside_wanted:  # before polars loads: the reader has a core to itself, polars here the others
            prefer_threads(usable_cores() - 1)
        refuse_overwrite([trace], **({} if output == "-" else {"-o": output}))  # "-": standard output
        opts = model_options_from(kw)  # checked before a reader starts (and without polars: it has not loaded yet)
        with ExitStack() as held:
            # A Kineto trace is read for writing back in a worker process while it is analysed here; started before
            # this process loads polars and the analysis, so the worker's own start overlaps that.
            beside = start_reading(trace, output) if beside_wanted else None
            if beside is not None:
                held.enter_context(beside)
            # Freed pages go back after polars' prompt decay (`prefer_prompt_release`), not at once: on the 476 MB
            # trace at once faulted 2.9 M pages against 0.9 M, 21-23 s against 16.7 s, for a peak 4-6 MiB (1%) lower.
            from traceflops.core.memory import return_freed_memory
            from traceflops.export.perfetto import annotate, for_annotation
            from traceflops.run.load import analyze
            from traceflops.views.rollup import launching_rows, module_of

            cache_dir = cache_dir_from(kw)
            # Without the views built from the tables (advice and the like: none is written back), and the rest of
            # the analysis let go before the trace is streamed through.
            a = for_annotation(analyze(trace, opts, cache_dir, views=False))
            return_freed_memory()
            kineto = a.meta.get("format") != "xplane"  # an XLA profile's annotation names no modules
            modules = module_of(a.ops, launching_rows(a.kernels)) if kineto and a.kernels.height else None
            s = annotate(trace, a, output, modules, beside if kineto else None)
        click.echo(
            printable(
                f"wrote {'standard output' if output == '-' else output}: {s['events_in']} events kept, "
                f"{s['kernels_annotated']} kernels and {s['ops_annotated']} ops annotated, "
                f"{s['events_added']} events added, {s['redacted_values']} values redacted"
            ),
            err=True,
        )

    run_command(debug, go)


@click.command("diff")
@click.argument("before", type=click.Path(dir_okay=False))
@click.argument("after", type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "json", "html"]),
    default="terminal",
    show_default=True,
    help="terminal: tables; json: traceflops.diff/1 (with `gate` under --fail-if); html: a self-contained page",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the report here instead of stdout")
@click.option(
    "--fail-if",
    "fail_if",
    multiple=True,
    metavar="RULE",
    help="a CI gate on the change, repeatable: mfu-drop>2% (relative to before), hfu-drop>1pp (percentage "
    "points), step-time-rise>5% (or >3ms), loss-rise:TERM>0.03 (a share); exits 1 when one holds, 5 when "
    "one cannot be judged",
)
@gate_options
@model_options
def diff_cmd(before, after, fmt, output, fail_if, tolerance, min_steps, allow_unknown, **kw):
    """What moved from BEFORE to AFTER: MFU/HFU, loss-budget terms, kernels and modules.

    Both traces are analysed with the same options. With --fail-if it is also a
    CI gate: each rule is judged on the medians over each side's counted steps,
    and the exit code is 0 (pass), 1 (a rule failed) or 5 (cannot judge).
    """
    kw, debug = _opts(kw)

    def go():
        from traceflops.report import formats
        from traceflops.run.load import analyze
        from traceflops.views.diff import diff
        from traceflops.views.gate import diff_gate, parse_diff_rule

        rules = [parse_diff_rule(r) for r in fail_if]  # a bad rule is exit 2 before any analysis
        tol, steps = gate_settings(tolerance, min_steps)
        opts, cache_dir = options_from(kw)
        refuse_overwrite([before, after], **{"-o": output})
        a, b = analyze(before, opts, cache_dir), analyze(after, opts, cache_dir)
        d = diff(a, b)
        gate = diff_gate(a, b, rules, tol, steps, allow_unknown) if rules else None
        if gate is not None:
            d["gate"] = gate
        if fmt == "terminal" and not output:
            formats.show(d)
            if gate is not None:
                gate_lines(gate["rules"], gate["result"], gate["exit_code"], allow_unknown)
            return gate["exit_code"] if gate else 0
        text = formats.render(d, fmt)
        if output:
            _write_text(output, text)
            click.echo(printable(f"wrote {output}"), err=True)
        else:
            click.echo(text)
        if gate is not None and (fmt != "json" or output):  # the report went elsewhere: the verdict on stderr
            gate_lines(gate["rules"], gate["result"], gate["exit_code"], allow_unknown, err=True)
        return gate["exit_code"] if gate else 0

    sys.exit(run_command(debug, go))
