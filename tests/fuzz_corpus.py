"""Bases from the shared fixtures and byte-level mutations for `integration/test_fuzz.py`.

Every mutation is `f(r, raw) -> bytes`, deterministic in the `random.Random` it is given.
JSON byte mutations work on the uncompressed text; protobuf mutations on the `.xplane.pb`
bytes as stored. Token and field positions are computed once per base and cached.
"""

from __future__ import annotations

import functools
import gzip
import re

from tests.builders import shared_fixtures

# ------------------------------------------------------------------ shared bases

# name -> (path under the shared fixtures, kind): the small ones only
SHARED = {
    "mi250_toy": ("kineto/mi250_toy_train.json.gz", "json"),
    "dlrm_rank0": ("kineto/dlrm_8rank/rank0.json.gz", "json"),
    "mi300_gemm_xplane": ("xplane/mi300_jax_gemm.xplane.pb", "xplane"),
}


def shared_available() -> bool:
    return all((shared_fixtures() / rel).is_file() for rel, _ in SHARED.values())


@functools.cache
def shared_bytes(name: str) -> bytes:
    """The base's bytes: decompressed JSON text as written by the profiler, or the protobuf as stored."""
    rel, _ = SHARED[name]
    data = (shared_fixtures() / rel).read_bytes()
    return gzip.decompress(data) if rel.endswith(".gz") else data


# ------------------------------------------------------------------ JSON byte mutations

# Invalid UTF-8: a lone 0xff, a lone continuation byte, an overlong '/', an encoded surrogate,
# a cut 3-byte sequence, a 5-byte form, a 4-byte sequence past U+10FFFF, Latin-1 'é', NUL.
BAD_UTF8 = (b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80",
            b"\xf4\x90\x80\x80", b"\xe9", b"\xfe\xfe", b"\x00", b"\xc3", b"\xef\xbf")

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[,:\[\]{}]', re.S)


@functools.lru_cache(maxsize=8)
def _tokens(raw: bytes) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """(string literal spans, positions of structural characters outside strings)."""
    strings, structural = [], []
    for m in _TOKEN.finditer(raw):
        (strings if raw[m.start()] == 0x22 else structural).append(m.span())
    return tuple(strings), tuple(s for s, _ in structural)


def _insert(raw: bytes, at: list[int], r) -> bytes:
    b = bytearray(raw)
    for p in sorted(at, reverse=True):
        b[p:p] = r.choice(BAD_UTF8) * r.randint(1, 2)
    return bytes(b)


def j_nonutf8_string(r, raw: bytes) -> bytes:
    """Invalid UTF-8 inside string literals (keys and values), 1-5 places."""
    strings, _ = _tokens(raw)
    at = []
    for _ in range(r.randint(1, 5)):
        s, e = r.choice(strings)
        at.append(r.randint(s + 1, e - 1))  # between the quotes, may be just after the opening one
    return _insert(raw, at, r)


def j_nonutf8_between(r, raw: bytes) -> bytes:
    """Invalid UTF-8 between tokens (before or after a , : [ ] { }), 1-5 places."""
    _, structural = _tokens(raw)
    return _insert(raw, [r.choice(structural) + r.randint(0, 1) for _ in range(r.randint(1, 5))], r)


def j_bitflip(r, raw: bytes) -> bytes:
    """Single-bit flips at random offsets (1-10)."""
    b = bytearray(raw)
    for _ in range(r.randint(1, 10)):
        b[r.randrange(len(b))] ^= 1 << r.randrange(8)
    return bytes(b)


def j_flip_gz(r, raw: bytes) -> bytes:
    """Random bytes changed inside the gzip stream (header, deflate data or CRC/size trailer)."""
    b = bytearray(gzip.compress(raw, compresslevel=1))
    for _ in range(r.randint(1, 4)):
        b[r.randrange(len(b))] = r.randrange(256)
    return bytes(b)


def j_multi_member_gz(r, raw: bytes) -> bytes:
    """The same bytes as 2-12 gzip members, concatenated (what `gzip -c a >> t; gzip -c b >> t` or pigz writes): one stream."""
    cuts = sorted(r.sample(range(1, len(raw)), r.randint(1, 11)))
    return b"".join(gzip.compress(raw[a:b], compresslevel=r.choice((1, 6, 9))) for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True))


_ARGS = re.compile(rb'"args"\s*:\s*\{')


def _deep(r) -> bytes:
    n = r.choice((1_100, 5_000, 100_000))  # past orjson's 1,024 and Python's recursion limit
    return b"[" * n + b"]" * n if r.random() < 0.5 else b'{"a":' * n + b"1" + b"}" * n


