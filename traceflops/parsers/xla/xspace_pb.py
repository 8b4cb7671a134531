"""Optional fast path: decode XSpace with the `protobuf` runtime (upb), when it is installed.

The message classes are built here from descriptors written in code (no
generated `_pb2` file, no TensorFlow): field numbers as in tsl's
`xplane.proto`. The result is converted to the same dataclasses the
pure-Python reader (`xspace_python`) returns, so callers cannot tell the two
apart; `tests/parsers/test_xplane.py` checks that they agree on every shared profile.
On the 3 MB `v100_tf_multiworker` profile the upb parse plus conversion is
about twice as fast as the pure-Python reader.

`available()` is False when `protobuf` is missing or is the slow pure-Python
implementation; `decode_xspace` then uses the pure-Python reader.
"""

from __future__ import annotations

from typing import Any

from traceflops.core.errors import FormatError
from traceflops.parsers.xla.wire import Budget, TooManyMessages, too_many
from traceflops.parsers.xla.xspace_model import (
    XEvent,
    XEventMetadata,
    XLine,
    XPlane,
    XSpace,
)

_CLASS: Any = None
_TRIED = False
_TODO = "re-export the profile (the file is truncated or not an XSpace protobuf)"


def _build():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() == "python":
        return None  # slower than the hand-written reader
    F = descriptor_pb2.FieldDescriptorProto
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    fd = descriptor_pb2.FileDescriptorProto(
        name="traceflops_xplane.proto", package="traceflops_xplane", syntax="proto3"
    )

    def msg(container, name, fields, oneofs=()):
        m = container.add(name=name)
        for o in oneofs:
            m.oneof_decl.add(name=o)
        for fname, num, typ, label, tname, oneof in fields:
            f = m.field.add(name=fname, number=num, type=typ, label=label)
            if tname:
                f.type_name = ".traceflops_xplane." + tname
            if oneof is not None:
                f.oneof_index = oneof
        return m

    msg(fd.message_type, "XStat", [
        ("metadata_id", 1, F.TYPE_INT64, O, None, None),
        ("double_value", 2, F.TYPE_DOUBLE, O, None, 0),
        ("uint64_value", 3, F.TYPE_UINT64, O, None, 0),
        ("int64_value", 4, F.TYPE_INT64, O, None, 0),
        ("str_value", 5, F.TYPE_STRING, O, None, 0),
        ("bytes_value", 6, F.TYPE_BYTES, O, None, 0),
        ("ref_value", 7, F.TYPE_UINT64, O, None, 0),
    ], oneofs=["value"])
    msg(fd.message_type, "XEvent", [
        ("metadata_id", 1, F.TYPE_INT64, O, None, None),
        ("offset_ps", 2, F.TYPE_INT64, O, None, 0),
        ("num_occurrences", 5, F.TYPE_INT64, O, None, 0),
        ("duration_ps", 3, F.TYPE_INT64, O, None, None),
        ("stats", 4, F.TYPE_MESSAGE, R, "XStat", None),
    ], oneofs=["data"])
    msg(fd.message_type, "XLine", [
        ("id", 1, F.TYPE_INT64, O, None, None),
        ("display_id", 10, F.TYPE_INT64, O, None, None),
        ("name", 2, F.TYPE_STRING, O, None, None),
        ("display_name", 11, F.TYPE_STRING, O, None, None),
        ("timestamp_ns", 3, F.TYPE_INT64, O, None, None),
        ("duration_ps", 9, F.TYPE_INT64, O, None, None),
        ("events", 4, F.TYPE_MESSAGE, R, "XEvent", None),
    ])
    msg(fd.message_type, "XEventMetadata", [
        ("id", 1, F.TYPE_INT64, O, None, None),
        ("name", 2, F.TYPE_STRING, O, None, None),
        ("display_name", 4, F.TYPE_STRING, O, None, None),
        ("metadata", 3, F.TYPE_BYTES, O, None, None),
        ("stats", 5, F.TYPE_MESSAGE, R, "XStat", None),
        ("child_id", 6, F.TYPE_INT64, R, None, None),
    ])
    msg(fd.message_type, "XStatMetadata", [
        ("id", 1, F.TYPE_INT64, O, None, None),
        ("name", 2, F.TYPE_STRING, O, None, None),
        ("description", 3, F.TYPE_STRING, O, None, None),
    ])
    plane = msg(fd.message_type, "XPlane", [
        ("id", 1, F.TYPE_INT64, O, None, None),
        ("name", 2, F.TYPE_STRING, O, None, None),
        ("lines", 3, F.TYPE_MESSAGE, R, "XLine", None),
        ("event_metadata", 4, F.TYPE_MESSAGE, R, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, F.TYPE_MESSAGE, R, "XPlane.StatMetadataEntry", None),
        ("stats", 6, F.TYPE_MESSAGE, R, "XStat", None),
    ])
    for entry, value in (("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")):
        e = msg(plane.nested_type, entry, [
            ("key", 1, F.TYPE_INT64, O, None, None),
            ("value", 2, F.TYPE_MESSAGE, O, value, None),
        ])
        e.options.map_entry = True
    msg(fd.message_type, "XSpace", [
        ("planes", 1, F.TYPE_MESSAGE, R, "XPlane", None),
        ("errors", 2, F.TYPE_STRING, R, None, None),
        ("warnings", 3, F.TYPE_STRING, R, None, None),
        ("hostnames", 4, F.TYPE_STRING, R, None, None),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("traceflops_xplane.XSpace"))


def available() -> bool:
    global _CLASS, _TRIED
    if not _TRIED:
        _TRIED = True
        try:
            _CLASS = _build()
        except Exception:  # noqa: BLE001 - ImportError, or a protobuf too old for this descriptor API
            _CLASS = None
    return _CLASS is not None


def _stats(stats, names: dict[int, str], unknown: list[int]) -> dict:
    d: dict = {}
    for s in stats:
        which = s.WhichOneof("value")
        if which == "ref_value":
            v = names.get(s.ref_value)
            if v is None:
                unknown[0] += 1
        elif which is None:
            v = None
        else:
            v = getattr(s, which)
        n = names.get(s.metadata_id)
        if n is None:
            unknown[0] += 1
            continue
        d[n] = v
    return d


def decode_xspace(buf: bytes, path: str | None = None) -> XSpace:
    from google.protobuf.message import DecodeError

    msg = _CLASS()
    try:
        msg.ParseFromString(buf)  # ~60 bytes a message in upb's arena: the conversion below is what costs (~1.3 KB)
    except (DecodeError, RecursionError, ValueError) as e:
        raise FormatError(path, f"not a valid XSpace protobuf ({e})", _TODO) from None
    try:
        return _convert(msg, Budget(len(buf)))
    except TooManyMessages as e:
        raise too_many(path, e) from None


def _convert(msg, budget: Budget) -> XSpace:
    """The dataclasses, each container's messages counted (`budget`) before any of them is built."""
    budget.take(len(msg.planes) + len(msg.errors) + len(msg.warnings) + len(msg.hostnames), "planes and strings")
    for p in msg.planes:
        budget.take(len(p.lines) + len(p.event_metadata) + len(p.stat_metadata) + len(p.stats), "lines, metadata and stats of one plane")
    space = XSpace(errors=list(msg.errors), warnings=list(msg.warnings), hostnames=list(msg.hostnames))
    for p in msg.planes:
        plane = XPlane(id=p.id, name=p.name)
        names = {k: v.name for k, v in p.stat_metadata.items()}
        plane.stat_metadata = names
        plane.stat_descriptions = {k: v.description for k, v in p.stat_metadata.items() if v.description}
        unknown = [0]
        for k, m in p.event_metadata.items():
            if len(m.stats):
                budget.take_stats(len(m.stats), "event metadata stats")
            plane.event_metadata[k] = XEventMetadata(
                k, m.name, m.display_name, m.metadata, _stats(m.stats, names, unknown) if len(m.stats) else {},
                list(m.child_id),
            )
        plane.stats = _stats(p.stats, names, unknown)
        for ln in p.lines:
            budget.take(len(ln.events), "events of one line")
            events = []
            append = events.append
            for e in ln.events:
                st = e.stats
                if len(st):
                    budget.take_stats(len(st), "event stats")
                append(XEvent(e.metadata_id, e.offset_ps, e.num_occurrences, e.duration_ps,
                              _stats(st, names, unknown) if len(st) else None))
            plane.lines.append(XLine(ln.id, ln.display_id, ln.name, ln.display_name, ln.timestamp_ns, ln.duration_ps, events))
        plane.unknown_stats = unknown[0]
        space.planes.append(plane)
    return space
