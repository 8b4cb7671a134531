"""Which inflater the trace reader uses: ISA-L's where it is installed (a dependency where it has a wheel)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_isal_is_used_where_it_is_installed():
    pytest.importorskip("isal")
    got = subprocess.run([sys.executable, "-c", "import traceflops.parsers.io as m; print(m.inflate.__name__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "isal.isal_zlib"
