"""Small bundles of polars tables plus JSON metadata, in one zip file.

Used for the parsed-trace cache and for per-rank summaries. Written atomically
(temporary file, then rename); read back with size limits, since a summary may
come from someone else's machine: parquet and JSON only, never pickle.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceflops.core.errors import FormatError, InputError
from traceflops.core.files import write_atomic

MAX_MEMBER_BYTES = 4 << 30
MAX_MEMBERS = 64


def write_bundle(path: str | Path, tables: dict[str, pl.DataFrame], meta: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr("meta.json", orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
            for name, df in tables.items():
                buf = io.BytesIO()
                df.write_parquet(buf, compression="zstd")
                z.writestr(f"{name}.parquet", buf.getvalue())

    write_atomic(path, write)


def read_bundle(path: str | Path) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    try:
        z = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise InputError(str(path), "no such file", "check the path") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise FormatError(str(path), f"not a traceflops bundle ({e})", "recreate it with `traceflops summarize`") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS or any(i.file_size > MAX_MEMBER_BYTES for i in infos):
            raise FormatError(str(path), "bundle members are too many or too large", "recreate it with `traceflops summarize`")
        names = {i.filename for i in infos}
        if "meta.json" not in names:
            raise FormatError(str(path), "no meta.json in the bundle", "recreate it with `traceflops summarize`")
        try:
            meta = orjson.loads(z.read("meta.json"))
            tables = {n[: -len(".parquet")]: pl.read_parquet(io.BytesIO(z.read(n))) for n in names if n.endswith(".parquet")}
        except Exception as e:  # noqa: BLE001 - any decoding failure of an untrusted bundle is a format error
            raise FormatError(str(path), f"bundle cannot be read ({type(e).__name__})", "recreate it with `traceflops summarize`") from None
    return tables, meta
