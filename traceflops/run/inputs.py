"""Expanding what the user named (files, directories, globs) into trace files."""

from __future__ import annotations

import glob
from pathlib import Path

from traceflops.core.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb")


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def expand(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*") if f.is_file() and is_trace_name(f.name))
            if not found:
                raise InputError(p, "directory holds no trace files (*.json, *.json.gz, *.xplane.pb)", "point at the traces' folder")
            out += found
        elif any(ch in p for ch in "*?["):
            found = sorted(glob.glob(p, recursive=True))
            if not found:
                raise InputError(p, "the pattern matches no file", "check the glob")
            out += found
        else:
            out.append(p)
    return out
