"""A helper process decodes some chunks: the parsed trace must not depend on it."""

import io
import os
import select
import signal
import subprocess
import sys

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from traceflops.core.frames import read_frame
from traceflops.parsers import helper, helper_start
from traceflops.parsers.kineto import parse_kineto


def _tables(trace):
    return {t: getattr(trace, t) for t in ("ops", "kernels", "launches", "markers", "steps")}


@pytest.fixture
def v100(shared):
    return str(shared / "kineto" / "v100_transformer_rank1.json.gz")


def _parse(path, monkeypatch, use_helper, chunk=1 << 20):
    monkeypatch.setenv(helper_start.ENV, "1" if use_helper else "0")
    return parse_kineto(path, chunk=chunk)


def _ready_helpers(monkeypatch, started):
    """`helper._start` recording each helper it starts, returned once the helper has said it is ready (else it would
    be sent nothing, and stopping the parse would stop no helper at work)."""
    real_start = helper._start

    def ready():
        proc = real_start()
        if proc is not None:
            started.append(proc)
            select.select([proc.stdout], [], [], 120)
        return proc

    monkeypatch.setattr(helper, "_start", ready)


def _decoding(path):
    """`parse_kineto`'s decode of `path` with a helper, as a generator of each array's tables, in order."""
    from traceflops.parsers import kineto
    from traceflops.parsers.jsonstream import stream_events

    def arrays(claim):
        for texts, _ in stream_events(path, 1 << 40, chunk=1 << 20, claim=claim):
            yield from texts

    return helper.decode_in_order(arrays, True, kineto.decode_strict, kineto.decode_counted)


def test_helper_and_no_helper_give_the_same_trace(v100, monkeypatch):
    alone = _parse(v100, monkeypatch, False)
    replies = []
    real_unpack = helper.unpack
    monkeypatch.setattr(helper, "unpack", lambda blob: replies.append(1) or real_unpack(blob))
    # the helper's imports may outlast this small file's parse on a loaded machine (then it takes no array, and this
    # test would compare the parse with itself): the parse starts once the helper has said it is ready
    _ready_helpers(monkeypatch, [])
    helped = _parse(v100, monkeypatch, True)
    assert replies  # the helper decoded some of the arrays
    for name, frame in _tables(alone).items():
        assert_frame_equal(frame, _tables(helped)[name])
    assert alone.warnings.counts == helped.warnings.counts
    assert alone.kernels.height > 10_000  # the file spans many chunks


def test_a_helper_that_dies_changes_nothing(v100, monkeypatch, tmp_path):
    alone = _parse(v100, monkeypatch, False)

    got = tmp_path / "received"
    # says it is ready, takes part of the first array it is sent, then dies without a reply
    script = ("import sys; out = sys.stdout.buffer; out.write((5).to_bytes(8, 'little') + b'ready'); out.flush(); "
              f"open({str(got)!r}, 'w').write(str(len(sys.stdin.buffer.read(100)))); sys.exit(3)")

    def dying():
        return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    monkeypatch.setattr(helper, "_start", dying)
    helped = _parse(v100, monkeypatch, True)
    assert got.read_text() == "100"  # it was sent an array: the arrays it held were decoded here after it died
    for name, frame in _tables(alone).items():
        assert_frame_equal(frame, _tables(helped)[name])


def test_a_helper_is_sent_nothing_before_it_says_it_is_ready(v100, monkeypatch, tmp_path):
    """A helper still importing would hold arrays this process then waits for: it gets none until ready."""
    got = tmp_path / "received"
    script = f"import sys; open({str(got)!r}, 'w').write(str(len(sys.stdin.buffer.read())))"

    started = []

    def silent():
        started.append(subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL))
        return started[-1]

    alone = _parse(v100, monkeypatch, False)
    monkeypatch.setattr(helper, "_start", silent)
    helped = _parse(v100, monkeypatch, True)
    assert_frame_equal(alone.kernels, helped.kernels)
    assert len(started) == 1 and started[0].wait(timeout=30) == 0  # it has written what it received
    assert got.read_text() == "8"  # only the empty frame that stops it


