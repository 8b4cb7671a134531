"""Options and error handling shared by the click commands."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import rich.progress

    from traceflops.core.model_options import ModelOptions

from traceflops.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PIPE_CLOSED,
    EXIT_TERMINATED,
    InputError,
    Terminated,
    TraceflopsError,
)
from traceflops.core.files import same_file
from traceflops.core.fmt import printable


def run_command(debug: bool, fn):
    """`fn()`, with any error as one line on stderr and its exit code (a traceback only with --debug).

    The line is `printable`: a file name or a trace string in it cannot send escape sequences to the terminal.
    Ctrl-C and SIGTERM stop it the same way: what is half written is removed, one line says so, and the exit
    code is the shell's 128 + the signal. A reader of standard output that stopped reading (`| head`) ends it
    quietly with exit code 1, as the terminal report's console does.
    """
    try:
        with _sigterm_raises():
            return fn()
    except TraceflopsError as e:
        if debug:
            raise
        click.echo(printable(e.line()), err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("traceflops: interrupted (Ctrl-C)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Terminated:
        click.echo("traceflops: terminated (SIGTERM)", err=True)
        sys.exit(EXIT_TERMINATED)
    except (click.ClickException, click.exceptions.Exit):
        raise
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_closed():  # not a pipe to one of this package's workers
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
            sys.exit(EXIT_PIPE_CLOSED)
        if debug:
            raise
        click.echo(
            printable(f"internal error: {type(e).__name__}: {e}; rerun with --debug and report it with the traceback"),
            err=True,
        )
        sys.exit(EXIT_INTERNAL)


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated while `fn` runs (the main thread only: where Python can take a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _stdout_closed() -> bool:
    """Standard output is a pipe whose reader has gone (where the system can say: `poll`)."""
    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in p.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no file behind stdout
        return False


def _terminated(signum, frame):
    raise Terminated()


def refuse_overwrite(inputs, **outputs) -> None:
    """An output (by option name) that is one of the input files, however spelled or linked, is refused before any
    work."""
    for option, out in outputs.items():
        for path in [out] if isinstance(out, (str, Path)) else (out or []):
            hit = next((i for i in inputs if same_file(path, i)), None)
            if hit is not None:
                raise InputError(
                    str(path),
                    f"{option} is the input {hit}",
                    f"write {option} to another file; the input is never overwritten",
                )


def model_options(fn):
    """The model, hardware and step options shared by the commands that analyse traces."""
    opts = [
        click.option(
            "--params",
            type=float,
            help="matmul parameters N (weights used per token; no embeddings, norms, biases); a finite number from 1 "
            "to 1e+15",
        ),
        click.option("--layers", type=int, help="transformer layers L; a whole number from 1 to 1048576"),
        click.option("--heads", type=int, help="attention heads H; a whole number from 1 to 1048576"),
        click.option("--head-dim", type=int, help="head dimension Q; a whole number from 1 to 1048576"),
        click.option("--seq-len", type=int, help="sequence length T; a whole number from 1 to 1073741824"),
        click.option(
            "--model-config", type=click.Path(exists=True, dir_okay=False), help="Hugging Face style config.json"
        ),
        click.option(
            "--tokens-per-step", type=float, help="global tokens per step (all ranks); a finite number from 1 to 1e+15"
        ),
        click.option(
            "--world-size",
            type=int,
            help="ranks in the job, when the trace does not say; a whole number from 1 to 16777216",
        ),
        click.option("--mode", type=click.Choice(["training", "inference"]), help="override the detected mode"),
        click.option("--hardware", help="hardware name from the table (e.g. h100-sxm, a100, tpu-v4)"),
        click.option(
            "--precision",
            type=click.Choice(["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]),
            help="the precision whose dense peak MFU is measured against (default: the dtype carrying the most matmul "
            "FLOPs)",
        ),
        click.option(
            "--peak-tflops",
            type=float,
            help="dense peak TFLOP/s per device (required for CPUs); a finite number from 1e-06 to 1e+07",
        ),
        click.option(
            "--exclude-step",
            "exclude_steps",
            type=int,
            multiple=True,
            help="leave step N out of the totals (e.g. warm-up)",
        ),
        click.option(
            "--keep-last-step",
            is_flag=True,
            help="count the last step in the totals (left out by default when other steps are there: it ends at "
            "its last device activity, without the time up to a next step)",
        ),
        click.option(
            "--graph-capture",
            "graph_captures",
            type=click.Path(exists=True),
            multiple=True,
            help="a trace (or folder of traces) that recorded the CUDA/HIP graphs this trace replays; "
            "default: capture_traces/ beside the trace, as vLLM and SGLang write it",
        ),
        click.option(
            "--group-role",
            "group_roles",
            multiple=True,
            metavar="GROUP=ROLE",
            help="what a process group is for, where its description does not say (e.g. default_pg=tp): the "
            "group's description or name, and dp, tp, pp, ep, cp or a word of your own",
        ),
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            help="where parsed traces are cached (default: the user cache)",
        ),
        click.option("--no-cache", is_flag=True, help="parse again; do not read or write the cache"),
        click.option("--quiet", is_flag=True, help="no progress bar"),
        click.option("--debug", is_flag=True, help="show tracebacks"),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


class Progress:
    """On stderr, a terminal only (never with --quiet, never in what stdout carries): a bar while a big file is read,
    the analysis stage running after it, and ranks done of all for a job."""

    def __init__(self, quiet: bool):
        self.on = not quiet and sys.stderr.isatty()
        self.bar: rich.progress.Progress | None = None  # (imported when a big file is read)
        self.big = False  # a big file: its stages are worth saying too
        self.at_once = 1  # a job's ranks analysed at a time

    def _console(self):
        from rich.console import Console

        return Console(stderr=True)

    def stage(self, name: str) -> None:
        """The analysis stage that starts now, on one line that the next overwrites (a big file's, or a job's)."""
        if self.on and self.big:
            sys.stderr.write(f"\r\x1b[2Kanalysing: {name}")
            sys.stderr.flush()

    def done(self) -> None:
        """The analysis is over: its stage line is cleared before the report prints."""
        if self.on and self.big:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()

    def ranks(self, done: int, total: int) -> None:
        """Ranks summarised so far, of all."""
        if not self.on or total < 2:
            return
        at_once = f", {self.at_once} at a time" if self.at_once > 1 else ""
        sys.stderr.write(f"\r\x1b[2Kranks: {done}/{total}{at_once}")
        if done >= total:
            sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()

    def __call__(self, done: int, total: int) -> None:
        if not self.on or total < (64 << 20):
            return
        self.big = True
        if self.bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                "reading",
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("read", total=total)
        self.bar.update(self.task, completed=done)
        if done >= total:
            self.bar.stop()


def start_decode_helper(traces, no_cache: bool) -> None:
    """One large trace's decode helper, started before this process's imports so the two import side by side.

    Only without a cache: a kept report may need no parse at all, and its check
    reads the whole file first (the helper then starts with the parse). Only for
    a Kineto trace: the XLA parser takes no helper, and an idle one held ~60 MB to the end.
    """
    if len(traces) == 1 and no_cache:
        from traceflops.core.errors import TraceflopsError
        from traceflops.parsers import detect_format
        from traceflops.parsers.helper_start import start_early

        try:
            if detect_format(traces[0]) == "kineto":
                start_early(traces[0])
        except TraceflopsError:
            pass  # not a trace this can tell: the parse says why, in its own words


def options_from(kw) -> tuple:
    """ModelOptions and cache dir from the shared options (removed from kw)."""
    return model_options_from(kw), cache_dir_from(kw)


# The shared options that describe the model and the hardware (`model_options`), as click names them.
MODEL_OPTION_NAMES = (
    "params",
    "layers",
    "heads",
    "head_dim",
    "seq_len",
    "model_config",
    "tokens_per_step",
    "world_size",
    "mode",
    "hardware",
    "precision",
    "peak_tflops",
    "exclude_steps",
    "graph_captures",
    "keep_last_step",
    "group_roles",
)


def model_options_from(kw) -> ModelOptions:
    """ModelOptions from the shared options (removed from kw), checked; loads no polars (`core.model_options`)."""
    from traceflops.run.options import model_options as build

    return build(**{k: kw.pop(k) for k in MODEL_OPTION_NAMES})


def cache_dir_from(kw) -> Path | None:
    """The parsed-trace cache's folder from the shared options (removed from kw): None without a cache."""
    cache_dir, no_cache = kw.pop("cache_dir"), kw.pop("no_cache")
    kw.pop("quiet", None)
    if no_cache:
        return None
    if cache_dir:
        return Path(cache_dir)
    from traceflops.storage.trace_cache import default_dir

    try:
        return default_dir()
    except (RuntimeError, KeyError, OSError):
        # No HOME and no passwd entry for this user id (a container's arbitrary uid): nowhere to keep a cache.
        click.echo(
            "warning: no home folder to keep the cache in (HOME is unset); running without a cache: "
            "set HOME, XDG_CACHE_HOME or TRACEFLOPS_CACHE_DIR, or give --cache-dir",
            err=True,
        )
        return None
