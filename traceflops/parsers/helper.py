"""A second core for a large trace's decode: one helper process, results in file order.

The typed decode of a chunk is pure CPU in Python objects, so threads cannot
share it. A helper (`python -m traceflops.parsers.decode_worker`, never a re-run of
the caller's script, unlike multiprocessing's spawn) takes chunks over a pipe
once it has said it is ready (its imports take a good part of a second), whenever
it has fewer than `_IN_HAND` in hand, and this process decodes the rest: a
helper still starting, or one holding many arrays when the file ends, would
leave this process waiting.
Only the small per-chunk tables come back, as Arrow IPC inside msgpack (`pack`): no
pickle. If the helper cannot start or dies, its chunks are decoded here: the
result never depends on whether a helper ran.
"""

from __future__ import annotations

import io
import queue
import subprocess
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator

import msgspec
import polars as pl

from traceflops.core.frames import end_frames, read_frame, write_frame
from traceflops.core.trace import all_null, null_column
from traceflops.parsers.helper_start import take
from traceflops.parsers.jsonstream import REFUSED, Claimed

_IN_HAND = 2
_READY = b"ready"  # the helper's first frame, once its imports are done


Decoded = tuple[dict[str, pl.DataFrame], Counter]


def decode_in_order(
    make_arrays: Callable[[Callable], Iterable],
    helper: bool,
    decode_strict: Callable[[bytes], Decoded | None],
    decode_counted: Callable[[bytes], Decoded],
) -> Iterator[Decoded]:
    """The tables and warning counts of each JSON array of trace entries, in order.

    `make_arrays(claim)` streams the arrays (see `jsonstream.stream_events`).
    An array decoded here is decoded as it is cut, its strict decode serving as
    the proof of the cut; only arrays for the helper are skimmed first.
    `decode_strict` returns None for an array that does not decode whole;
    `decode_counted` (the helper runs the same) counts what it skips.
    """

    def here(text):
        got = decode_strict(text)
        return REFUSED if got is None else got

    def result(item) -> Decoded:
        return item.value if isinstance(item, Claimed) else decode_counted(item)

    proc = _start() if helper else None
    if proc is None:
        yield from map(result, make_arrays(here))
        return
    replies: queue.Queue = queue.Queue()
    outbox: queue.Queue = queue.Queue()
    ready = threading.Event()
    # Threads own the pipes, so this process never waits on the helper to read or write.
    threading.Thread(target=_read_replies, args=(proc.stdout, replies, ready), daemon=True).start()
    threading.Thread(target=_write_arrays, args=(proc, outbox), daemon=True).start()
    order: deque = deque()  # per array in order: the array (sent to the helper) or its result (decoded here)
    in_hand = 0  # arrays sent whose answer has not been taken yet
    alive = True

    def has_room() -> bool:
        # ready, and answered but not yet taken is not in its hands
        return alive and ready.is_set() and in_hand - replies.qsize() < _IN_HAND

    def claim(text):
        return None if has_room() else here(text)  # None: skimmed, then sent

    finished = False
    try:
        for item in make_arrays(claim):
            if isinstance(item, Claimed) or not has_room():
                order.append(("here", result(item)))
            else:
                outbox.put(item)
                order.append(("remote", item))
                in_hand += 1
            while order and order[0][0] == "here":
                yield order.popleft()[1]
            # collect what the helper has finished without waiting
            while order and order[0][0] == "remote" and not replies.empty():
                got = replies.get()
                in_hand -= 1
                alive = alive and got is not None
                yield got if got is not None else decode_counted(order[0][1])
                order.popleft()
                while order and order[0][0] == "here":
                    yield order.popleft()[1]
        while order:
            kind, value = order.popleft()
            if kind == "here":
                yield value
                continue
            got = replies.get() if alive else None
            if got is None:  # the helper is gone: this array and every one after it, here
                alive = False
                got = decode_counted(value)
            yield got
        finished = True
    finally:
        if not finished:  # stopped part-way (Ctrl-C, an error, the caller gone): the helper's arrays are not wanted
            proc.kill()
        outbox.put(None)


def _start() -> subprocess.Popen | None:
    return take()


def _write_arrays(proc: subprocess.Popen, outbox: queue.Queue) -> None:
    """Frames to the helper until None, then the empty frame that stops it and a wait for its exit."""
    stdin = proc.stdin
    assert stdin is not None  # the helper is started with stdin=PIPE
    try:
        while (text := outbox.get()) is not None:
            write_frame(stdin, text)
            stdin.flush()
        end_frames(stdin)
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the reader sees the helper gone; its arrays are decoded by the caller
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read_replies(stream, replies: queue.Queue, ready: threading.Event) -> None:
    """`ready` set when the helper says so, then replies in order; None once the helper is gone (end of stream or a
    reply that does not decode)."""
    try:
        if read_frame(stream) != _READY:
            raise ValueError("no ready frame")
        ready.set()
        while True:
            blob = read_frame(stream)
            if blob is None:
                break
            replies.put(unpack(blob))
    except Exception:
        pass
    replies.put(None)


def _ipc(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_ipc(buf)
    return buf.getvalue()


# Types an all-null column is sent by name (any other type travels as IPC like a column with values).
_NULL_TYPES = {str(t): t for t in (pl.Int64, pl.Float64, pl.Utf8, pl.Boolean, pl.UInt32)}


def pack(decoded: Decoded) -> bytes:
    """A reply: each table as Arrow IPC of its columns that hold a value, the all-null ones by name and type only.

    Most of a trace's optional columns (shapes, collectives) are null
    throughout a chunk, and many chunks hold no row of some table; as IPC each
    such column still cost 8-16 bytes a row (two thirds of a reply's bytes, and
    as many again in memory once read back), and each IPC read ~1 ms.
    """
    tables, counts = decoded
    out = {}
    for name, df in tables.items():
        kinds = {c: str(t) for c, t in df.schema.items()}
        empty = {c: kinds[c] for c in all_null(df) if kinds[c] in _NULL_TYPES}
        rest = df.drop(list(empty))
        out[name] = {
            "rows": df.height,
            "columns": df.columns,
            "nulls": empty,
            "values": _ipc(rest) if rest.width else None,
        }
    return msgspec.msgpack.encode({"counts": dict(counts), "tables": out})


def unpack(blob: bytes) -> Decoded:
    """`pack`'s tables and counts, the all-null columns rebuilt without buffers, in their order."""
    msg = msgspec.msgpack.decode(blob)
    tables = {}
    for name, t in msg["tables"].items():
        nulls = [null_column(t["rows"], _NULL_TYPES[kind]).alias(c) for c, kind in t["nulls"].items()]
        if t["values"] is None:
            tables[name] = pl.DataFrame(nulls).select(t["columns"]) if nulls else pl.DataFrame()
            continue
        df = pl.read_ipc(io.BytesIO(t["values"]))
        tables[name] = (df.with_columns(nulls) if nulls else df).select(t["columns"])
    return tables, Counter(msg["counts"])


def serve(inp, out, decode_counted: Callable[[bytes], Decoded]) -> None:
    """The helper's loop: the ready frame, then arrays in, tables out, until an empty frame or the end of input."""
    write_frame(out, _READY)
    out.flush()
    while (text := read_frame(inp)) is not None:
        write_frame(out, pack(decode_counted(text)))
        out.flush()
