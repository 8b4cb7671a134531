"""Many ranks: each summarised in this process, in this process beside worker processes, or as Ray tasks, with the
same summaries either way."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import queue
import socket
import threading
from dataclasses import dataclass, replace

from traceflops.core.errors import InputError, NotATraceError, TraceflopsError
from traceflops.core.frames import OwnProcess
from traceflops.core.memory import (
    GLIBC_PROMPT,
    HUGE_PAGES,
    POLARS_THREADS,
    VAR,
    children_environment,
    release_at_once,
    return_freed_memory,
    trim_promptly,
)
from traceflops.core.results import RankSummary
from traceflops.parsers.helper_start import ENV
from traceflops.run.load import analyze
from traceflops.storage.summary import read_summary, summary_bytes
from traceflops.views.job import summarize


def _summarize_one(args: tuple) -> RankSummary:
    path, opts, cache_dir = args
    if "://" in path:
        return _summarize_url(path, opts)
    summary = summarize(analyze(path, opts, cache_dir))
    _let_go()
    return summary


def _let_go() -> None:
    """The rank's analysis, gone once summarised, handed back before the next rank: its cycles collected and the
    C heap trimmed, so a process's next rank starts from what it holds, not from the last one's leftovers."""
    gc.collect()
    return_freed_memory()


@dataclass(frozen=True)
class Packed:
    """A rank's summary as its `.tfsum` bytes (parquet and JSON, `storage.summary`), as a process holds it until the
    job is merged.

    A summary's objects (its collectives' frame, its steps) were ~0.6 MiB each; held as objects, 32 of them were a
    tenth of a job's peak while ranks were still being analysed. Packed they are several times smaller, and read back
    as a stored summary is (the same job report as `merge` gives).
    """

    blob: bytes
    name: str


def packed(summary):
    """A summary packed (a rank's NotATraceError and anything else as it is)."""
    if not isinstance(summary, RankSummary):
        return summary
    return Packed(summary_bytes(summary), summary.path or "a rank's summary")


def unpacked(value):
    return read_summary(io.BytesIO(value.blob), value.name) if isinstance(value, Packed) else value


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


def summarize_all(
    paths: list[str],
    opts,
    jobs: int = 1,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    cache_dir=None,
    skipped: list[str] | None = None,
    on_done=None,
) -> list[RankSummary]:
    """Summaries of many ranks: in this process, a process pool (jobs > 1), or Ray tasks.

    Among several files, one that is no trace at all (a config.json beside the
    ranks) is left out and named in `skipped`; any other error stops the job.
    """
    work = [(p, opts, cache_dir) for p in paths]
    done = on_done or (lambda n, total: None)  # ranks done so far, of all (a progress display)
    got: list[RankSummary | NotATraceError]
    if executor == "ray":
        got = list(_on_ray(work, ray_address))
        done(len(got), len(work))
    elif jobs <= 1 or len(paths) <= 1:
        got = []
        for w in work:
            got.append(packed(_attempt(w)))
            done(len(got), len(work))
        got = [unpacked(g) for g in got]
    else:
        trim_promptly()  # this process analyses ranks too
        pool: list[_Worker] = []
        try:
            with _worker_environment():  # read by each worker as it starts
                pool += [_Worker() for _ in range(min(jobs, len(work)) - 1)]  # this process is one of the jobs
            got = _shared(work, pool, done)
        except BaseException:
            for worker in pool:  # at once: the ranks still queued are dropped
                worker.stop(at_once=True)
            raise
        for worker in pool:
            worker.stop(at_once=False)
        got = [unpacked(g) for g in got]  # once the workers have gone
    return _kept(got, len(paths), skipped)


def _shared(work: list, pool: list[_Worker], done) -> list:
    """The ranks' summaries, `packed`, in order, analysed here and in the `pool`'s processes side by side, each
    taking the next rank as it finishes one (a thread per worker hands it over and waits for its summary).

    A process fewer imports the analysis and holds a rank's tables: with --jobs 2 on 32 distinct 48 MB ranks, the
    tree of processes peaked at 277-282 MiB of PSS where two workers beside an idle parent took 291-292, and the
    job took 9.5-10.3 s against 10.3-11.0.
    """
    results: list = [None] * len(work)
    order = iter(range(len(work)))
    lock = threading.Lock()  # `order` is shared by the threads
    stop = threading.Event()
    replies: queue.Queue = queue.Queue()  # (rank index, summary), or (None, the error a worker's rank raised)

    def take() -> int | None:
        with lock:
            return None if stop.is_set() else next(order, None)

    def hand_over(worker: _Worker) -> None:
        try:
            while (i := take()) is not None:
                replies.put((i, worker.summarize(work[i])))
        except BaseException as e:
            replies.put((None, e))

    finished = 0

    def collect(i: int | None, value) -> None:
        nonlocal finished
        if i is None:
            raise value
        results[i] = value
        finished += 1
        done(finished, len(work))

    for worker in pool:
        threading.Thread(target=hand_over, args=(worker,), daemon=True).start()
    try:
        while (i := take()) is not None:
            collect(i, attempt_packed(work[i]))
            while not replies.empty():
                collect(*replies.get_nowait())
        while finished < len(work):
            with contextlib.suppress(queue.Empty):
                collect(*replies.get(timeout=0.2))  # a timeout, so Ctrl-C and SIGTERM are taken while it waits
    finally:
        stop.set()
    return results


def _worker_died() -> InputError:
    return InputError(
        None,
        "a worker process of the job ended before its rank was analysed (killed, e.g. for memory)",
        "rerun with fewer --jobs",
    )


class _Worker(OwnProcess):
    """A rank worker process (`rank_worker`), asked for one rank at a time."""

    def __init__(self) -> None:
        super().__init__("traceflops.run.rank_worker")

    def summarize(self, args: tuple):
        """The rank's packed summary or its NotATraceError; the error that stopped it is raised here."""
        try:
            self.send(args)
        except (OSError, ValueError):  # gone (killed), or stopped by this process
            raise _worker_died() from None
        got = self.receive()
        if got is None:
            raise _worker_died()
        if isinstance(got, BaseException) and not isinstance(got, NotATraceError):
            raise got
        return got


def _attempt(args: tuple) -> RankSummary | NotATraceError:
    """One rank's summary, or the error saying the file is no trace (returned, so the other ranks go on)."""
    try:
        return _summarize_one(args)
    except NotATraceError as e:
        return e


def attempt_packed(args: tuple):
    """`_attempt`, its summary `packed`: what a worker sends back (a smaller pickle through the pipe) and what this
    process keeps."""
    return packed(_attempt(args))


def _kept(got: list, n: int, skipped: list[str] | None) -> list[RankSummary]:
    bad = [g for g in got if isinstance(g, NotATraceError)]
    if bad and (n <= 1 or len(bad) == n):
        raise bad[0]
    if skipped is not None:
        skipped += [f"{e.path}: not a trace ({e.what}); left out of the job" for e in bad]
    return [g for g in got if not isinstance(g, NotATraceError)]


def one_core_per_rank() -> None:
    """Ranks already run side by side: a rank takes no second core, neither a decode helper nor polars threads.

    Polars sizes its thread pool once, as it loads (importing traceflops loads
    it): a pool worker inherits the setting from `_worker_environment`, the
    command's own process has it from `prefer_one_thread`. A user's own
    settings win.
    """
    for k, v in _ONE_CORE.items():
        os.environ.setdefault(k, v)


_ONE_CORE = {ENV: "0", POLARS_THREADS: "1"}


def _worker_environment():
    """The environment the rank workers started inside inherit: one core each, freed memory handed back at once
    (polars' allocator, glibc's heap: `GLIBC_PROMPT`), glibc's large blocks on huge pages (`HUGE_PAGES`); a user's own
    settings win. Then this process's own again."""
    return children_environment(
        {
            **{k: os.environ.get(k, v) for k, v in (_ONE_CORE | GLIBC_PROMPT | HUGE_PAGES).items()},
            VAR: release_at_once(os.environ.get(VAR)),
        }
    )


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
    return InputError(
        None,
        f"cannot reach the Ray cluster at {address!r} ({why})",
        "start one (`ray start --head`) or leave out --ray-address to run a local one",
    )


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
            ray.init(
                address=address,
                ignore_reinit_error=True,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )  # stderr keeps the one line of a failure
        except Exception as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            if address is None:
                raise InputError(
                    None,
                    f"could not start a local Ray cluster ({first})",
                    "check the Ray install, or run without --executor ray",
                ) from None
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
