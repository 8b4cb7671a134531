"""The annotated trace's writes handed to a thread (`export.perfetto.overlap.Behind`): the same bytes in the same
order, errors raised in the caller, memory bounded, nothing written after the output is given up."""

from __future__ import annotations

import gzip
import io
import random
import threading

import pytest

from traceflops.export.perfetto.output import write_output
from traceflops.export.perfetto.overlap import Behind


class _Slow(io.BytesIO):
    """A file whose writes wait until let go, counting them."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.calls = 0

    def write(self, data) -> int:
        self.go.wait(5)
        self.calls += 1
        return super().write(data)


def test_the_same_bytes_in_order_whatever_the_batch():
    rng = random.Random(7)
    pieces = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(500)]
    for batch in (1, 7, 64, 1 << 20):
        f = io.BytesIO()
        w = Behind(f, batch=batch, depth=2)
        for p in pieces:
            assert w.write(p) == len(p)
        w.close()
        assert f.getvalue() == b"".join(pieces), batch


def test_a_buffer_changed_after_its_write_is_written_as_it_was():
    f = io.BytesIO()
    w = Behind(f, batch=1 << 20)
    buf = bytearray(b"abc")
    w.write(buf)
    buf[:] = b"xyz"
    w.write(memoryview(b"def"))
    w.close()
    assert f.getvalue() == b"abcdef"


def test_an_error_on_the_thread_is_raised_at_close_and_nothing_after_it_is_written():
    class Full(io.BytesIO):
        def write(self, data) -> int:
            if self.tell() + len(data) > 10:
                raise OSError(28, "No space left on device")
            return super().write(data)

    f = Full()
    w = Behind(f, batch=4)
    w.write(b"0123")  # handed over, written
    w.write(b"456789ab")  # handed over, refused
    with pytest.raises(OSError, match="No space"):
        for _ in range(100):  # raised at a later write once the thread has met it, or at close
            w.write(b"c")
        w.close()
    w.abandon()
    assert f.getvalue() == b"0123"


def test_at_most_depth_pieces_wait():
    f = _Slow()
    w = Behind(f, batch=1, depth=2)
    w.write(b"a")  # taken by the thread, which waits in the file's write
    w.write(b"b")
    w.write(b"c")  # the queue holds two
    fourth = threading.Thread(target=w.write, args=(b"d",), daemon=True)
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive()  # a third waiting piece is refused until the file takes one
    f.go.set()
    fourth.join(5)
    w.close()
    assert f.getvalue() == b"abcd"


def test_abandon_writes_nothing_not_yet_handed_over_and_ends_the_thread():
    f = _Slow()
    w = Behind(f, batch=1 << 20)
    w.write(b"kept back")
    f.go.set()
    w.abandon()
    assert f.getvalue() == b"" and not w._thread.is_alive()
    w.abandon()  # twice is harmless


def test_a_gzipped_output_reads_back_as_written(tmp_path):
    out = tmp_path / "a.json.gz"
    pieces = [b"[", *(b'{"i":%d},' % i for i in range(200_000)), b"0]"]
    write_output(str(out), lambda f, tmp: [f.write(p) for p in pieces])
    assert gzip.decompress(out.read_bytes()) == b"".join(pieces)


def test_a_failing_fill_leaves_no_output_and_no_thread(tmp_path):
    out = tmp_path / "a.json.gz"

    def fill(f, tmp):
        f.write(b"x" * (5 << 20))
        raise ValueError("stopped")

    with pytest.raises(ValueError, match="stopped"):
        write_output(str(out), fill)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name == "annotate-behind"]  # other tests' threads may come and go
