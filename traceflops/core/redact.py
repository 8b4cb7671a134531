"""Secrets out of anything traceflops writes: redaction by key name and by value shape, pure (no I/O).

Two entry points:

* `redact(value)` — a JSON-like value (a trace's metadata: the top-level keys
  beside `traceEvents`, a metadata event's args) with every rule below applied;
  returns the copy and how many values or parts of values were replaced.
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

import re
from typing import Any

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
TOKEN_RES = tuple(re.compile(lit + _EDGE.format(p=re.escape(lit)) + pat[len(lit):]) for lit, pat in _SHAPES) + (
    re.compile(r"-----BEGIN[A-Z ]*PRIVATE KEY-----[A-Za-z0-9+/=\s\\n]*?-----END[A-Z ]*PRIVATE KEY-----"),
)
# scheme://user:password@ — the password runs to the last '@' of the authority; never across a quote or backslash.
URL_PASSWORD_RE = re.compile(r"(?P<head>://(?<=[A-Za-z0-9+.\-]://)[^\s:/@\"'\\]*:)(?P<pw>[^\s/?#\"'\\]+)(?=@)")
_NAME_VALUE = re.compile(r"(?P<head>(?:^|(?<=[\s?&;,(\[{\"'])|(?<=--)|(?<=[\s?&;,]-))(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\s*=(?![=~])\s*)"
                         r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s&;,#\"']+)")
_FLAG_SPACE = re.compile(r"(?P<head>(?:^|(?<=\s))--(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*)\s+)(?P<value>\"[^\"]*\"|'[^']*'|[^\s\-][^\s]*)")
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=\-]{8,})", re.IGNORECASE)
# a number or a dotted version is kept as a value (`--max-tokens 128`, `tokenizers=0.21.1`); a secret is neither
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|v?\d+(?:\.\d+)+(?:[.+\-_]?[A-Za-z0-9]+)*")

_ENV_ITEM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*=.*", re.DOTALL)

_SHAPE_RES = ((URL_PASSWORD_RE, lambda m: m.group("head") + INLINE), *((r, INLINE) for r in TOKEN_RES))
_SHAPE_BYTES = tuple((re.compile(r.pattern.encode()), (lambda m: m.group("head") + INLINE.encode()) if callable(to) else to.encode())
                     for r, to in _SHAPE_RES)


def is_secret_key(name: Any) -> bool:
    """Whether a key, flag or parameter name looks like it names a credential (`tokenizer`, `monkey`, `author` do not)."""
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
    """Only the shape rules safe anywhere (URL passwords, token shapes): the new text and how many parts were replaced."""
    return _apply(_SHAPE_RES, text)


def redact_bytes(data: bytes) -> tuple[bytes, int]:
    """`redact_text` over serialized JSON (or any bytes), one pass per rule (each led by a literal: ~150 MB/s in all).

    The replacements contain nothing JSON escapes, and no rule matches a quote or a backslash escape's start.
    """
    return _apply(_SHAPE_BYTES, data)


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
    n = 0

    def whole(v: Any, env: bool, item: bool = False) -> Any:
        """Inside a secret key or an environment: every string (env: every non-null value) replaced."""
        nonlocal n
        if isinstance(v, dict):
            return {k: whole(x, env) for k, x in v.items()}
        if isinstance(v, list):
            return [whole(x, env, item=True) for x in v]
        if v is None or v == "" or (not env and not isinstance(v, str)):
            return v
        n += 1
        return _env_item(v) if env and item else REDACTED

    def walk(v: Any) -> Any:
        nonlocal n
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                key, m = redact_text(k) if isinstance(k, str) else (k, 0)
                n += m
                if str(k).lower() in ENV_KEYS:
                    out[key] = whole(x, True)
                elif is_secret_key(k):
                    out[key] = whole(x, False)
                else:
                    out[key] = walk(x)
            return out
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            s, m = redact_string(v)
            n += m
            return s
        return v

    return walk(value), n
