"""An XSpace of many tiny messages stops with one line (exit 3) before it is built; real profiles decode."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.builders import CPU, pb_field
from traceflops.cli.main import main
from traceflops.core.errors import FormatError
from traceflops.parsers.xla import MAX_MESSAGES_ENV, decode_xspace

N = 200_000  # twice the floor of the bound (100 k), 400 KB of empty messages


def _space(*planes: bytes) -> bytes:
    return b"".join(pb_field(1, p) for p in planes)


def _plane(*lines: bytes, name="/device:TPU:0") -> bytes:
    return pb_field(1, 1) + pb_field(2, name) + b"".join(pb_field(3, ln) for ln in lines)


def empty_events(n: int = N) -> bytes:
    return _space(_plane(pb_field(1, 1) + pb_field(2, "XLA Ops") + b"\x22\x00" * n))


def empty_planes(n: int = N) -> bytes:
    return b"\x0a\x00" * n


def empty_lines(n: int = N) -> bytes:
    return _space(_plane() + b"\x1a\x00" * n)


def empty_stats(n: int = 2 * N) -> bytes:
    """One event with n empty stats: four stats per message are allowed, so twice the floor's messages."""
    return _space(_plane(pb_field(1, 1) + pb_field(2, "XLA Ops") + pb_field(4, pb_field(1, 1) + b"\x22\x00" * (2 * n))))


@pytest.mark.parametrize("build", [empty_events, empty_planes, empty_lines, empty_stats])
def test_many_empty_messages_are_refused(build, monkeypatch):
    monkeypatch.delenv(MAX_MESSAGES_ENV, raising=False)
    with pytest.raises(FormatError) as e:
        decode_xspace(build(), "p.xplane.pb")
    assert "p.xplane.pb" in e.value.line() and MAX_MESSAGES_ENV in e.value.line()


def test_the_bound_can_be_raised_and_lowered_and_real_profiles_fit_it(monkeypatch):
    """The densest real profiles hold one message per ~23 bytes: the default bound (one per 12) leaves them whole."""
    import gzip

    monkeypatch.delenv(MAX_MESSAGES_ENV, raising=False)
    real = sorted((CPU.parent).rglob("*.xplane.pb*"))[:3]
    assert real
    for f in real:
        raw = f.read_bytes()
        decode_xspace(gzip.decompress(raw) if f.name.endswith(".gz") else raw, str(f))
    small = empty_events(1000)
    assert len(decode_xspace(small, "p").planes[0].lines[0].events) == 1000
    monkeypatch.setenv(MAX_MESSAGES_ENV, "500")
    with pytest.raises(FormatError):
        decode_xspace(small, "p")
    monkeypatch.setenv(MAX_MESSAGES_ENV, "5000")
    assert len(decode_xspace(small, "p").planes[0].lines[0].events) == 1000


def test_the_command_exits_3_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(MAX_MESSAGES_ENV, raising=False)
    path = tmp_path / "empty.xplane.pb"
    path.write_bytes(empty_events())
    r = CliRunner().invoke(main, ["analyze", str(path), "--no-cache", "--format", "json", "--quiet"])
    assert r.exit_code == 3, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and MAX_MESSAGES_ENV in lines[0]
