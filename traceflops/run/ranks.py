"""Many ranks: each summarised in this process, in a process pool, or as Ray tasks, with the same summaries either way."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from traceflops.core.errors import InputError, TraceflopsError
from traceflops.core.results import RankSummary
from traceflops.parsers.helper import ENV
from traceflops.run.load import analyze
from traceflops.views.job import summarize


def _summarize_one(args: tuple) -> RankSummary:
    path, opts, cache_dir = args
    if "://" in path:
        return _summarize_url(path, opts)
    return summarize(analyze(path, opts, cache_dir))


def _summarize_url(url: str, opts) -> RankSummary:
    """A trace the worker reads through fsspec (object store, HTTP): copied to local disk, then parsed."""
    import tempfile

    import fsspec

    name = url.rsplit("/", 1)[-1] or "trace.json"
    with tempfile.TemporaryDirectory() as d:
        local = f"{d}/{name}"
        with fsspec.open(url, "rb") as src, open(local, "wb") as dst:
            while chunk := src.read(16 << 20):
                dst.write(chunk)
            return replace(summarize(analyze(local, opts)), path=url)


def summarize_all(paths: list[str], opts, jobs: int = 1, *, executor: str = "local", ray_address: str | None = None, cache_dir=None) -> list[RankSummary]:
    """Summaries of many ranks: in this process, a process pool (jobs > 1), or Ray tasks."""
    work = [(p, opts, cache_dir) for p in paths]
    if executor == "ray":
        return _on_ray(work, ray_address)
    if jobs <= 1 or len(paths) <= 1:
        return [_summarize_one(w) for w in work]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: forking a process that runs polars' thread pool can deadlock.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=one_core_per_rank) as pool:
        return list(pool.map(_summarize_one, work))


def one_core_per_rank() -> None:
    """Ranks already run side by side: a rank's parse takes no second core (no decode helper)."""
    os.environ.setdefault(ENV, "0")


def _summarize_on_worker(args: tuple) -> RankSummary:
    one_core_per_rank()
    return _summarize_one(args)


def _on_ray(work: list[tuple], address: str | None) -> list[RankSummary]:
    """The same summarize tasks on a Ray cluster; inputs must be paths or URLs the workers can read."""
    try:
        import ray
    except ImportError:
        raise InputError(None, "--executor ray needs Ray", "pip install 'traceflops[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)  # stderr keeps the one line of a failure
    try:
        task = ray.remote(_summarize_on_worker)
        try:
            return ray.get([task.remote(w) for w in work])
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, TraceflopsError):  # the rank's own one-line error, not the remote traceback
                raise e.cause from None
            raise
    finally:
        if started and address is None:
            ray.shutdown()
