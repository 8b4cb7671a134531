"""Notebook API: one call to analyse a trace, and helpers to look at the result.

    import traceflops.api as tf
    a = tf.analyze("trace.json.gz", model_config="config.json", tokens_per_step=524288)
    a.totals["mfu"], a.totals["loss_budget"]
    tf.to_html(a)              # the HTML report as a string (IPython: display(HTML(...)))
    tf.save_html(a, "r.html")
    frames = tf.to_pandas(a)   # {'kernels': DataFrame, 'steps': ..., ...}; needs pandas

The keyword arguments are the command line's options (`traceflops analyze
--help`), with the same meaning and the same numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from traceflops.pipeline import Analysis, ModelOptions
from traceflops.pipeline import analyze as _analyze


def model_spec(*, params=None, layers=None, heads=None, head_dim=None, seq_len=None, model_config=None):
    """A model description from numbers (all five) or a Hugging Face config (path or dict); None if nothing given."""
    from traceflops.flops import model as mf

    if model_config is not None:
        cfg = model_config
        if isinstance(cfg, (str, os.PathLike)):
            cfg = json.loads(Path(cfg).read_text())
        if not isinstance(cfg, dict):
            raise TypeError("model_config must be a path to a config.json or a dict")
        return mf.spec_from_config(cfg, seq_len=seq_len)
    given = [params, layers, heads, head_dim, seq_len]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise ValueError("a model description needs all of params, layers, heads, head_dim and seq_len (or model_config)")
    return mf.spec_from_flags(int(params), layers, heads, head_dim, seq_len)


def options(*, params=None, layers=None, heads=None, head_dim=None, seq_len=None, model_config=None, tokens_per_step=None,
            hardware=None, precision=None, peak_tflops=None, world_size=None, mode=None, exclude_steps=()) -> ModelOptions:
    """The `ModelOptions` the command line would build from the same flags."""
    if mode not in (None, "training", "inference"):
        raise ValueError(f"mode must be 'training' or 'inference', got {mode!r}")
    return ModelOptions(
        spec=model_spec(params=params, layers=layers, heads=heads, head_dim=head_dim, seq_len=seq_len, model_config=model_config),
        tokens_per_step=tokens_per_step,
        world_size=world_size,
        mode=mode,
        hardware=hardware,
        precision=precision,
        peak_tflops=peak_tflops,
        exclude_steps=tuple(exclude_steps),
    )


def analyze(path: str | os.PathLike, *, params: float | None = None, layers: int | None = None, heads: int | None = None,
            head_dim: int | None = None, seq_len: int | None = None, model_config: str | os.PathLike | dict | None = None,
            tokens_per_step: float | None = None, hardware: str | None = None, precision: str | None = None,
            peak_tflops: float | None = None, world_size: int | None = None, mode: str | None = None,
            exclude_steps: tuple[int, ...] = ()) -> Analysis:
    """Analyse one trace (Kineto JSON or XLA xplane.pb) as `traceflops analyze PATH` does."""
    opts = options(params=params, layers=layers, heads=heads, head_dim=head_dim, seq_len=seq_len, model_config=model_config,
                   tokens_per_step=tokens_per_step, hardware=hardware, precision=precision, peak_tflops=peak_tflops,
                   world_size=world_size, mode=mode, exclude_steps=exclude_steps)
    return _analyze(str(path), opts)


def analyze_job(paths, *, jobs: int = 1, pipeline_stages: int | None = None, microbatches: int | None = None, **model: Any):
    """Analyse many ranks (paths, a directory or a glob) into a `Job`, as `traceflops analyze A B ...` does."""
    from traceflops.run.inputs import expand
    from traceflops.views.job import global_model_flops, job_view, summarize_all

    opts = options(**model)
    files = expand([str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)])
    summaries = summarize_all(files, opts, jobs)
    return job_view(summaries, world_size=opts.world_size, tokens_model_flops=global_model_flops(summaries),
                    pipeline_stages=pipeline_stages, microbatches=microbatches, exclude_steps=opts.exclude_steps)


def to_dict(a: Analysis) -> dict[str, Any]:
    """The JSON report (`schema: traceflops.report/1`) as a dict."""
    from traceflops.report.jsonreport import to_dict as report

    return report(a)


def to_html(a) -> str:
    """The self-contained HTML report of an `Analysis` (or a `Job`)."""
    from traceflops.views.job import Job
    from traceflops.report.html import render_html, render_job_html

    return render_job_html(a) if isinstance(a, Job) else render_html(a)


def save_html(a, path: str | os.PathLike) -> str:
    from traceflops.report.tables import _atomic

    p = Path(path)
    text = to_html(a)
    _atomic(p, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return str(p)


def to_polars(a) -> dict:
    """Every table of the analysis (or job) as polars frames, by name."""
    from traceflops.views.job import Job
    from traceflops.report.tables import frames, job_frames

    return job_frames(a) if isinstance(a, Job) else frames(a)


def to_pandas(a) -> dict:
    """Every table as pandas frames, by name (pandas is optional: `pip install pandas`).

    Built column by column from numpy, so pyarrow is not needed; list
    columns become object columns of lists, a step's loss budget a dict.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_pandas needs pandas, which traceflops does not install: pip install pandas (or use to_polars)") from None
    out = {}
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
