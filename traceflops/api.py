"""Notebook API: one call to analyse a trace, and helpers to look at the result.

    import traceflops.api as tf
    a = tf.analyze("trace.json.gz", model_config="config.json", tokens_per_step=524288)
    a.totals.mfu, a.totals.loss_budget
    tf.to_html(a)              # the HTML report as a string (IPython: display(HTML(...)))
    tf.save_html(a, "r.html")
    frames = tf.to_pandas(a)   # Frames: frames.kernels, frames["steps"], ...; needs pandas
    tf.diff("before.json.gz", "after.json.gz")   # what moved, as `traceflops diff --format json` gives it

The keyword arguments are the command line's options (`traceflops analyze
--help`), with the same meaning and the same numbers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from traceflops.core.results import Analysis
from traceflops.run.load import analyze as _analyze
from traceflops.run.options import model_options as options
from traceflops.run.options import model_spec  # noqa: F401 - part of the notebook API


def analyze(
    path: str | os.PathLike,
    *,
    params: float | None = None,
    layers: int | None = None,
    heads: int | None = None,
    head_dim: int | None = None,
    seq_len: int | None = None,
    model_config: str | os.PathLike | dict | None = None,
    tokens_per_step: float | None = None,
    hardware: str | None = None,
    precision: str | None = None,
    peak_tflops: float | None = None,
    world_size: int | None = None,
    mode: str | None = None,
    exclude_steps: tuple[int, ...] = (),
    graph_captures: tuple[str | os.PathLike, ...] = (),
    keep_last_step: bool = False,
    group_roles: tuple[str, ...] = (),
) -> Analysis:
    """Analyse one trace (Kineto JSON or XLA xplane.pb) as `traceflops analyze PATH` does (`graph_captures`:
    `--graph-capture`; `group_roles`: `--group-role`, "GROUP=ROLE" each)."""
    opts = options(
        params=params,
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        seq_len=seq_len,
        model_config=model_config,
        tokens_per_step=tokens_per_step,
        hardware=hardware,
        precision=precision,
        peak_tflops=peak_tflops,
        world_size=world_size,
        mode=mode,
        exclude_steps=exclude_steps,
        graph_captures=graph_captures,
        keep_last_step=keep_last_step,
        group_roles=group_roles,
    )
    return _analyze(str(path), opts)


def analyze_job(
    paths,
    *,
    jobs: int | str = "auto",
    pipeline_stages: int | None = None,
    microbatches: int | None = None,
    **model: Any,
):
    """Analyse many ranks (paths, a directory or a glob) into a `Job`, as `traceflops analyze A B ...` does; `jobs`
    is how many at once, each in a process of its own ("auto": as the command's `--jobs auto` decides)."""
    from traceflops.run.inputs import expand_with_warnings
    from traceflops.run.parallelism import check_job_numbers, jobs_for
    from traceflops.run.ranks import summarize_all
    from traceflops.views.job import job_with_options

    check_job_numbers(jobs, pipeline_stages=pipeline_stages, microbatches=microbatches)
    opts = options(**model)
    files, left_out = expand_with_warnings(
        [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    )
    summaries = summarize_all(files, opts, jobs_for(jobs, files), skipped=left_out)
    return job_with_options(summaries, opts, pipeline_stages, microbatches, left_out)


def diff(before, after, **model: Any) -> dict[str, Any]:
    """What moved from `before` to `after` (each a path or an `Analysis`), as `traceflops diff --format json` gives it
    (`schema: traceflops.diff/1`); paths are analysed with the same keywords as `analyze`."""
    from traceflops.views.diff import diff as compare

    a, b = (x if isinstance(x, Analysis) else analyze(x, **model) for x in (before, after))
    return compare(a, b)


class Frames(dict):
    """Tables by name (a dict), each also an attribute: `frames.kernels` is `frames["kernels"]`."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no table {name!r}; the tables: {', '.join(self)}") from None

    def __dir__(self):
        return sorted({*super().__dir__(), *self})

    def __repr__(self) -> str:
        shown = ", ".join(f"{k} ({getattr(v, 'shape', ('?',))[0]} rows)" for k, v in self.items())
        return f"<traceflops.Frames: {shown}>"


def to_dict(a: Analysis) -> dict[str, Any]:
    """The JSON report (`schema: traceflops.report/1`) as a dict."""
    from traceflops.report.jsonreport import to_dict as report

    return report(a)


def to_html(a) -> str:
    """The self-contained HTML report of an `Analysis` (or a `Job`)."""
    from traceflops.report.formats import render

    return render(a, "html")


def save_html(a, path: str | os.PathLike) -> str:
    from traceflops.core.files import write_text

    p = Path(path)
    write_text(p, to_html(a))
    return str(p)


def to_polars(a) -> Frames:
    """Every table of the analysis (or job) as polars frames, by name (`Frames`: a dict, names as attributes too)."""
    from traceflops.core.results import Job
    from traceflops.report.tables import frames, job_frames

    return Frames(job_frames(a) if isinstance(a, Job) else frames(a))


def to_pandas(a) -> Frames:
    """Every table as pandas frames, by name (`Frames`: a dict, names as attributes too: `to_pandas(a).kernels`);
    pandas is optional: `pip install pandas`.

    Built column by column from numpy, so pyarrow is not needed; list
    columns become object columns of lists, a step's loss budget a dict.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "to_pandas needs pandas, which traceflops does not install: pip install pandas (or use to_polars)"
        ) from None
    out = Frames()
    for name, df in to_polars(a).items():
        cols = {}
        for c, dtype in df.schema.items():
            s = df[c]
            if dtype.is_numeric() or dtype.is_temporal() or dtype == _bool():
                cols[c] = s.to_numpy()
            else:
                cols[c] = pd.Series(s.to_list(), dtype=object)
        out[name] = pd.DataFrame(cols, index=pd.RangeIndex(df.height))
    return out


def _bool():
    import polars as pl

    return pl.Boolean
