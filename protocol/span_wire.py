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

__all__ = ["SpanRecord", "record_message", "request_message", "span_message", "span_record"]

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_INT64 = 1 << 63
#: Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, | _IS_REMOTE_MASK for a remote parent.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


_SMALL = [bytes((n,)) for n in range(0x80)]  # the varints of one byte, made once


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: string, bytes or an embedded message."""
    size = len(data)
    return tag + (_SMALL[size] if size < 0x80 else _varint(size)) + data


def request_message(resource: bytes, scope: bytes, spans: list[bytes], resource_schema: str = "",
                    scope_schema: str = "") -> bytes:
    """An ``ExportTraceServiceRequest`` of ``spans`` (``Span`` messages), all of one
    ``resource`` and one instrumentation ``scope`` (their messages): what the OTLP
    encoder makes of them, without building it from Python objects."""
    # ScopeSpans{scope = 1, spans = 2, schema_url = 3}
    scope_spans = [_field(b"\x0a", scope)]
    scope_spans += [_field(b"\x12", span) for span in spans]
    if scope_schema:
        scope_spans.append(_field(b"\x1a", scope_schema.encode()))
    # ResourceSpans{resource = 1, scope_spans = 2, schema_url = 3}
    resource_spans = _field(b"\x0a", resource) + _field(b"\x12", b"".join(scope_spans))
    if resource_schema:
        resource_spans += _field(b"\x1a", resource_schema.encode())
    return _field(b"\x0a", resource_spans)  # resource_spans = 1


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
_KEY_VALUES: dict[tuple[bytes, str, type, Any], bytes] = {}
_KEY_VALUES_MAX = 4096


def _attributes(tag: bytes, attributes: Mapping[str, Any]) -> bytes | None:
    """Repeated KeyValue{key = 1, value = 2} under ``tag``; None for a value not known."""
    out = []
    cached = _KEY_VALUES.get
    for key, value in attributes.items():
        known = (tag, key, type(value), value)  # the type: True == 1 == 1.0 as keys
        field = cached(known)
        if field is None:
            encoded = _any_value(value)
            if encoded is None:
                return None
            field = _field(tag, _field(b"\x0a", key.encode()) + _field(b"\x12", encoded))
            if len(_KEY_VALUES) >= _KEY_VALUES_MAX:
                _KEY_VALUES.clear()
            _KEY_VALUES[known] = field
        out.append(field)
    return b"".join(out)


#: A finished span as plain data (:func:`span_record`): what crosses to the exporting
#: process (supervisors/node/span_shipper.py) in ``marshal`` form. Fields, in order:
#: trace id, span id, trace state ("k=v,..."), parent span id or None, parent remote,
#: name, kind (SpanKind's value), start and end (ns), attributes, events as
#: (time, name, attributes), dropped events, status code (StatusCode's value), status
#: description or None.
SpanRecord = tuple[Any, ...]


def _plain(attributes: Any) -> dict[str, Any] | None:
    """``attributes`` as a dict of the values this module writes; None if one is not."""
    out = dict(attributes) if attributes else {}
    for key, value in out.items():
        if type(key) is not str or type(value) not in _KNOWN:
            return None
    return out


_KNOWN = (str, bool, int, float)


def span_record(span: Any) -> SpanRecord | None:
    """``span`` (a protocol/spans.py span, ended) as plain data, or None when it holds
    something this module does not write."""
    if span.plain:  # its values checked as they were set: taken as they are
        attributes = span._attributes
        events = span._event_records  # (time, name, attributes): the record's own form
    else:
        attributes = _plain(span._attributes)
        if attributes is None:
            return None
        events = []
        for timestamp, event_name, event_attrs in span._event_records:
            event_attributes = _plain(event_attrs)
            if event_attributes is None or type(event_name) is not str:
                return None
            events.append((timestamp, event_name, event_attributes))
    name = span._name
    if type(name) is not str:
        if not isinstance(name, str):
            return None
        name = str.__str__(name)  # a str enum: the string the SDK sends
    context, parent, status = span._context, span._parent, span._status
    # The span context is a tuple (trace id, span id, remote, flags, state, valid) and the
    # enums' ``_value_`` a plain attribute: read directly, where the properties cost a
    # Python call each (a fifth of this function's time, profiled).
    state = context[4]
    return (context[0], context[1],
            ",".join(f"{key}={value}" for key, value in state.items()) if state else "",
            None if parent is None else parent[1],
            parent is not None and parent[2], name, span._kind._value_,
            span._start_time, span._end_time, attributes, events, span._dropped_events,
            status._status_code._value_, status._description or None)


def span_message(span: Any) -> bytes | None:
    """The ``Span`` message of ``span`` (a protocol/spans.py span, ended), or None when it
    holds something this does not write (the caller then uses the exporter's encoder)."""
    try:
        record = span_record(span)
        return None if record is None else record_message(record)
    except (UnicodeEncodeError, AttributeError, TypeError, ValueError):
        return None


def record_message(record: SpanRecord) -> bytes | None:
    """The ``Span`` message of a :func:`span_record`; None when a value cannot be written
    (a string that is not valid Unicode, an integer beyond int64)."""
    try:
        return _span(record)
    except (UnicodeEncodeError, TypeError, ValueError):
        return None


def _span(record: SpanRecord) -> bytes | None:
    (trace_id, span_id, state, parent_id, remote, name, kind, start, end, attributes,
     events, dropped_events, code, description) = record
    encoded = _attributes(b"\x4a", attributes)  # attributes = 9
    if encoded is None:
        return None
    parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"),  # trace_id = 1
             b"\x12\x08", span_id.to_bytes(8, "big")]  # span_id = 2
    if state:
        parts.append(_field(b"\x1a", state.encode()))  # trace_state = 3
    if parent_id is not None:
        parts += [b"\x22\x08", parent_id.to_bytes(8, "big")]  # parent_span_id = 4
    parts += [_field(b"\x2a", name.encode()),  # name = 5
              b"\x30", _varint(kind + 1),  # kind = 6 (INTERNAL is 1 there)
              b"\x39", _FIXED64(start),  # start_time_unix_nano = 7
              b"\x41", _FIXED64(end),  # end_time_unix_nano = 8
              encoded]
    for timestamp, event_name, event_attributes in events:
        # events = 11: Event{time = 1, name = 2, attributes = 3}
        encoded = _attributes(b"\x1a", event_attributes)
        if encoded is None:
            return None
        parts.append(_field(b"\x5a", b"\x09" + _FIXED64(timestamp)
                            + _field(b"\x12", event_name.encode()) + encoded))
    if dropped_events:
        parts += [b"\x60", _varint(dropped_events)]  # dropped_events_count = 12
    # status = 15: Status{message = 2, code = 3}
    message = _field(b"\x12", description.encode()) if description else b""
    parts.append(_field(b"\x7a", message + (b"\x18" + _varint(code) if code else b"")))
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if remote else 0)
    parts += [b"\x85\x01", _FIXED32(flags)]  # flags = 16
    return b"".join(parts)