def test_a_parse_stopped_part_way_kills_its_helper(v100, monkeypatch):
    """Ctrl-C or an error mid-parse: the helper's arrays are not wanted, and it is not left decoding them."""
    started = []
    _ready_helpers(monkeypatch, started)
    decoding = _decoding(v100)
    next(decoding)  # the helper is ready: the first array went to it
    decoding.close()  # the consumer gone, as a KeyboardInterrupt in the parse's loop leaves it
    assert len(started) == 1
    assert started[0].wait(timeout=30) == -signal.SIGKILL


def test_a_parse_read_to_its_end_lets_its_helper_end_by_itself(v100, monkeypatch):
    started = []
    _ready_helpers(monkeypatch, started)
    assert sum(1 for _ in _decoding(v100)) > 10
    assert len(started) == 1
    assert started[0].wait(timeout=30) == 0


def test_a_helper_that_cannot_start_changes_nothing(v100, monkeypatch):
    alone = _parse(v100, monkeypatch, False)
    monkeypatch.setattr(helper, "_start", lambda: None)
    helped = _parse(v100, monkeypatch, True)
    assert_frame_equal(alone.kernels, helped.kernels)


def test_helper_is_wanted_from_256_mib_of_json_only(tmp_path, monkeypatch):
    """256 MiB of JSON, a gzip file's size counted ×8 (a Kineto trace compresses about that much); forced either way."""
    monkeypatch.delenv(helper_start.ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two cores, whatever runs this

    def sized(name: str, size: int, head: bytes = b"{") -> str:
        path = tmp_path / name
        path.write_bytes(head)
        os.truncate(path, size)  # sparse: no disk used
        return str(path)

    mib = 1 << 20
    assert helper_start.wanted(sized("big.json", 256 * mib))
    assert not helper_start.wanted(sized("under.json", 256 * mib - 1))
    assert helper_start.wanted(sized("big.json.gz", 32 * mib, b"\x1f\x8b"))
    assert not helper_start.wanted(sized("under.json.gz", 32 * mib - 1, b"\x1f\x8b"))
    assert not helper_start.wanted(sized("gz_named_plain.json.gz", 32 * mib))  # its bytes say what it is, not its name
    monkeypatch.setenv(helper_start.ENV, "1")
    assert helper_start.wanted(sized("small.json", 20))
    monkeypatch.setenv(helper_start.ENV, "0")
    assert not helper_start.wanted(sized("big.json", 256 * mib))


def test_the_helper_protocol_round_trip():
    """A ready frame, then framed arrays in, Arrow tables inside msgpack out, an empty frame to stop."""
    text = b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"correlation": 5}}]'
    frame = len(text).to_bytes(8, "little") + text + (0).to_bytes(8, "little")
    out = subprocess.run([sys.executable, "-m", "traceflops.parsers.decode_worker"], input=frame, capture_output=True, check=True).stdout
    stream = io.BytesIO(out)
    assert read_frame(stream) == b"ready"
    blob = read_frame(stream)
    tables, _ = helper.unpack(blob)
    kernels = tables["kernels"]
    assert kernels["name"].to_list() == ["k"] and kernels["correlation"].to_list() == [5]
    assert kernels["bytes"].to_list() == [None] and kernels.schema["bytes"] == pl.Int64
    assert read_frame(stream) is None
    import msgspec  # a column null throughout crosses as its name and type, not as Arrow values

    assert msgspec.msgpack.decode(blob)["tables"]["kernels"]["nulls"]["bytes"] == "Int64"


