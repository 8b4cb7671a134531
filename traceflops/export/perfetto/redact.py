"""The secrets rules (`core/redact.py`) applied to what annotate writes: annotate never adds a secret and copies none
the rules find.

The other top-level keys are kept (it is the user's own
trace) but redacted by key name and by value shape (`core.redact.redact`:
environments, credential-named keys, URL passwords, secret query parameters,
flags and `KEY=value` pairs, `Bearer` credentials, token-shaped strings), and
so is every decoded event (`core.redact.Redactor`, each distinct string and key
decided once): its name and category by value, its args by key name
(`password`, `secret`, `api_key`, ...) and by value. The parser's trace is
redacted by the same rules (`parsers.parse`), so the analysis' names still
match the written ones. The whole written trace, added events included, then
passes the shape rules (`core.redact.redact_bytes`: URL passwords and known
token shapes), which also reach an entry written through as its bytes. An
entry that does not decode is written through as it was, except a metadata
entry (or bytes that may be one), which is left out and counted: its labels
cannot be redacted by key. A top-level `traceflops` key records what was added
and how many values were redacted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import orjson

from traceflops.core.redact import ENV_KEYS, is_secret_key, redact, redact_bytes, redact_text
from traceflops.export.perfetto.output import write_output
from traceflops.parsers.jsonstream import root_members


def redact_meta_events(events: list) -> int:
    """The args of metadata ('M') events (process and thread labels) redacted in place; how many values were."""
    n = 0
    for e in events:
        if e.__class__ is dict and e.get("ph") == "M" and isinstance(e.get("args"), dict):
            e["args"], m = redact(e["args"])
            n += m
    return n


def head_parts(head: bytes) -> tuple[bytes, bytes, int, int]:
    """The top-level keys before and after traceEvents, redacted and serialized (each without braces), the count, and
    the fields left out.

    A previous annotation's `traceflops` record is dropped (`_around_events`).
    A head orjson does not decode whole is read field by field (`jsonstream.root_members`);
    a field it does not decode (nested too deeply, a number no double holds, not JSON) is left out.
    """
    dropped = 0
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        doc = {}
        for member in root_members(head):
            try:
                doc.update(orjson.loads(b"{" + member + b"}"))
            except orjson.JSONDecodeError:
                dropped += 1
    before, after, m = _around_events(doc)
    b, n1 = redact_bytes(orjson.dumps(before, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    a, n2 = redact_bytes(orjson.dumps(after, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
    return b, a, m + n1 + n2, dropped


def _around_events(doc: dict) -> tuple[dict, dict, int]:
    """The top-level keys before and after traceEvents, each redacted, and how many values were.

    A previous annotation's `traceflops` record is dropped (a new one is written).
    """
    keys = [k for k in doc if k != "traceflops"]
    at = keys.index("traceEvents") if "traceEvents" in keys else len(keys)
    before, m1 = redact({k: doc[k] for k in keys[:at]})
    after, m2 = redact({k: doc[k] for k in keys[at + 1 :]})
    return before, after, m1 + m2


def redact_metadata(doc: dict) -> tuple[dict, int]:
    """The document with its metadata redacted (the keys beside traceEvents, their names included; metadata events'
    args), and the count.

    The events list is the same object, its metadata events' args replaced in place;
    the top-level keys keep their order around it.
    """
    events = doc["traceEvents"]
    n = redact_meta_events(events)
    before, after, m = _around_events(doc)
    return {**before, "traceEvents": events, **after}, n + m


def traceflops_record(summary: dict[str, Any], trace_path: str, note: str) -> tuple[dict[str, Any], bytes]:
    """The `traceflops` record, serialized, and the summary with the file name's own redactions counted.

    It holds only numbers, the note, warnings of our own and the input's file name (itself redacted).
    """
    name, m = redact_text(Path(str(trace_path)).name)
    summary = {**summary, "redacted_values": summary["redacted_values"] + m}
    return summary, orjson.dumps({"annotated_from": name, **summary, "note": note}, option=orjson.OPT_SERIALIZE_NUMPY)


def write_redacted(out_path: str, doc: dict, summary: dict[str, Any], trace_path: str, note: str) -> dict[str, Any]:
    """Serialize `doc`, pass every byte through the shape rules, append the `traceflops` record (the final count in it),
    write.

    The record is added after the pass so it can hold the pass's own count.
    """
    data, n = redact_bytes(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
    summary, record = traceflops_record(
        {**summary, "redacted_values": summary["redacted_values"] + n}, trace_path, note
    )
    body = data[:-1] + (b',"traceflops":' if len(data) > 2 else b'"traceflops":') + record + b"}"
    write_output(out_path, lambda out, tmp: out.write(body))
    return summary


_UNKNOWN = re.compile(r"Object contains unknown field `(.*)` - at `\$\[\d+\]`", re.DOTALL)
_MAX_KEYS = 1024  # distinct args keys learned; past it a key not yet known sends its entry to be decoded


def plain_key(k: str) -> bool:
    """An args key the key rules leave alone (not a secret's name nor an environment, ASCII: no case folding
    surprises). Its text still passes the shape rules with the rest of the entry."""
    return k.isascii() and not is_secret_key(k) and k.lower() not in ENV_KEYS


class PlainKeys:
    """Whether every key of many args objects is plain (`plain_key`), in one strict decode in C.

    The decoder knows the plain keys met so far and refuses any other; a key it
    refuses is judged once, and learned if plain. Values are skipped unbuilt
    (`msgspec.Raw`): the caller rules out nested objects itself.
    """

    def __init__(self) -> None:
        self.known: list[str] = []
        self._build()

    def _build(self) -> None:
        # A default of None, not a Raw made per missing field: the values are never read, and a factory called for
        # each known key an object lacks made this decode six times slower than the dicts' (29 keys on a V100 trace).
        fields = [(f"k{j}", msgspec.Raw, msgspec.field(default=None, name=k)) for j, k in enumerate(self.known)]
        args = msgspec.defstruct("_Args", fields, forbid_unknown_fields=True, gc=False)
        self._decoder = msgspec.json.Decoder(list[args])  # type: ignore[valid-type]  # a struct made at run time

    def plain(self, text: bytes) -> bool:
        """`text`, a JSON array of args objects: whether all are objects whose keys are all plain."""
        while True:
            try:
                self._decoder.decode(text)
                return True
            except msgspec.ValidationError as e:
                m = _UNKNOWN.fullmatch(str(e))
                if m is None or m.group(1) in self.known or len(self.known) >= _MAX_KEYS or not plain_key(m.group(1)):
                    return False
                self.known.append(m.group(1))
                self._build()
            except msgspec.DecodeError:
                return False
