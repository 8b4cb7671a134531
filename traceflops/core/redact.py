"""Secrets out of anything traceflops writes: redaction by key name and by value shape, pure (no I/O).

Entry points:

* `redact(value)` — a JSON-like value (a trace's metadata: the top-level keys
  beside `traceEvents`, a metadata event's args) with every rule below applied;
  returns the copy and how many values or parts of values were replaced.
* `redact_string(text)` — the value rules (3. below) on one free-text string.
* `redact_trace(trace)` — the parsed `Trace` as every report sees it: each text
  column (event names, categories, labels, kernel names, collective fields,
  `Concrete Inputs` and the other recorded inputs) through `redact_string`,
  decided once per distinct value and only for the values `MAY_CHANGE` finds
  (polars' regex over the column); its warnings (an unknown category's name)
  and metadata likewise. `parsers.parse` applies it, so terminal, JSON, HTML,
  tables, summaries, merges, diffs and the parsed-trace cache copy no secret.
* `Redactor` — `redact`'s rules over many events (annotate's pass over the
  user's trace): names, categories and args, each distinct string and key
  decided once.
* `redact_text(text)` / `redact_bytes(data)` — only the value-shape rules that
  are safe inside any text, serialized JSON included (they never match a quote
  or a backslash): credentials in URLs and token-shaped strings. Cheap enough to
  run over a whole written trace in one pass.

Rules, in the order they apply:

1. A key whose name looks secret (`is_secret_key`: token, secret, password,
   passwd, pwd, passphrase, credential, auth (authorization, not author), api key, private key,
   access key, pat, openai, anthropic, cookie, signature, sig, jwt, bearer, or a
   name ending in `key`; case-insensitive, camelCase split): its STRING value
   is replaced whole, and every string inside a mapping or list it holds.
   Numbers, booleans and null are kept: `num_tokens: 512`, `max_tokens: 128`
   are counts, never credentials. `tokenizer` is not a secret name.
2. A mapping named env / envs / environ / environment / env_vars /
   environment_variables: every value is replaced; a `NAME=value` string
   (an env given as a list) keeps its NAME.
3. In every other string (`redact_string`):
   - a URL's userinfo password: `tcp://user:pw@host:29500` → `tcp://user:<redacted>@host:29500`
     (scheme, user and host kept);
   - `NAME=value` where NAME looks secret: query parameters (`?token=…&sig=…`),
     `KEY=value` pairs in command lines and connection strings (`Password=…;`);
   - command-line flags whose name looks secret: `--hf-token X`, `--api-key=X`,
     `--password "a b"` (a following flag is not taken as the value; a number or dotted version is kept;
     `pkg==1.2` pins are not pairs);
   - `Bearer …` / `Basic …` credentials;
   - token-shaped strings (`TOKEN_RES`): GitHub (ghp_, gho_, ghu_, ghs_, ghr_,
     github_pat_), Hugging Face (hf_), OpenAI / Anthropic (sk-…), Slack (xox?-),
     AWS access key ids (AKIA…, ASIA…), Google API keys (AIza…), GitLab (glpat-),
     npm (npm_), JSON Web Tokens (eyJ….eyJ….…) and PEM private key blocks.

Chosen not to redact: long high-entropy strings without a known prefix (git
hashes, kernel name suffixes, device UUIDs and cache keys look the same and
users need them), short `-p` style flags, and `user@host` without a password.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import polars as pl

    from traceflops.core.trace import Trace

REDACTED = "<redacted by traceflops>"  # what a whole value becomes
INLINE = "<redacted>"  # what the secret part of a longer string becomes
ENV_KEYS = frozenset({"env", "envs", "environ", "environment", "env_vars", "environment_variables"})

_SECRET_NAME = re.compile(
    r"token(?!i[sz])|secret|passw(?:or)?d|passphrase|(?:^|_)pwd(?:$|_)|credential|auth(?!or(?!i[sz]))|api_?key|private_?key|access_?key"
    r"|(?:^|_)pat(?:$|_)|openai|anthropic|cookie|signature|(?:^|_)sig(?:$|_)|(?:^|_)jwt(?:$|_)|bearer|(?:^|_)key$"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")

# Token shapes, each led by its literal prefix (so a search skips ahead to it; the lookbehind right after the
# prefix says it is not glued to a longer word on the left: kernel names are words joined by '_').
_EDGE = r"(?<![A-Za-z0-9_\-]{p})"
_SHAPES = (
    ("gh", r"gh[pousr]_[A-Za-z0-9]{20,}"),
    ("github_pat_", r"github_pat_[A-Za-z0-9_]{20,}"),
    ("hf_", r"hf_[A-Za-z0-9]{16,}"),
    ("sk-", r"sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}"),
    ("xox", r"xox[abposr]-[A-Za-z0-9\-]{10,}"),
    ("AKIA", r"AKIA[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("ASIA", r"ASIA[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("AIza", r"AIza[0-9A-Za-z_\-]{35}"),
    ("glpat-", r"glpat-[A-Za-z0-9_\-]{20,}"),
    ("npm_", r"npm_[A-Za-z0-9]{36}"),
    ("eyJ", r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
)
TOKEN_RES = tuple(re.compile(lit + _EDGE.format(p=re.escape(lit)) + pat[len(lit) :]) for lit, pat in _SHAPES) + (
    re.compile(r"-----BEGIN[A-Z ]*PRIVATE KEY-----[A-Za-z0-9+/=\s\\n]*?-----END[A-Z ]*PRIVATE KEY-----"),
)
# scheme://user:password@ — the password runs to the last '@' of the authority; never across a quote or backslash.
URL_PASSWORD_RE = re.compile(r"(?P<head>://(?<=[A-Za-z0-9+.\-]://)[^\s:/@\"'\\]*:)(?P<pw>[^\s/?#\"'\\]+)(?=@)")
_NAME_VALUE = re.compile(
    r"(?P<head>(?:^|(?<=[\s?&;,(\[{\"'])|(?<=--)|(?<=[\s?&;,]-))(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\s*=(?![=~])\s*)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&;,#\"']+)"
)
_FLAG_SPACE = re.compile(
    r"(?P<head>(?:^|(?<=\s))--(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*)\s+)(?P<value>\"[^\"]*\"|'[^']*'|[^\s\-][^\s]*)"
)
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=\-]{8,})", re.IGNORECASE)
# a number or a dotted version is kept as a value (`--max-tokens 128`, `tokenizers=0.21.1`); a secret is neither
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|v?\d+(?:\.\d+)+(?:[.+\-_]?[A-Za-z0-9]+)*")

_ENV_ITEM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*=.*", re.DOTALL)

# What a string holds whenever a rule of `redact_string` can change it: a pair's '=', a flag's '--', a URL's '://',
# Bearer / Basic, a token shape's literal prefix. Polars runs it over a whole column (Rust's regex, literal-led), so
# Python's rules run only on the few distinct values it finds.
MAY_CHANGE = (
    r"=|--|://|(?i:bearer|basic)|gh[pousr]_|github_pat_|hf_|sk-|xox[abposr]-|AKIA|ASIA|AIza|glpat-|npm_|eyJ"
    r"|-----BEGIN"
)

# MAY_CHANGE as literals matched ignoring ASCII case (a superset: `gh[pousr]_` spelled out, `AKIA` also as `akia`),
# for a scan of whole texts by Aho-Corasick (polars' `contains_any`); not for a text with other than ASCII.
MAY_CHANGE_LITERALS = (
    "=",
    "--",
    "://",
    "bearer",
    "basic",
    *(f"gh{c}_" for c in "pousr"),
    "github_pat_",
    "hf_",
    "sk-",
    *(f"xox{c}-" for c in "abposr"),
    "akia",
    "asia",
    "aiza",
    "glpat-",
    "npm_",
    "eyj",
)

_SHAPE_RES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (URL_PASSWORD_RE, lambda m: m.group("head") + INLINE),
    *((r, INLINE) for r in TOKEN_RES),
)
_SHAPE_BYTES = tuple(
    (re.compile(r.pattern.encode()), (lambda m: m.group("head") + INLINE.encode()) if callable(to) else to.encode())
    for r, to in _SHAPE_RES
)


def is_secret_key(name: Any) -> bool:
    """Whether a key, flag or parameter name looks like it names a credential (`tokenizer`, `monkey`, `author` do
    not)."""
    words = _SEPARATORS.sub("_", _CAMEL.sub("_", str(name)).lower())
    return bool(_SECRET_NAME.search(words))


def _secret_pair(m: re.Match) -> bool:
    return is_secret_key(m.group("name")) and not _NUMBER.fullmatch(m.group("value").strip("\"'"))


def _apply(rules, data):
    n = 0
    for r, to in rules:
        data, m = r.subn(to, data)
        n += m
    return data, n


def redact_text(text: str) -> tuple[str, int]:
    """Only the shape rules safe anywhere (URL passwords, token shapes): the new text and how many parts were
    replaced."""
    return _apply(_SHAPE_RES, text)


def redact_bytes(data: bytes) -> tuple[bytes, int]:
    """`redact_text` over serialized JSON (or any bytes), one pass per rule (each led by a literal: ~150 MB/s in all);
    a long text first searched for the rules' leading literals in one pass, and left as it is where none is found.

    The replacements contain nothing JSON escapes, and no rule matches a quote or a backslash escape's start.
    """
    if len(data) >= _SCAN_FROM and not _may_match(data):
        return data, 0
    return _apply(_SHAPE_BYTES, data)


# What each shape rule starts with, case as written (`URL_PASSWORD_RE`, `TOKEN_RES`; `gh[pousr]_` spelled out, as
# "gh" alone is in every "weight"): a text holding none of them is one no rule changes. Searched for at once
# (Aho-Corasick in polars: ~400 MB/s against the rules' ~150 MB/s) in texts long enough to repay building a series.
_LEADS = ["://", "-----BEGIN", *(f"gh{c}_" for c in "pousr"), *(lead for lead, _ in _SHAPES if lead != "gh")]
_SCAN_FROM = 1 << 18


def any_lead(texts: pl.Series) -> bool:
    """Whether any of `texts` (a text column) holds a shape rule's leading literal: a text built from pieces none of
    which holds one, joined where no lead can span the join, is one no shape rule changes."""
    return bool(texts.str.contains_any(_LEADS).any())


def _may_match(data: bytes) -> bool:
    """Whether `data` holds a leading literal of a shape rule. Bytes that are not UTF-8 are read as U+FFFD: every
    ASCII byte is kept as it is, so an (ASCII) lead is found in the text exactly where it is in the bytes."""
    import polars as pl

    return any_lead(pl.Series([data.decode("utf-8", "replace")], dtype=pl.Utf8))


def redact_string(text: str) -> tuple[str, int]:
    """Every value-shape rule on one free-text string (a URL, a command line, a label): the new text and the count."""
    n = 0

    def pair(m: re.Match) -> str:
        nonlocal n
        if not _secret_pair(m):
            return m.group(0)
        n += 1
        return m.group("head") + INLINE

    text = _NAME_VALUE.sub(pair, text)
    text = _FLAG_SPACE.sub(pair, text)
    text, b = _BEARER.subn(lambda m: m.group("head") + INLINE, text)
    text, c = redact_text(text)
    return text, n + b + c


def _env_item(v: Any) -> Any:
    """An item of an environment given as a list: `NAME=value` keeps its NAME, anything else is replaced whole."""
    if isinstance(v, str) and _ENV_ITEM.fullmatch(v):
        return v.split("=", 1)[0] + "=" + REDACTED
    return REDACTED


def redact(value: Any) -> tuple[Any, int]:
    """A redacted copy of a JSON-like value (rules in the module doc) and how many values or parts were replaced."""
    r = Redactor()
    return r.walk(value), r.count


_PLAIN, _SECRET, _ENV = 0, 1, 2
_MAY_CHANGE_RE = re.compile(MAY_CHANGE)
_CACHED = 1 << 16  # distinct strings (and keys) remembered; past it the memory starts over


class Redactor:
    """`redact`'s rules over many values (annotate's pass over every event of a trace), each distinct string and key
    decided once.

    `count` is how many values or parts of values were replaced, each occurrence counted.
    """

    def __init__(self) -> None:
        self.count = 0
        self._strings: dict[str, tuple[str, int]] = {}
        self._keys: dict[Any, tuple[Any, int, int]] = {}

    def string(self, text: str) -> str:
        got = self._strings.get(text)
        if got is None:
            got = redact_string(text) if _MAY_CHANGE_RE.search(text) else (text, 0)
            if len(self._strings) >= _CACHED:
                self._strings.clear()
            self._strings[text] = got
        self.count += got[1]
        return got[0]

    def _key(self, k: Any) -> tuple[Any, int, int]:
        """A key as written (shape rules), how many parts of it were replaced, and what its value is: plain, secret, an
        environment."""
        key, m = redact_text(k) if isinstance(k, str) else (k, 0)
        got = (key, m, _ENV if str(k).lower() in ENV_KEYS else _SECRET if is_secret_key(k) else _PLAIN)
        if len(self._keys) >= _CACHED:
            self._keys.clear()
        self._keys[k] = got  # JSON keys are strings: hashable
        return got

    def _whole(self, v: Any, env: bool, item: bool = False) -> Any:
        """Inside a secret key or an environment: every string (env: every non-null value) replaced."""
        if isinstance(v, dict):
            return {k: self._whole(x, env) for k, x in v.items()}
        if isinstance(v, list):
            return [self._whole(x, env, item=True) for x in v]
        if v is None or v == "" or (not env and not isinstance(v, str)):
            return v
        self.count += 1
        return _env_item(v) if env and item else REDACTED

    def walk(self, v: Any) -> Any:
        """A redacted copy of a JSON-like value (a string, a mapping, a list; anything else as it is)."""
        c = v.__class__
        if c is int or c is float or v is None:  # most of a trace's args (ids, shapes)
            return v
        if c is str:
            return self.string(v)
        if isinstance(v, dict):
            out = {}
            keys = self._keys
            for k, x in v.items():
                key, m, kind = keys.get(k) or self._key(k)
                self.count += m
                if kind == _PLAIN:
                    out[key] = x if x.__class__ is int else self.walk(x)
                else:
                    out[key] = self._whole(x, kind == _ENV)
            return out
        if isinstance(v, list):
            return [x if x.__class__ is int else self.walk(x) for x in v]
        if isinstance(v, str):
            return self.string(v)
        return v

    def event(self, e: dict) -> None:
        """A trace event redacted in place: its name, category and args (by key name and by value)."""
        for f in ("name", "cat"):
            v = e.get(f)
            if v.__class__ is str:
                new = self.string(v)
                if new is not v:
                    e[f] = new
        args = e.get("args")
        if args.__class__ is dict and args:
            e["args"] = self.walk(args)


# --- the parsed trace ------------------------------------------------------------------

JSON_COLUMNS = frozenset({"dims", "types", "concrete", "strides", "pg_ranks"})  # recorded values kept as JSON text


def _json_text(text: str) -> tuple[str, int]:
    """JSON text with `redact`'s rules applied to the value it holds (text that is not JSON: `redact_string`'s)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return redact_string(text)
    new, n = redact(value)
    return (orjson.dumps(new).decode(), n) if n else (text, 0)


