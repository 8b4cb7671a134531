"""The package passes its linter and its type checker (pyproject.toml configures both), so CI fails on either."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    r = run("ruff", "check", "traceflops")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_changes_nothing():
    r = run("ruff", "format", "--check", "traceflops")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_finds_nothing():
    r = run("mypy")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
