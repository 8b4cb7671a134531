"""The commands `analyze`, `summarize`, `merge` and `mfu`: they wire `run` to the renderers and hold no logic of their
own."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import replace

import click

from traceflops.core.fmt import printable
from traceflops.core.memory import prefer_one_thread, prefer_prompt_release, prefer_release_at_once

prefer_prompt_release()  # before anything loads polars

# The imports below stay after that call: it must run before polars loads.
from traceflops.cli.check import check_cmd  # noqa: E402
from traceflops.cli.common import (  # noqa: E402
    Progress,
    model_options,
    options_from,
    refuse_overwrite,
    run_command,
    start_decode_helper,
)
from traceflops.cli.reports import annotate_cmd, diff_cmd, write_extras  # noqa: E402
from traceflops.run.parallelism import AUTO, check_job_numbers, jobs_for  # noqa: E402  (light: no polars)


class _Jobs(click.ParamType):
    """`--jobs`: `auto` or a whole number (its range is checked as the API checks it: `check_job_numbers`)."""

    name = "auto|N"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == AUTO:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither {AUTO} nor a whole number", param, ctx)


@click.group()
@click.version_option(package_name="traceflops")
def main():
    """traceflops: MFU, HFU, recompute and where the time went, from profiler traces."""


def run() -> None:
    """The `traceflops` script: `main` as click runs it, then the process ends without the interpreter's teardown
    (`core.process_exit.leave`: the same exit status and output, 40-110 ms sooner)."""
    from traceflops.core.process_exit import leave

    try:
        main()
    except SystemExit as e:
        leave(e.code)
    leave(0)


@main.command()
@click.argument("traces", nargs=-1, required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "json"]),
    default="terminal",
    show_default=True,
    help="terminal: the report; json: the report contract (schema traceflops.report/1)",
)
@model_options
@click.option(
    "--jobs",
    type=_Jobs(),
    default=AUTO,
    show_default=True,
    help="ranks analysed at once, each in a process of its own: auto takes a process per usable core (a container's "
    "CPU quota counts), no more than the available memory holds at the largest rank's estimated peak; or a whole "
    "number from 1 to 1024",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="where ranks are summarised",
)
@click.option("--ray-address", help="Ray cluster address for --executor ray (default: start or join a local one)")
@click.option(
    "--pipeline-stages",
    type=int,
    help="pipeline stages p, for the ideal bubble (p-1)/(m+p-1); a whole number from 1 to 1048576",
)
@click.option(
    "--microbatches", type=int, help="microbatches m per step, for the ideal bubble; a whole number from 1 to 1048576"
)
@click.option(
    "--html", "html_out", type=click.Path(dir_okay=False), help="also write the self-contained HTML report here"
)
@click.option(
    "--tables", "tables_dir", type=click.Path(file_okay=False), help="also write the tables (parquet and CSV) here"
)
def analyze(traces, fmt, jobs, executor, ray_address, pipeline_stages, microbatches, html_out, tables_dir, **kw):
    """Analyse traces: matmul FLOPs by phase, MFU and HFU, where the time went.

    One file gives the single-device view; several files, a directory or a glob
    give the job view across ranks.
    """
    debug = kw.pop("debug")
    progress = Progress(kw.get("quiet", False))

    def go():
        # the options first: a wrong value is the error given, not what the inputs turn out to be
        check_job_numbers(jobs, pipeline_stages=pipeline_stages, microbatches=microbatches)
        start_decode_helper(traces, bool(kw.get("no_cache")))
        from traceflops.run.inputs import expand_with_warnings

        paths, left_out = expand_with_warnings(list(traces))
        at_once = jobs_for(jobs, paths, local=executor == "local")
        progress.at_once = at_once
        if len(paths) > 1 and executor == "local" and at_once > 1:
            prefer_one_thread()  # before polars loads: this process analyses ranks beside its workers
            prefer_release_at_once()  # as they do: each rank's freed pages gone before the next rank's parse
        from traceflops.cli.reports import refuse_extras_over
        from traceflops.run.load import analyze as run_analysis

        opts, cache_dir = options_from(kw)
        refuse_extras_over(paths, html_out, tables_dir)
        if len(paths) > 1:
            from traceflops.run.ranks import summarize_all

            summaries = summarize_all(
                paths,
                opts,
                at_once,
                executor=executor,
                ray_address=ray_address,
                cache_dir=cache_dir,
                skipped=left_out,
                on_done=progress.ranks,
            )
            return _job(summaries, opts, fmt, pipeline_stages, microbatches, html_out, tables_dir, left_out)
        a = _cached_report(paths[0], opts, cache_dir) if not (html_out or tables_dir) else None
        if a is None:
            try:
                a = run_analysis(paths[0], opts, cache_dir, progress)
            finally:
                progress.done()  # an error's line starts on a clean line too
            _store_report(paths[0], opts, cache_dir, a)
        if left_out:
            a = replace(a, warnings=[*left_out, *a.warnings])
        from traceflops.report import formats

        if fmt == "json":
            # In pieces: a report of 200 000 steps is hundreds of MB of text. Bytes where stdout has them (a terminal, a
            # file, a pipe), else text (a stream without bytes, such as a StringIO).
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", None)
            write = out.write if out is not None else (lambda piece: sys.stdout.write(bytes(piece).decode()))
            for piece in formats.chunks(a):
                write(piece)
            write(b"\n")
            (out or sys.stdout).flush()
        else:
            formats.show(a)
        write_extras(a, html_out, tables_dir)

    run_command(debug, go)


def _cached_report(path, opts, cache_dir):
    """The same command on the same trace again: render what was kept, skip parse and analysis."""
    import os

    if cache_dir is None or not os.path.isfile(path):
        return None
    from traceflops.storage import report_cache

    return report_cache.load_report(path, opts, cache_dir)


def _store_report(path, opts, cache_dir, a):
    import os

    if cache_dir is None or not os.path.isfile(path):
        return
    from traceflops.storage import report_cache

    # the parsed-tables cache already says why a cache cannot be written, in warnings
    with contextlib.suppress(OSError):
        report_cache.store_report(path, opts, a, cache_dir)


def _job(summaries, opts, fmt, pipeline_stages, microbatches, html_out=None, tables_dir=None, input_warnings=()):
    from traceflops.report import formats
    from traceflops.views.job import job_with_options

    job = job_with_options(summaries, opts, pipeline_stages, microbatches, input_warnings)
    if fmt == "json":
        click.echo(formats.render(job, "json"))
    else:
        formats.show(job)
    write_extras(job, html_out, tables_dir)


@main.command()
@click.argument("trace")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="the summary file to write (.tfsum)"
)
@model_options
def summarize(trace, output, **kw):
    """Summarise one rank's trace into the small tables the job view needs.

    Run it anywhere (a cluster's own scheduler), then `traceflops merge *.tfsum`.
    """
    debug = kw.pop("debug")

    def go():
        from traceflops.core.errors import InputError
        from traceflops.run.inputs import expand
        from traceflops.run.load import analyze as run_analysis
        from traceflops.storage.summary import write_summary
        from traceflops.views.job import summarize as make_summary

        opts, cache_dir = options_from(kw)
        (trace_file,) = expand([trace])  # a regular file (never a FIFO or a device), or one clear error
        refuse_overwrite([trace_file], **{"-o": output})
        summary = make_summary(run_analysis(trace_file, opts, cache_dir))
        try:
            write_summary(summary, output)
        except OSError as e:
            raise InputError(
                output, f"cannot write ({e.strerror or e})", "check the directory exists and is writable"
            ) from None
        counted = (summary.totals.get("step_count") or {}).get("counted", summary.steps.height)
        rank = "no rank recorded" if summary.rank is None else f"rank {summary.rank}"
        click.echo(
            printable(
                f"wrote {output}: {rank}, {summary.steps.height} steps ({counted} counted); "
                f"merge it with the other ranks': traceflops merge *.tfsum"
            ),
            err=True,
        )

    run_command(debug, go)


@main.command()
@click.argument("summaries", nargs=-1, required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "json"]),
    default="terminal",
    show_default=True,
    help="terminal: the job report; json: the report contract (schema traceflops.report/1)",
)
@click.option(
    "--world-size", type=int, help="ranks in the job, when the summaries do not say; a whole number from 1 to 16777216"
)
@click.option(
    "--exclude-step",
    "exclude_steps",
    type=int,
    multiple=True,
    help="leave step N out of the job's totals (e.g. warm-up); repeatable",
)
@click.option(
    "--pipeline-stages",
    type=int,
    help="pipeline stages p, for the ideal bubble (p-1)/(m+p-1); a whole number from 1 to 1048576",
)
@click.option(
    "--microbatches", type=int, help="microbatches m per step, for the ideal bubble; a whole number from 1 to 1048576"
)
@click.option("--debug", is_flag=True, help="show tracebacks")
def merge(summaries, fmt, world_size, exclude_steps, pipeline_stages, microbatches, debug):
    """Merge per-rank summaries into the job report (the same as analysing all ranks at once)."""
    from traceflops.core.results import ModelOptions

    def go():
        from traceflops.run.inputs import expand_with_warnings
        from traceflops.run.options import check_numbers
        from traceflops.storage.summary import read_summary

        check_numbers(world_size=world_size, pipeline_stages=pipeline_stages, microbatches=microbatches)
        paths, left_out = expand_with_warnings(list(summaries))
        opts = ModelOptions(world_size=world_size, exclude_steps=tuple(exclude_steps))
        _job([read_summary(p) for p in paths], opts, fmt, pipeline_stages, microbatches, input_warnings=left_out)

    run_command(debug, go)


@main.command()
@click.option(
    "--tokens-per-second",
    type=float,
    required=True,
    help="global training throughput; a finite number from 1e-06 to 1e+15",
)
@click.option("--params", type=float, required=True, help="matmul parameters N; a finite number from 1 to 1e+15")
@click.option("--layers", type=int, required=True, help="transformer layers L; a whole number from 1 to 1048576")
@click.option("--heads", type=int, required=True, help="attention heads H; a whole number from 1 to 1048576")
@click.option("--head-dim", type=int, required=True, help="head dimension Q; a whole number from 1 to 1048576")
@click.option("--seq-len", type=int, required=True, help="sequence length T; a whole number from 1 to 1073741824")
@click.option(
    "--devices",
    type=int,
    default=1,
    show_default=True,
    help="devices the throughput ran on; a whole number from 1 to 16777216",
)
@click.option(
    "--hardware",
    help="hardware name from the table (e.g. h100-sxm, a100, tpu-v4), for its dense peak; or give --peak-tflops",
)
@click.option(
    "--precision",
    default="bf16",
    show_default=True,
    help="the precision whose dense peak --hardware gives (fp64, fp32, tf32, bf16, fp16, fp8, int8)",
)
@click.option("--peak-tflops", type=float, help="dense peak TFLOP/s per device; a finite number from 1e-06 to 1e+07")
@click.option(
    "--mode",
    type=click.Choice(["training", "inference"]),
    default="training",
    show_default=True,
    help="training: 6N + 12LHQT FLOPs per token; inference: 2N + 4LHQT",
)
@click.option(
    "--executed-flops-per-token",
    type=float,
    help="all FLOPs executed per token (recompute included), for HFU; a finite number from 1 to 1e+21",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["terminal", "json"]),
    default="terminal",
    show_default=True,
    help="terminal: a few lines; json: the numbers as one object",
)
def mfu(
    tokens_per_second,
    params,
    layers,
    heads,
    head_dim,
    seq_len,
    devices,
    hardware,
    precision,
    peak_tflops,
    mode,
    executed_flops_per_token,
    fmt,
):
    """MFU (and HFU) from a throughput alone, as the PaLM paper computes it."""
    from traceflops.run.options import check_numbers

    run_command(
        False,
        lambda: check_numbers(
            tokens_per_second=tokens_per_second,
            params=params,
            layers=layers,
            heads=heads,
            head_dim=head_dim,
            seq_len=seq_len,
            devices=devices,
            peak_tflops=peak_tflops,
            executed_flops_per_token=executed_flops_per_token,
        ),
    )
    _mfu(
        tokens_per_second,
        params,
        layers,
        heads,
        head_dim,
        seq_len,
        devices,
        hardware,
        precision,
        peak_tflops,
        mode,
        executed_flops_per_token,
        fmt,
    )


def _mfu(
    tokens_per_second,
    params,
    layers,
    heads,
    head_dim,
    seq_len,
    devices,
    hardware,
    precision,
    peak_tflops,
    mode,
    executed_flops_per_token,
    fmt,
):
    from traceflops.core import hardware as hw
    from traceflops.flops import model as mf

    if peak_tflops:
        peak, hw_name = peak_tflops * 1e12, "custom"
    elif hardware:
        h = hw.lookup(hardware)
        if h is None:
            raise click.BadParameter(
                f"unknown hardware '{hardware}'; known: {', '.join(sorted(hw.HARDWARE))}", param_hint="--hardware"
            )
        peak, hw_name = h.peak(precision), h.name
        if peak is None:
            raise click.BadParameter(f"{h.name} has no dense {precision} peak", param_hint="--precision")
    else:
        raise click.UsageError("give --peak-tflops or --hardware")
    spec = mf.spec_from_flags(int(params), layers, heads, head_dim, seq_len)
    m = mf.model_flops(spec, mode, None)
    out = {
        "hardware": hw_name,
        "precision": precision,
        "peak_flops": peak,
        "devices": devices,
        "mode": mode,
        "flops_per_token": m.per_token,
        "flops_per_token_no_attention": m.per_token_no_attention,
        "mfu": mf.mfu(tokens_per_second, m.per_token, devices, peak),
        "mfu_no_attention": mf.mfu(tokens_per_second, m.per_token_no_attention, devices, peak),
        "hfu": None
        if executed_flops_per_token is None
        else mf.mfu(tokens_per_second, executed_flops_per_token, devices, peak),
    }
    out["band"] = mf.verdict_band(out["mfu"]) if mode == "training" else None
    out["band_caveat"] = mf.BAND_CAVEAT
    if fmt == "json":
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"MFU {out['mfu']:.1%} (without attention {out['mfu_no_attention']:.1%})")
    if out["hfu"] is not None:
        click.echo(f"HFU {out['hfu']:.1%}")
    click.echo(f"peak: {hw_name}, dense {precision}, {peak / 1e12:g} TFLOP/s x {devices} devices")
    if out["band"]:
        click.echo(f"band: {out['band']} ({mf.BAND_CAVEAT})")


main.add_command(annotate_cmd)
main.add_command(diff_cmd)
main.add_command(check_cmd)

if __name__ == "__main__":  # pragma: no cover
    main()