def j_deep_args(r, raw: bytes) -> bytes:
    """An array or object nested 1,100-100,000 levels as an extra arg of 1-3 events."""
    spots = [m.end() for m in _ARGS.finditer(raw)]
    b = bytearray(raw)
    for at in sorted(r.sample(spots, min(len(spots), r.randint(1, 3))), reverse=True):
        b[at:at] = b'"deep":' + _deep(r) + b","
    return bytes(b).replace(b",}", b"}")


def j_deep_top(r, raw: bytes) -> bytes:
    """A top-level key (not traceEvents) whose value is nested 1,100-100,000 levels."""
    at = raw.index(b"{") + 1
    return raw[:at] + b'"deepMeta":' + _deep(r) + b"," + raw[at:]


_NUMBER_VALUE = re.compile(rb'"(ts|dur|correlation|External id|device|stream)"\s*:\s*-?\d[\d.eE+\-]*')
HUGE_LITERALS = (b"99999999999999999999999", b"-99999999999999999999999", b"1e400", b"-1e400", b"18446744073709551617",
                 b"9223372036854775808", b"1" * 400, b"0." + b"0" * 400 + b"1")


def j_huge_literal(r, raw: bytes) -> bytes:
    """Number literals past int64 or float range (kept as text, as a hostile writer would) in 1-5 numeric fields."""
    spots = [m for m in _NUMBER_VALUE.finditer(raw)]
    b = bytearray(raw)
    for m in sorted(r.sample(spots, min(len(spots), r.randint(1, 5))), key=lambda m: -m.start()):
        colon = raw.index(b":", m.start(1)) + 1
        b[colon:m.end()] = r.choice(HUGE_LITERALS)
    return bytes(b)


