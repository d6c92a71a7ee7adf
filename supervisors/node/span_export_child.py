"""The process that exports a node's spans (supervisors/node/span_shipper.py): it reads
batches of span records from its standard input and sends them with the user's OTLP
exporter, configured by the same ``OTEL_*`` variables as the node.

Input: frames of a 4-byte big-endian length and a ``marshal`` payload. The first is the
hello, ``(resource attributes, resource schema url, scope name, scope version, scope
schema url)``; each next one a list of records (protocol/span_wire.py ``SpanRecord``),
each in ``marshal`` form itself.
End of input (the node closed the pipe, or died) flushes and exits: the child never
outlives its node.

Each record is written in its wire form and handed to the exporter's encoder, which
takes it as it is (supervisors/node/otel.py ``encode_wire_spans``): the request sent is
the one the node's in-process exporter would have sent (tests/test_tracing_export.py).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
from typing import Any, BinaryIO

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ratchet.protocol.span_wire import record_message, request_message
from ratchet.supervisors.node.otel import encode_wire_spans, otlp_exporter
from ratchet.supervisors.node.span_shipper import HashedResource, WireSpan

__all__ = ["main"]


def _read_frame(stream: BinaryIO) -> Any:
    """The next frame's payload; None at the end of input."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) < size:
        return None
    return marshal.loads(data)


def _hello(payload: Any) -> tuple[Resource, InstrumentationScope]:
    attributes, schema_url, name, version, scope_url = payload
    return (HashedResource(Resource(attributes, schema_url or None)),
            InstrumentationScope(name, version or None, scope_url or None))


def _send_requests_whole(exporter: Any, resource: Resource, scope: InstrumentationScope) -> None:
    """Have ``exporter`` take a batch of wire spans as one request made by
    :func:`request_message` (the resource and scope encoded once), instead of grouping
    and encoding them span by span: a third of this process's CPU a span. An exporter
    module without ``encode_spans`` keeps the encoder's way (``encode_wire_spans``)."""
    try:
        from opentelemetry.exporter.otlp.proto.common._internal import (
            _encode_instrumentation_scope,
            _encode_resource,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
    except ImportError:
        return
    module = sys.modules[type(exporter).__module__]
    original = getattr(module, "encode_spans", None)
    if original is None:
        return
    resource_message = _encode_resource(resource).SerializeToString()
    scope_message = _encode_instrumentation_scope(scope).SerializeToString()
    resource_schema, scope_schema = resource.schema_url or "", scope.schema_url or ""

    def encode_spans(spans: Any) -> Any:
        if not all(type(span) is WireSpan for span in spans):
            return original(spans)
        return ExportTraceServiceRequest.FromString(request_message(
            resource_message, scope_message, [span.wire for span in spans],
            resource_schema, scope_schema))

    setattr(module, "encode_spans", encode_spans)  # noqa: B010 - a module mypy cannot see


#: Below the node's CPU priority: exporting spans is background work, and on a machine
#: whose cores the node, its NATS server and its store's syncer share, the traced work
#: comes first (its queue in the node is bounded; what it cannot take is dropped, counted).
NICENESS = 10


def main(stream: BinaryIO | None = None) -> int:
    stream = stream or sys.stdin.buffer
    hello = _read_frame(stream)
    if hello is None:
        return 0
    resource, scope = _hello(hello)
    encode_wire_spans()
    exporter = otlp_exporter(os.environ)
    _send_requests_whole(exporter, resource, scope)
    try:
        while (batch := _read_frame(stream)) is not None:
            spans = []
            for item in batch:
                wire = record_message(marshal.loads(item))
                if wire is not None:  # a value the wire form cannot write: dropped
                    spans.append(WireSpan(wire, resource, scope))
            if spans:
                exporter.export(spans)  # type: ignore[arg-type]
    finally:
        exporter.shutdown()
    return 0


if __name__ == "__main__":
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    raise SystemExit(main())
