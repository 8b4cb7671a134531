import os
import tempfile

import pytest

from tests.builders import shared_fixtures

# The CLI caches parsed traces under the user's cache by default: keep test runs out of it.
os.environ.setdefault("TRACEFLOPS_CACHE_DIR", tempfile.mkdtemp(prefix="traceflops-test-cache-"))


@pytest.fixture
def shared():
    p = shared_fixtures()
    if not p.is_dir():
        pytest.skip(f"shared fixtures not found at {p} (set TRACEFLOPS_FIXTURES)")
    return p
