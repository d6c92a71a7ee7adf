"""The OTLP protobuf wire form of one of Ratchet's cheap spans (protocol/spans.py): the
bytes of an ``opentelemetry.proto.trace.v1.Span`` message, written directly.

Why: the OTLP exporter's encoder builds each span as a tree of protobuf objects from
Python (a key-value object per attribute, an enum lookup per flag): ~26 µs a span on the
exporter's thread, which takes the GIL from the node's event loop. Writing the bytes
and parsing them back (one C call) takes half that (docs/operations.md, Traces). The
node's OTLP setup (supervisors/node/otel.py) uses this for Ratchet's spans only; a span
with anything written here does not know (a value that is not a string, boolean,
integer or float) is left to the exporter's own encoder, whole.

The message is the one the encoder makes (tests/test_tracing_spans.py parses both and
compares them): ids, trace state, parent, name, kind, times, attributes, events, status,
dropped events, and the flags that say whether the parent was remote.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

__all__ = ["span_message"]

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_INT64 = 1 << 63
#: Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, | _IS_REMOTE_MASK for a remote parent.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: string, bytes or an embedded message."""
    return tag + _varint(len(data)) + data


def _any_value(value: Any) -> bytes | None:
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode())  # string_value = 1
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"  # bool_value = 2
    if kind is int and -_INT64 <= value < _INT64:
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int_value = 3 (int64)
    if kind is float:
        return b"\x21" + _DOUBLE(value)  # double_value = 4
    return None


#: KeyValue messages already written, by (key, type, value): a task's id, tenant and
#: key recur on each of its spans. Bounded; used from the exporter's one thread.
_KEY_VALUES: dict[tuple[str, type, Any], bytes] = {}
_KEY_VALUES_MAX = 4096


def _attributes(tag: bytes, attributes: Mapping[str, Any]) -> bytes | None:
    """Repeated KeyValue{key = 1, value = 2} under ``tag``; None for a value not known."""
    out = []
    for key, value in attributes.items():
        known = (key, type(value), value)  # the type: True == 1 == 1.0 as keys
        pair = _KEY_VALUES.get(known)
        if pair is None:
            encoded = _any_value(value)
            if encoded is None:
                return None
            pair = _field(b"\x0a", key.encode()) + _field(b"\x12", encoded)
            if len(_KEY_VALUES) >= _KEY_VALUES_MAX:
                _KEY_VALUES.clear()
            _KEY_VALUES[known] = pair
        out.append(_field(tag, pair))
    return b"".join(out)


def span_message(span: Any) -> bytes | None:
    """The ``Span`` message of ``span`` (a protocol/spans.py span, ended), or None when it
    holds something this does not write (the caller then uses the exporter's encoder)."""
    try:
        return _span(span)
    except (UnicodeEncodeError, AttributeError, TypeError, ValueError):
        return None


def _span(span: Any) -> bytes | None:
    context, parent = span._context, span._parent
    attributes = _attributes(b"\x4a", span._attributes)  # attributes = 9
    if attributes is None:
        return None
    parts = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"),  # trace_id = 1
             b"\x12\x08", context.span_id.to_bytes(8, "big")]  # span_id = 2
    state = ",".join(f"{key}={value}" for key, value in context.trace_state.items())
    if state:
        parts.append(_field(b"\x1a", state.encode()))  # trace_state = 3
    if parent is not None:
        parts += [b"\x22\x08", parent.span_id.to_bytes(8, "big")]  # parent_span_id = 4
    parts += [_field(b"\x2a", span._name.encode()),  # name = 5
              b"\x30", _varint(span._kind.value + 1),  # kind = 6 (INTERNAL is 1 there)
              b"\x39", _FIXED64(span._start_time),  # start_time_unix_nano = 7
              b"\x41", _FIXED64(span._end_time),  # end_time_unix_nano = 8
              attributes]
    for event in span._events:  # events = 11: Event{time = 1, name = 2, attributes = 3}
        event_attributes = _attributes(b"\x1a", event.attributes or {})
        if event_attributes is None:
            return None
        parts.append(_field(b"\x5a", b"\x09" + _FIXED64(event.timestamp)
                            + _field(b"\x12", event.name.encode()) + event_attributes))
    if span._dropped_events:
        parts += [b"\x60", _varint(span._dropped_events)]  # dropped_events_count = 12
    status = span._status  # status = 15: Status{message = 2, code = 3}
    message = _field(b"\x12", status.description.encode()) if status.description else b""
    code = status.status_code.value
    parts.append(_field(b"\x7a", message + (b"\x18" + _varint(code) if code else b"")))
    remote = parent is not None and parent.is_remote
    parts += [b"\x85\x01", _FIXED32(_HAS_IS_REMOTE | (_IS_REMOTE if remote else 0))]  # flags = 16
    return b"".join(parts)
