"""Every output goes through one writer: file names that are not UTF-8 shown as escapes, failed writes as exit 2.

Run as subprocesses: a name's raw bytes, a file-size limit and a missing home folder are the process's own.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import CPU

TRACE = CPU / "ns_eager_sdpa.json.gz"
EXE = [sys.executable, "-m", "traceflops.cli.main"]


def run(*args, **kw) -> subprocess.CompletedProcess:
    cmd = [*EXE, *[a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args], b"--no-cache", b"--peak-tflops", b"1"]
    return subprocess.run(cmd, check=False, capture_output=True, cwd=Path(__file__).resolve().parents[2], timeout=300, **kw)


def _clean(r, code: int) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == code, (r.returncode, err)
    assert "Traceback" not in err and "internal error" not in err, err
    return err


@pytest.fixture
def odd(tmp_path) -> bytes:
    """A folder whose name is not UTF-8 (legal on Linux), holding a copy of the trace."""
    d = os.fsencode(tmp_path) + b"/x\xff"
    os.mkdir(d)
    shutil.copy(TRACE, os.fsdecode(d + b"/t.json.gz"))
    return d


@pytest.mark.parametrize("how", [
    [b"analyze", b"{T}", b"--html", b"{D}/r.html"],
    [b"annotate", b"{T}", b"-o", b"{D}/a.json.gz"],
    [b"diff", b"{T}", b"{T}", b"-o", b"{D}/d.txt"],
    [b"diff", b"{T}", b"{T}", b"--format", b"json", b"-o", b"{D}/d.json"],
    [b"diff", b"{T}", b"{T}", b"--format", b"html", b"-o", b"{D}/d.html"],
    [b"analyze", b"{T}", b"--tables", b"{D}/tables"],
], ids=["html", "annotate", "diff", "diff_json", "diff_html", "tables"])
def test_names_that_are_not_utf8_are_written_and_shown_as_escapes(odd, how):
    args = [a.replace(b"{T}", odd + b"/t.json.gz").replace(b"{D}", odd) for a in how]
    err = _clean(run(*args), 0)
    assert "x\\xff" in err, err  # the byte as an escape, never a surrogate or a raw byte
    out = args[-1]
    assert os.path.exists(out)
    if out.endswith((b".json", b".html", b".txt")):
        Path(os.fsdecode(out)).read_bytes().decode("utf-8")  # valid UTF-8 throughout


def _limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))


@pytest.mark.parametrize("how", [["analyze", TRACE, "--tables", "{D}/tables"], ["analyze", TRACE, "--html", "{D}/r.html"],
                                 ["annotate", TRACE, "-o", "{D}/a.json.gz"], ["diff", TRACE, TRACE, "-o", "{D}/d.html", "--format", "html"]],
                         ids=["tables", "html", "annotate", "diff"])
def test_a_write_over_the_file_size_limit_is_exit_2_naming_the_file(tmp_path, how):
    args = [str(a).replace("{D}", str(tmp_path)) for a in how]
    err = _clean(run(*args, preexec_fn=_limit), 2)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}") and "cannot write" in lines[0], err
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name.endswith(".tmp")]  # nothing half written left


def test_no_home_folder_runs_without_a_cache(tmp_path):
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as a user id without a passwd entry")
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "TRACEFLOPS_CACHE_DIR")}
    cmd = ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", *EXE, "analyze", str(TRACE), "--format", "json",
           "--peak-tflops", "1"]
    r = subprocess.run(cmd, check=False, capture_output=True, env=env, cwd=tmp_path, timeout=300)
    err = _clean(r, 0)
    assert "without a cache" in err and "HOME" in err, err


def test_the_writer_names_the_path_of_a_library_error_caused_by_the_os(tmp_path):
    from traceflops.core.errors import InputError
    from traceflops.core.files import write_file

    def fill(f):
        try:
            f.write(b"x" * 10)
        except OSError:
            raise RuntimeError("File out of specification") from None

    def full(_self, _data):
        raise OSError(28, "No space left on device")

    from traceflops.core import files

    orig = files._Watched.write
    files._Watched.write = lambda self, data: (setattr(self, "os_error", OSError(28, "No space left on device")), full(self, data))[1]
    try:
        with pytest.raises(InputError, match="No space left"):
            write_file(tmp_path / "out.parquet", fill)
    finally:
        files._Watched.write = orig
    assert list(tmp_path.iterdir()) == []