def test_ranks_in_a_pool_or_on_ray_take_one_core_each(monkeypatch):
    """A rank run beside others does not start a decode helper of its own."""
    from traceflops.run import ranks

    for var in (helper_start.ENV, ranks.POLARS_THREADS):
        monkeypatch.setenv(var, "unset below")  # recorded, so teardown restores the caller's environment
        monkeypatch.delenv(var)
    ranks.one_core_per_rank()
    import os

    assert os.environ[helper_start.ENV] == "0" and os.environ[ranks.POLARS_THREADS] == "1"
    monkeypatch.setenv(helper_start.ENV, "1")
    monkeypatch.setenv(ranks.POLARS_THREADS, "2")
    ranks.one_core_per_rank()  # a user's own setting wins
    assert os.environ[helper_start.ENV] == "1" and os.environ[ranks.POLARS_THREADS] == "2"


def test_a_pool_worker_runs_polars_on_one_thread(monkeypatch):
    """The setting reaches polars in a spawned worker (importing traceflops starts polars' pool: too late to set it there)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from traceflops.run import ranks

    monkeypatch.delenv(ranks.POLARS_THREADS, raising=False)
    with ranks._worker_environment(), ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(pl.thread_pool_size).result() == 1
    assert ranks.POLARS_THREADS not in os.environ  # this process's environment as it was


def test_a_helper_started_early_is_the_one_the_parse_takes(v100, monkeypatch):
    """The CLI starts a large trace's helper before its own imports; the parse then uses that process."""
    alone = _parse(v100, monkeypatch, False)
    monkeypatch.setenv(helper_start.ENV, "1")  # wanted whatever the machine's cores
    helper_start.start_early(v100)
    assert len(helper_start._early) == 1
    early = helper_start._early[0]
    helped = parse_kineto(v100, chunk=1 << 20)
    assert helper_start._early == [] and early.wait(timeout=30) == 0  # taken, then stopped by its empty frame
    for name, frame in _tables(alone).items():
        assert_frame_equal(frame, _tables(helped)[name])


def test_an_early_helper_no_parse_takes_is_stopped(v100, monkeypatch):
    monkeypatch.setenv(helper_start.ENV, "1")
    helper_start.start_early(v100)
    early = helper_start._early[0]
    helper_start.drop_early()
    assert early.poll() is not None and helper_start._early == []


def test_starting_a_helper_early_loads_no_polars():
    """Light, so the CLI can start the helper before its own imports."""
    code = "import sys, traceflops.parsers.helper_start; print('polars' in sys.modules, 'numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["False", "False"]


@pytest.mark.parametrize("use_helper", [False, True])
def test_parsed_tables_are_one_chunk_per_column(v100, monkeypatch, use_helper):
    """Joined from many chunks; polars copies every string a gather takes from a text column of many chunks, so the
    analysis' gathers of kernel names (idle gaps, critical path) each held a copy of them."""
    trace = _parse(v100, monkeypatch, use_helper)
    for name, frame in _tables(trace).items():
        assert {s.n_chunks() for s in frame.iter_columns()} <= {1}, name


def test_a_table_whose_columns_are_all_null_travels_whole():
    """Every column sent by name and type only: the rows must still be there."""
    df = pl.DataFrame({"a": [None, None], "b": [None, None]}, schema={"a": pl.Int64, "b": pl.Utf8})
    tables, counts = helper.unpack(helper.pack(({"t": df}, {"x": 1})))
    assert_frame_equal(tables["t"], df)
    assert counts == {"x": 1}


def test_no_helper_is_started_early_for_an_xla_profile(tmp_path, monkeypatch):
    """The XLA parser decodes no JSON: a helper started for it would sit idle, holding its memory, to the end."""
    from traceflops.cli.common import start_decode_helper

    monkeypatch.setenv(helper_start.ENV, "1")  # wanted, were it a Kineto trace
    profile = tmp_path / "host.xplane.pb"
    profile.write_bytes(b"\x00" * 64)
    start_decode_helper([str(profile)], {"no_cache": True})
    assert helper_start._early == []
    trace = tmp_path / "t.json"
    trace.write_bytes(b'{"traceEvents": []}')
    start_decode_helper([str(trace)], {"no_cache": True})
    assert len(helper_start._early) == 1
    helper_start.drop_early()
