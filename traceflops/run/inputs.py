"""Expanding what the user named (files, directories, globs) into trace files."""

from __future__ import annotations

import glob
from pathlib import Path

from traceflops.core.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb", ".xplane.pb.gz")
XPLANE_SUFFIXES = (".xplane.pb", ".xplane.pb.gz")
JAX_JSON_SUFFIX = ".trace.json.gz"  # what jax.profiler writes beside each host's xplane: the same profile, converted


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def _stem(name: str, suffixes: tuple[str, ...]) -> str | None:
    return next((name[: -len(s)] for s in suffixes if name.endswith(s)), None)


def profile_files(files: list[Path]) -> list[Path]:
    """A folder's traces, a `jax.profiler` log directory's `<host>.trace.json.gz` left out beside its `<host>.xplane.pb`."""
    xplanes = {(f.parent, _stem(f.name, XPLANE_SUFFIXES)) for f in files if _stem(f.name, XPLANE_SUFFIXES) is not None}
    return [f for f in files if (f.parent, _stem(f.name, (JAX_JSON_SUFFIX,))) not in xplanes]


def expand(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in profile_files([f for f in path.rglob("*") if f.is_file() and is_trace_name(f.name)]))
            if not found:
                raise InputError(p, "directory holds no trace files (*.json, *.json.gz, *.xplane.pb[.gz])", "point at the traces' folder")
            out += found
        elif any(ch in p for ch in "*?["):
            found = sorted(glob.glob(p, recursive=True))
            if not found:
                raise InputError(p, "the pattern matches no file", "check the glob")
            out += found
        else:
            out.append(p)
    return out
