"""Many ranks: each summarised in this process, in a process pool, or as Ray tasks, with the same summaries either way."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace

from traceflops.core.errors import InputError, NotATraceError, TraceflopsError
from traceflops.core.memory import children_release_at_once
from traceflops.core.results import RankSummary
from traceflops.parsers.helper_start import ENV
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


def summarize_all(paths: list[str], opts, jobs: int = 1, *, executor: str = "local", ray_address: str | None = None, cache_dir=None,
                  skipped: list[str] | None = None, on_done=None) -> list[RankSummary]:
    """Summaries of many ranks: in this process, a process pool (jobs > 1), or Ray tasks.

    Among several files, one that is no trace at all (a config.json beside the
    ranks) is left out and named in `skipped`; any other error stops the job.
    """
    work = [(p, opts, cache_dir) for p in paths]
    done = on_done or (lambda n, total: None)  # ranks done so far, of all (a progress display)
    if executor == "ray":
        got = _on_ray(work, ray_address)
        done(len(got), len(work))
    elif jobs <= 1 or len(paths) <= 1:
        got = []
        for w in work:
            got.append(_attempt(w))
            done(len(got), len(work))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: forking a process that runs polars' thread pool can deadlock.
        with children_release_at_once(), \
                ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=one_core_per_rank) as pool:
            got = []
            for g in pool.map(_attempt, work):  # in order; each rank counted as its result arrives
                got.append(g)
                done(len(got), len(work))
    return _kept(got, len(paths), skipped)


def _attempt(args: tuple) -> RankSummary | NotATraceError:
    """One rank's summary, or the error saying the file is no trace (returned, so the other ranks go on)."""
    try:
        return _summarize_one(args)
    except NotATraceError as e:
        return e


def _kept(got: list, n: int, skipped: list[str] | None) -> list[RankSummary]:
    bad = [g for g in got if isinstance(g, NotATraceError)]
    if bad and (n <= 1 or len(bad) == n):
        raise bad[0]
    if skipped is not None:
        skipped += [f"{e.path}: not a trace ({e.what}); left out of the job" for e in bad]
    return [g for g in got if not isinstance(g, NotATraceError)]


def one_core_per_rank() -> None:
    """Ranks already run side by side: a rank's parse takes no second core (no decode helper)."""
    os.environ.setdefault(ENV, "0")


def _attempt_on_worker(args: tuple) -> RankSummary | NotATraceError:
    one_core_per_rank()
    return _attempt(args)


def check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """An explicit `host:port` (or `ray://host:port`) that nothing answers on is an InputError within seconds.

    Ray itself retries an unreachable address for minutes before it fails. Other
    forms (`auto`, a local cluster) are Ray's to resolve.
    """
    if not address:
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError, OverflowError) as e:
        raise _unreachable(address, getattr(e, "strerror", None) or str(e) or type(e).__name__) from None


def _unreachable(address: str, why: str) -> InputError:
    return InputError(None, f"cannot reach the Ray cluster at {address!r} ({why})",
                      "start one (`ray start --head`) or leave out --ray-address to run a local one")


def _on_ray(work: list[tuple], address: str | None) -> list[RankSummary]:
    """The same summarize tasks on a Ray cluster; inputs must be paths or URLs the workers can read."""
    check_reachable(address)
    try:
        import ray
    except ImportError:
        raise InputError(None, "--executor ray needs Ray", "pip install 'traceflops[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR)  # stderr keeps the one line of a failure
        except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError or its own types here
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            if address is None:
                raise InputError(None, f"could not start a local Ray cluster ({first})",
                                 "check the Ray install, or run without --executor ray") from None
            raise _unreachable(address, first) from None
    try:
        task = ray.remote(_attempt_on_worker)
        try:
            return ray.get([task.remote(w) for w in work])
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, TraceflopsError):  # the rank's own one-line error, not the remote traceback
                raise e.cause from None
            raise
    finally:
        if started and address is None:
            ray.shutdown()
