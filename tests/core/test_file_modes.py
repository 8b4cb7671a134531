"""Outputs are created as any program's files are: mode 0666 less the umask (atomic rename kept)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import CPU, ROOT
from traceflops.core.files import write_file, write_text


@pytest.fixture
def umask():
    before = os.umask(0o022)
    os.umask(before)

    def set_to(mask: int) -> None:
        os.umask(mask)

    yield set_to
    os.umask(before)


def test_a_new_output_takes_the_umask(tmp_path, umask):
    for mask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        umask(mask)
        d = tmp_path / f"{mask:o}"
        d.mkdir()
        write_text(d / "r.txt", "report")
        write_file(d / "r.bin", lambda f: f.write(b"x"))
        assert {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in d.iterdir()} == {"r.txt": mode, "r.bin": mode}, oct(mask)  # no temporary left


def test_a_command_output_takes_the_umask(tmp_path):
    for mask, mode in ((0o022, 0o644), (0o077, 0o600)):
        _command_output(tmp_path / f"{mask:o}", mask, mode)


def _command_output(folder: Path, mask: int, mode: int) -> None:
    folder.mkdir()
    out = folder / "d.json"
    trace = CPU / "ns_eager_sdpa.json.gz"
    r = subprocess.run([sys.executable, "-m", "traceflops.cli.main", "diff", str(trace), str(trace), "--format", "json", "-o", str(out),
                        "--no-cache", "--peak-tflops", "1"], capture_output=True, cwd=ROOT, timeout=300, check=False,
                       preexec_fn=lambda: os.umask(mask))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == mode
    assert [p.name for p in folder.iterdir()] == ["d.json"]
