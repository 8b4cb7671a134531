"""`python -m traceflops.cli`: the same commands as the `traceflops` script."""

from traceflops.cli.main import run

run()
