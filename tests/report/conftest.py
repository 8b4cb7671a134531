import pytest


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for a module's tests (the browser and HTML section tests), skipped where there is none."""
    from tests.report.test_browser import Browser, chromium_binary

    binary = chromium_binary()
    if not binary:
        pytest.skip("no chromium binary found (install Debian's `chromium`, or set TRACEFLOPS_CHROMIUM)")
    b = Browser(binary)
    try:
        yield b
    finally:
        b.close()
