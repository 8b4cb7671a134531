"""Expanding what the user named (files, directories, globs) into trace files."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from traceflops.core.errors import InputError
from traceflops.parsers.io import check_regular

TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".xplane.pb.gz")
CAPTURE_DIR = "capture_traces"  # where vLLM and SGLang write the traces of their CUDA/HIP graph captures
XPLANE_SUFFIXES = (".xplane.pb", ".xplane.pb.gz")
JAX_JSON_SUFFIX = ".trace.json.gz"  # what jax.profiler writes beside each host's xplane: the same profile, converted


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def _stem(name: str, suffixes: tuple[str, ...]) -> str | None:
    return next((name[: -len(s)] for s in suffixes if name.endswith(s)), None)


def profile_files(files: list[Path]) -> list[Path]:
    """A folder's traces, a `jax.profiler` log directory's `<host>.trace.json.gz` left out beside its
    `<host>.xplane.pb`."""
    xplanes = {(f.parent, _stem(f.name, XPLANE_SUFFIXES)) for f in files if _stem(f.name, XPLANE_SUFFIXES) is not None}
    return [f for f in files if (f.parent, _stem(f.name, (JAX_JSON_SUFFIX,))) not in xplanes]


def walk_traces(root: str) -> tuple[list[Path], list[str]]:
    """The trace files under a folder (links followed, each real folder once), and a warning per folder or file left
    out.

    A folder that cannot be listed, or a trace-named pipe or device, is named
    in the warnings rather than skipped in silence: a job view missing a rank
    must say so.
    """
    warnings: list[str] = []
    seen: set[tuple[int, int]] = set()
    files: list[Path] = []

    def unlistable(e: OSError) -> None:
        warnings.append(f"{e.filename}: folder cannot be read ({e.strerror}); its traces are left out")

    for folder, dirs, names in os.walk(root, onerror=unlistable, followlinks=True):
        try:
            st = os.stat(folder)
        except OSError as e:  # gone or unreadable since it was listed
            unlistable(e)
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # a link back to a folder already walked
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        if CAPTURE_DIR in dirs:  # graph captures (vLLM, SGLang): read with the trace beside them, never ranks
            dirs.remove(CAPTURE_DIR)
            warnings.append(f"{Path(folder, CAPTURE_DIR)}: graph captures, not ranks: read with the traces beside them")
        others = sorted(n for n in names if not is_trace_name(n) and not n.startswith("."))
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            warnings.append(f"{folder}: {len(others)} file(s) that are not traces left out ({shown})")
        for name in filter(is_trace_name, names):
            f = Path(folder, name)
            try:
                check_regular(str(f))
            except InputError as e:
                warnings.append(f"{f}: {e.what}; left out")
                continue
            files.append(f)
    return files, warnings


def expand_with_warnings(paths: list[str]) -> tuple[list[str], list[str]]:
    """The trace files the user named (files, folders, globs), and what was left out of the folders, one line each.

    A name that exists is that file, even with `[`, `*` or `?` in it; only a
    name that does not exist is a glob pattern. A named file must be a regular
    file: a pipe, a device or standard input is refused before anything reads it.
    """
    out: list[str] = []
    warnings: list[str] = []
    for p in paths:
        if p == "-":
            raise InputError(
                p, "reading a trace from standard input is not supported", "save it to a file first and pass that file"
            )
        if os.path.isdir(p):
            files, left_out = walk_traces(p)
            found = sorted(str(f) for f in profile_files(files))
            warnings += left_out
            xla = sum(1 for f in found if f.endswith(XPLANE_SUFFIXES))
            if 0 < xla < len(found):
                warnings.append(
                    f"{p}: mixes {xla} XLA profile(s) and {len(found) - xla} Kineto trace(s): they are read as ranks "
                    "of one job; point at the files of one run to analyse it alone"
                )
            if not found:
                why = f" ({left_out[0]})" if left_out else ""
                raise InputError(
                    p,
                    f"directory holds no trace files (*.json, *.json.gz, *.xplane.pb[.gz]){why}",
                    "point at the traces' folder",
                )
            out += found
        elif not os.path.lexists(p) and any(ch in p for ch in "*?["):
            found = sorted(glob.glob(p, recursive=True))
            if not found:
                raise InputError(p, "the pattern matches no file", "check the glob")
            out += found
        else:
            if os.path.lexists(p):
                check_regular(p)
            out.append(p)
    return out, warnings


def expand(paths: list[str]) -> list[str]:
    """The trace files the user named; see `expand_with_warnings` for what is left out of folders."""
    return expand_with_warnings(paths)[0]