def j_huge_string(r, raw: bytes) -> bytes:
    """One string value of 2-24 MiB (a name, a category or an arg), in place of an existing one."""
    strings, _ = _tokens(raw)
    s, e = r.choice(strings[len(strings) // 4:])  # past the header keys
    unit = r.choice((b"x", b"\\u00e9", b"ab"))
    return raw[:s] + b'"' + unit * ((r.randint(2, 24) << 20) // len(unit)) + b'"' + raw[e:]


JSON_BYTES = {
    "nonutf8_string": j_nonutf8_string,
    "nonutf8_between": j_nonutf8_between,
    "bitflip": j_bitflip,
    "flip_gz": j_flip_gz,
    "multi_member_gz": j_multi_member_gz,
    "deep_args": j_deep_args,
    "deep_top": j_deep_top,
    "huge_literal": j_huge_literal,
    "huge_string": j_huge_string,
}
GZ_OUTPUT = {"flip_gz", "multi_member_gz"}  # written as .json.gz


# ------------------------------------------------------------------ protobuf mutations


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(b: bytes, i: int, end: int) -> tuple[int, int] | None:
    n = shift = 0
    while i < end and shift < 70:
        c = b[i]
        n |= (c & 0x7F) << shift
        i += 1
        if not c & 0x80:
            return n, i
        shift += 7
    return None


def _walk(b: bytes, lo: int, hi: int, out: list, depth: int) -> bool:
    """Collect (length offset, length bytes, payload length) of every length-delimited field of the
    message in b[lo:hi], descending into payloads that parse as messages. False if it does not parse."""
    i, found = lo, []
    while i < hi:
        t = _read_varint(b, i, hi)
        if t is None or t[0] >> 3 == 0:
            return False
        key, i = t
        wt = key & 7
        if wt == 0:
            v = _read_varint(b, i, hi)
            if v is None:
                return False
            i = v[1]
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            v = _read_varint(b, i, hi)
            if v is None or v[1] + v[0] > hi:
                return False
            found.append((i, v[1] - i, v[0], v[1]))
            i = v[1] + v[0]
        else:
            return False
    if i != hi:
        return False
    for off, nlen, plen, start in found:
        out.append((off, nlen, plen))
        if depth < 12 and plen:
            sub: list = []
            if _walk(b, start, start + plen, sub, depth + 1):
                out.extend(sub)
    return True


@functools.lru_cache(maxsize=4)
def pb_fields(raw: bytes) -> tuple[tuple[int, int, int], ...]:
    out: list = []
    _walk(raw, 0, len(raw), out, 0)
    return tuple(out)


HUGE_LEN = (2**31 - 1, 2**31, 2**32 + 5, 2**62, 2**63 - 1, 2**64 - 1, 1 << 60)


def p_flip(r, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(r.randint(1, 10)):
        p = r.randrange(len(b))
        if r.random() < 0.5:
            b[p] = r.randrange(256)
        else:
            b[p] ^= 1 << r.randrange(8)
    return bytes(b)


def p_insert(r, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(r.randint(1, 6)):
        p = r.randrange(len(b) + 1)
        b[p:p] = bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
    return bytes(b)


def p_delete(r, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(r.randint(1, 6)):
        p = r.randrange(len(b))
        del b[p : p + r.randint(1, 32)]
    return bytes(b)


def p_truncate(r, raw: bytes) -> bytes:
    return raw[: r.randrange(0, len(raw))]


def p_huge_length(r, raw: bytes) -> bytes:
    """A length-delimited field (at any depth) given a huge or off-by-some length, or a huge one appended."""
    fields = pb_fields(raw)
    if not fields or r.random() < 0.15:
        return raw + _varint(r.randint(1, 12) << 3 | 2) + _varint(r.choice(HUGE_LEN)) + b"x" * r.randint(0, 8)
    out = bytearray(raw)
    for off, nlen, plen in sorted(r.sample(fields, min(len(fields), r.randint(1, 3))), reverse=True):
        n = r.choice(HUGE_LEN + (plen + 1, plen + 1000, len(raw)))
        out[off : off + nlen] = _varint(n)
    return bytes(out)


PB_BYTES = {
    "pb_flip": p_flip,
    "pb_insert": p_insert,
    "pb_delete": p_delete,
    "pb_truncate": p_truncate,
    "pb_huge_length": p_huge_length,
}


# ------------------------------------------------------------------ numbers and links beyond any real trace
# Structured (`f(r, doc)`, on the parsed JSON): GEMM dims whose tiles leave int64, kernels no op can be tied to,
# correlation ids taken by another launch's kernel, a distributedInfo out of range. Each must end in a warning or a
# clean error: no traceback, no negative or impossible number.

HUGE_DIMS = ([[10**12, 10**12], [10**12, 10**12]], [[1 << 40, 1 << 10], [1 << 10, 1 << 40]], [[1 << 31, 1 << 31], [1 << 31, 1 << 31]])


def s_huge_gemm_dims(r, doc) -> None:
    """Matmul ops (1-3) given Input Dims far beyond any real GEMM."""
    mms = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("name") in ("aten::mm", "aten::addmm", "aten::linear")]
    for e in r.sample(mms, min(len(mms), r.randint(1, 3))):
        e.setdefault("args", {})["Input Dims"] = r.choice(HUGE_DIMS)


def s_untied_kernels(r, doc) -> None:
    """Every cpu_op, or every runtime launch, left out: no kernel can be tied to an op."""
    cat = r.choice(("cpu_op", "cuda_runtime"))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (isinstance(e, dict) and e.get("cat") == cat)]


def s_correlation_collision(r, doc) -> None:
    """1-3 kernels given the correlation id of another kernel's launch."""
    ks = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "kernel" and isinstance(e.get("args"), dict)]
    if len(ks) < 2:
        return
    for _ in range(r.randint(1, 3)):
        a, b = r.sample(ks, 2)
        b["args"]["correlation"] = a["args"].get("correlation")


def s_ranks_out_of_range(r, doc) -> None:
    """A distributedInfo whose rank or world size no job has."""
    doc["distributedInfo"] = {"rank": r.choice((-1, 0, 1 << 40)), "world_size": r.choice((-8, 0, 1 << 40, 2))}


PLANTED_SECRET = "Zq8plantedSecretValue"  # no output may copy it, wherever it was planted
_PLANTS = (
    lambda e: e.__setitem__("name", f"load https://user:{PLANTED_SECRET}@host/x"),
    lambda e: e.__setitem__("name", f"{e.get('name', '')} password={PLANTED_SECRET}"),
    lambda e: e.__setitem__("cat", f"token={PLANTED_SECRET}"),
    lambda e: e.setdefault("args", {}).__setitem__("api_key", PLANTED_SECRET),
    lambda e: e.setdefault("args", {}).__setitem__("Concrete Inputs", ["", f"Bearer {PLANTED_SECRET}"]),
    lambda e: e.setdefault("args", {}).__setitem__("note", f"AWS_SECRET_ACCESS_KEY={PLANTED_SECRET}"),
)


def s_planted_secret(r, doc) -> None:
    """A secret planted in 1-3 events' names, categories or args, and in the trace's metadata."""
    evs = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    for e in r.sample(evs, min(len(evs), r.randint(1, 3))):
        r.choice(_PLANTS)(e)
    doc["secret"] = PLANTED_SECRET


STRUCTURED_NUMBERS = {
    "huge_gemm_dims": s_huge_gemm_dims,
    "untied_kernels": s_untied_kernels,
    "correlation_collision": s_correlation_collision,
    "ranks_out_of_range": s_ranks_out_of_range,
    "planted_secret": s_planted_secret,
}