def redact_column(s: pl.Series, json: bool = False) -> tuple[pl.Series, int]:
    """A text column with `redact_string`'s rules (`json`: JSON text, `redact`'s on its value), and how many distinct
    values changed.

    Polars finds the distinct values `MAY_CHANGE` matches; the rules run once on each; a column nothing changes
    is returned as it is (no copy).
    """
    import polars as pl

    if s.dtype != pl.Utf8 or s.len() == 0 or s.null_count() == s.len():
        return s, 0
    distinct = s.drop_nulls().unique()  # hashing the rows is cheaper than a regex over each (long kernel names repeat)
    hits = distinct.filter(distinct.str.contains(MAY_CHANGE))
    if not hits.len():
        return s, 0
    rule = _json_text if json else redact_string
    changed = {}
    for v in hits.to_list():
        new, n = rule(v)
        if n:
            changed[v] = new
    if not changed:
        return s, 0
    return s.replace(changed), len(changed)


def redact_frame(df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Every text column of a frame through `redact_column` (`JSON_COLUMNS` as JSON); the frame itself when nothing
    changed."""
    new, n = [], 0
    for c in df.columns:
        col, m = redact_column(df[c], json=c in JSON_COLUMNS)
        if m:
            new.append(col)
            n += m
    return (df.with_columns(new) if new else df), n


def redact_trace(trace: Trace) -> Trace:
    """The trace with every string a report can copy redacted: its tables' text, its warnings, its metadata.

    The file's own path (`meta['path']`, the name the user gave) is kept. Ops stay in thread order
    (`core.trace.thread_order`) should a redacted pid or tid sort elsewhere.
    """
    from traceflops.core.trace import Warnings, thread_order

    tables, n = {}, 0
    for t in ("ops", "kernels", "launches", "markers", "steps"):
        tables[t], m = redact_frame(getattr(trace, t))
        n += m
    if tables["ops"] is not trace.ops and any(not tables["ops"][c].equals(trace.ops[c]) for c in ("pid", "tid")):
        tables["ops"] = thread_order(tables["ops"])
    counts: Counter = Counter()
    for reason, k in trace.warnings.counts.items():
        new, m = redact_string(reason) if isinstance(reason, str) else (reason, 0)
        counts[new] += k
        n += m
    meta, m = redact(trace.meta)
    if "path" in trace.meta:
        meta["path"] = trace.meta["path"]
    if not n and not m:
        return trace
    return dataclasses.replace(trace, **tables, meta=meta, warnings=Warnings(counts))
