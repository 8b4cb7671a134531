"""Bounded reads: every gzip member is read, wherever a member ends; a bomb or a corrupt stream is one clear error.

Each case runs with both inflaters the reader may use: ISA-L's where it is installed, and zlib's (its fallback).
"""

from __future__ import annotations

import gzip
import zlib

import pytest

import traceflops.parsers.io as io_module
from tests.builders import CPU
from traceflops.core.errors import InputError
from traceflops.parsers.io import chunks, read_bytes

TEXT = gzip.decompress((CPU / "ns_eager_sdpa.json.gz").read_bytes())


def _isal():
    try:
        from isal import isal_zlib
    except ImportError:
        pytest.skip("isal is not installed: only zlib's inflate is used here")
    return isal_zlib


@pytest.fixture(autouse=True, params=["zlib", "isal"])
def inflater(request, monkeypatch):
    monkeypatch.setattr(io_module, "inflate", zlib if request.param == "zlib" else _isal())
    return request.param


def members(data: bytes, n: int) -> bytes:
    step = len(data) // n + 1
    return b"".join(gzip.compress(data[i:i + step]) for i in range(0, len(data), step))


@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("piece", [1 << 12, 1 << 20])
def test_every_member_is_read(tmp_path, n, piece):
    p = tmp_path / "t.json.gz"
    p.write_bytes(members(TEXT, n))
    assert b"".join(chunks(str(p), 1 << 40, piece)) == TEXT
    assert read_bytes(str(p)) == TEXT


def test_a_member_ending_exactly_at_a_read_boundary(tmp_path):
    first = gzip.compress(TEXT[:5000])
    p = tmp_path / "t.json.gz"
    p.write_bytes(first + gzip.compress(TEXT[5000:]))
    assert b"".join(chunks(str(p), 1 << 40, len(first))) == TEXT  # the first read ends where member two starts


def test_a_bomb_stops_at_the_limit(tmp_path):
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b" " * (4 << 20)))
    with pytest.raises(InputError, match="limit"):
        read_bytes(str(p), max_bytes=1 << 20)


def test_corrupt_gzip_is_an_input_error(tmp_path):
    good = gzip.compress(TEXT)
    p = tmp_path / "bad.json.gz"
    p.write_bytes(good[:100] + bytes(b ^ 0xFF for b in good[100:200]) + good[200:])
    with pytest.raises(InputError, match="corrupt gzip"):
        read_bytes(str(p))


def test_a_cut_stream_yields_what_it_held(tmp_path):
    good = gzip.compress(TEXT)
    p = tmp_path / "cut.json.gz"
    p.write_bytes(good[: len(good) // 2])
    got = read_bytes(str(p))
    assert 0 < len(got) < len(TEXT) and TEXT.startswith(got)
