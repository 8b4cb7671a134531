import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The CLI caches parsed traces under the user's cache by default: keep test runs out of it.
os.environ.setdefault("TRACEFLOPS_CACHE_DIR", tempfile.mkdtemp(prefix="traceflops-test-cache-"))


def shared_fixtures() -> Path:
    """The shared real traces: beside the checkout, or where TRACEFLOPS_FIXTURES points."""
    env = os.environ.get("TRACEFLOPS_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures"


@pytest.fixture
def shared():
    p = shared_fixtures()
    if not p.is_dir():
        pytest.skip(f"shared fixtures not found at {p} (set TRACEFLOPS_FIXTURES)")
    return p
