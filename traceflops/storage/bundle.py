"""Small bundles of polars tables plus JSON metadata, in one zip file.

Used for the parsed-trace cache and for per-rank summaries. Written atomically
(temporary file, then rename); read back with size limits, since a summary may
come from someone else's machine: parquet and JSON only, never pickle.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceflops.core.errors import FormatError, InputError
from traceflops.core.files import open_if_regular, write_atomic
from traceflops.core.sections import json_default

MAX_MEMBER_BYTES = 4 << 30
MAX_MEMBERS = 64
MAX_BUNDLE_BYTES = 16 << 30  # all members inflated together: a parsed-trace cache entry of a huge trace
_REDO = "recreate it with `traceflops summarize`"


def _write_zip(into, tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    with zipfile.ZipFile(into, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(
            "meta.json",
            orjson.dumps(meta, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS),
        )
        for name, df in tables.items():
            buf = io.BytesIO()
            df.write_parquet(buf, compression="zstd")
            z.writestr(f"{name}.parquet", buf.getvalue())


def write_bundle(path: str | Path, tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: _write_zip(tmp, tables, meta))


def bundle_bytes(tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> bytes:
    """The bundle `write_bundle` writes, as bytes (`read_bundle` reads them from a `BytesIO`)."""
    buf = io.BytesIO()
    _write_zip(buf, tables, meta)
    return buf.getvalue()


def open_regular(path: str | os.PathLike, max_bytes: int):
    """The bundle file opened for reading: InputError when it is missing, unreadable or not a regular file (a pipe,
    /dev/zero), FormatError past `max_bytes`."""
    try:
        f, st = open_if_regular(path)
    except FileNotFoundError:
        raise InputError(str(path), "no such file", "check the path") from None
    except OSError as e:
        raise InputError(str(path), f"cannot be opened ({e.strerror})", "check the path and its permissions") from None
    if f is None:
        raise InputError(str(path), "is not a regular file", "save it to a file first and pass that file")
    if st.st_size > max_bytes:
        f.close()
        raise FormatError(str(path), f"is larger than a traceflops bundle can be ({st.st_size} bytes)", _REDO)
    return f


def _members_fit(infos: list[zipfile.ZipInfo], max_bytes: int) -> bool:
    """Few members, each and all together within bounds, by what the zip declares (zipfile reads no more than that)."""
    return (
        len(infos) <= MAX_MEMBERS
        and all(i.file_size <= MAX_MEMBER_BYTES for i in infos)
        and sum(i.file_size for i in infos) <= max_bytes
    )


def _table(data: bytes, max_rows: int | None) -> pl.DataFrame:
    """A parquet member, refused when it holds more than `max_rows` rows (read from its footer, before decoding any).

    Each column is made one piece, as the parser builds them: read back, a column comes in pieces (its row groups and
    pages), and every later query over a table in pieces paid for it (a cached 476 MB trace's analysis: 17% more CPU).
    """
    if max_rows is not None and pl.scan_parquet(io.BytesIO(data)).select(pl.len()).collect().item() > max_rows:
        raise ValueError(f"more than {max_rows} rows")
    return pl.read_parquet(io.BytesIO(data)).rechunk()


def _one_line(e: Exception) -> str:
    """An exception's message on one line, short (polars' messages span several)."""
    return " ".join(str(e).split())[:200]


def read_bundle(
    path, *, max_bytes: int = MAX_BUNDLE_BYTES, max_rows: int | None = None, name: str | None = None
) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """A bundle's tables and metadata; `path` is a path (opened as a regular file) or an open binary file named `name`.

    `max_bytes` bounds the file and its members inflated together; `max_rows`, each table.
    """
    where = name or str(path)
    if isinstance(path, (str, os.PathLike)):
        with open_regular(path, max_bytes) as f:
            return read_bundle(f, max_bytes=max_bytes, max_rows=max_rows, name=where)
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise FormatError(where, f"not a traceflops bundle ({e})", _REDO) from None
    with z:
        infos = z.infolist()
        if not _members_fit(infos, max_bytes):
            raise FormatError(where, "bundle members are too many or too large", _REDO)
        names = {i.filename for i in infos}
        if "meta.json" not in names:
            raise FormatError(where, "no meta.json in the bundle", _REDO)
        try:
            meta = orjson.loads(z.read("meta.json"))
            tables = {n[: -len(".parquet")]: _table(z.read(n), max_rows) for n in names if n.endswith(".parquet")}
        except Exception as e:
            raise FormatError(where, f"bundle cannot be read ({type(e).__name__}: {_one_line(e)})", _REDO) from None
    return tables, meta
