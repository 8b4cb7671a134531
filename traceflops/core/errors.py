"""Errors a user can cause, each with an exit code documented in the README."""

from __future__ import annotations

EXIT_GATE_FAILED = 1  # `check` / `diff --fail-if`: a rule failed (as diff, grep and linters say "found")
EXIT_INPUT = 2  # click's own usage errors also exit 2
EXIT_FORMAT = 3
EXIT_INTERNAL = 4
EXIT_CANNOT_JUDGE = (
    5  # `check` / `diff --fail-if`: a rule could not be judged (too few steps, or a value the trace cannot know)
)
EXIT_PIPE_CLOSED = 1  # standard output's reader stopped reading (`| head`): as rich's console and click exit then
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports it: 128 + the signal
EXIT_TERMINATED = 143  # SIGTERM (`kill`, `timeout`, a batch scheduler)


class TraceflopsError(Exception):
    exit_code = EXIT_INPUT

    def __init__(self, path: str | None, what: str, todo: str):
        self.path, self.what, self.todo = path, what, todo
        super().__init__(self.line())

    def __reduce__(self):
        """Rebuilt from its parts, so the error survives a process pool or a Ray worker as itself."""
        return (self.__class__, (self.path, self.what, self.todo))

    def line(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"error: {where}{self.what}; {self.todo}"


class InputError(TraceflopsError):
    """The file cannot be read (missing, unreadable, corrupt compression)."""

    exit_code = EXIT_INPUT


class FormatError(TraceflopsError):
    """The file is readable but not a trace traceflops understands."""

    exit_code = EXIT_FORMAT


class InternalError(TraceflopsError):
    """A conservation check failed: a bug, reported instead of a wrong number."""

    exit_code = EXIT_INTERNAL


class NotATraceError(FormatError):
    """The file is no profiler trace at all (a config.json beside the traces): a job skips it with a warning (exit 3
    alone)."""


class EmptyTraceError(FormatError):
    """The file parses, but holds no host op or device activity to analyse (exit 3)."""


class OptionsError(TraceflopsError, ValueError):
    """The options are inconsistent (e.g. --params without --layers): exit 2, as click's usage errors; a ValueError in
    Python.

    Raised with path=None, so the line reads `error: WHAT; TODO`.
    """

    exit_code = EXIT_INPUT


class ConservationError(ValueError):
    """An invariant of the numbers broke (a time partition or a loss budget does not add up): a bug, never the input's
    fault."""

    def __init__(self, what: str, message: str):
        self.what = what  # which check: 'time partition' | 'loss budget'
        super().__init__(message)

    def __reduce__(self):
        return (self.__class__, (self.what, str(self)))


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so `finally` blocks run (a half-written output is removed) as for Ctrl-C.

    A BaseException, like KeyboardInterrupt: no `except Exception` on the way out swallows it.
    """
