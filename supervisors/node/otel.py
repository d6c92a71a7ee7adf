"""Turning traces on for a serving process: the OpenTelemetry SDK's tracer provider and the
user's exporter (docs/operations.md, Traces).

Off unless ``ratchet serve --otel`` or the standard variables ask for it:
``OTEL_TRACES_EXPORTER`` (other than ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` keeps it off whatever
else says. The rest is the SDK's own reading of ``OTEL_*``: the service name
(``OTEL_SERVICE_NAME``, default ``ratchet``) and resource, the sampler
(``OTEL_TRACES_SAMPLER``), the batch processor's bounds (``OTEL_BSP_*``), the OTLP
endpoint, headers, protocol and timeout.

The exporter: ``otlp`` (the default) sends OTLP over HTTP/protobuf
(``opentelemetry-exporter-otlp-proto-http``, the ``otel`` extra:
``pip install 'ratchet-runtime[otel]'``), or over gRPC when
``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` and ``opentelemetry-exporter-otlp-proto-grpc`` is
installed; ``console`` prints spans to stdout (a quick look, no collector). An exporter
that is not installed refuses the start with what to install, rather than tracing into
nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from ratchet.protocol import tracing
from ratchet.protocol.errors import UsageError
from ratchet.protocol.span_wire import span_message
from ratchet.protocol.spans import CheapSpan
from ratchet.supervisors.node.otel_switch import wanted  # here too: the SDK's users read it
from ratchet.supervisors.node.span_shipper import HashedResource as _HashedResource
from ratchet.supervisors.node.span_shipper import (
    ShippingSpanProcessor,
    WireSpan,
    in_process_only,
)

__all__ = ["TracingUnavailable", "encode_wire_spans", "otlp_exporter", "start_tracing",
           "stop_tracing", "wanted"]

_EXPORTERS = {
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                      "opentelemetry-exporter-otlp-proto-http"),
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "opentelemetry-exporter-otlp-proto-grpc"),
}


class TracingUnavailable(UsageError):
    """Traces were asked for but the exporter they name cannot be made: ``serve`` prints
    what to install and exits 2 (docs/cli.md)."""


def _exporter_name(environ: Mapping[str, str]) -> str:
    name = (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if name not in ("otlp", "console"):
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={name!r}: Ratchet knows otlp, console"
                                 " and none", exporter=name)
    return name


def otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    """The OTLP exporter the variables ask for (HTTP/protobuf unless gRPC is named).

    Raises:
        TracingUnavailable: its package is not installed.
    """
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    module_name, package = _EXPORTERS.get(protocol, _EXPORTERS["http/protobuf"])
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise TracingUnavailable(
            f"traces over OTLP ({protocol}) need {package}: pip install {package}"
            " (or 'ratchet-runtime[otel]' for http/protobuf)", package=package) from None
    exporter: SpanExporter = module.OTLPSpanExporter()
    return exporter


#: Batches bigger than the SDK's defaults (512 spans, in a queue of 2,048): a node makes a
#: span or two a step, a thousand and more a second; each export is an HTTP request.
_QUEUE, _BATCH = 8192, 2048


def _batching(environ: Mapping[str, str]) -> dict[str, int]:
    """The batch processor's bounds: the user's ``OTEL_BSP_*`` where set (the SDK reads
    them), ours otherwise (a batch no bigger than the queue, as the SDK requires)."""
    bounds: dict[str, int] = {}
    if not environ.get("OTEL_BSP_MAX_QUEUE_SIZE"):
        bounds["max_queue_size"] = _QUEUE
    if not environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        queue = bounds.get("max_queue_size")
        if queue is None:
            try:
                queue = int(environ["OTEL_BSP_MAX_QUEUE_SIZE"])
            except ValueError:
                queue = 2048  # the SDK's default, which it falls back to
        bounds["max_export_batch_size"] = max(1, min(_BATCH, queue))
    return bounds


def encode_wire_spans() -> None:
    """Have the OTLP encoder take Ratchet's cheap spans (protocol/spans.py) in their wire
    form (protocol/span_wire.py), and the export process's spans, already in it
    (span_shipper.py ``WireSpan``): half its CPU a span. Any other span, and one the wire
    form does not cover, goes through the encoder's own ``_encode_span`` as before. An
    exporter package without that function (another version) is left as it is."""
    try:
        from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder
        from opentelemetry.proto.trace.v1.trace_pb2 import Span as WireSpanMessage
    except ImportError:
        return
    original = getattr(trace_encoder, "_encode_span", None)
    if original is None or getattr(original, "ratchet_cheap_spans", False):
        return

    def encode_span(span: Any) -> Any:
        if type(span) is WireSpan:
            return WireSpanMessage.FromString(span.wire)
        if type(span) is CheapSpan:
            data = span_message(span)
            if data is not None:
                return WireSpanMessage.FromString(data)
        return original(span)

    encode_span.ratchet_cheap_spans = True  # type: ignore[attr-defined]
    encode_span.__wrapped__ = original  # type: ignore[attr-defined]
    trace_encoder._encode_span = encode_span  # type: ignore[assignment]


def _processor(provider: TracerProvider, environ: Mapping[str, str]) -> SpanProcessor:
    """The batch processor with the user's exporter; for OTLP, behind the shipper that
    exports Ratchet's own spans from a child process (span_shipper.py)."""
    name = _exporter_name(environ)
    exporter = ConsoleSpanExporter() if name == "console" else otlp_exporter(environ)
    bounds = _batching(environ)
    batching = BatchSpanProcessor(exporter, max_queue_size=bounds.get("max_queue_size"),
                                  max_export_batch_size=bounds.get("max_export_batch_size"))
    if name == "console" or in_process_only(environ):
        return batching
    scope = provider.get_tracer("ratchet")._instrumentation_scope  # type: ignore[attr-defined]
    resource = provider.resource
    hello = (dict(resource.attributes), resource.schema_url or "", scope.name,
             scope.version or "", scope.schema_url or "")
    queue = bounds.get("max_queue_size") or _int(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
    batch = bounds.get("max_export_batch_size") \
        or _int(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)
    return ShippingSpanProcessor(batching, hello, {
        "max_queue_size": queue, "max_export_batch_size": min(batch, queue),
        "schedule_delay_millis": _int(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000)}, environ)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    """A positive integer variable as the SDK reads it: its default when unset or bad."""
    try:
        value = int(environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def start_tracing(flag: bool, environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Trace this process if asked (:func:`wanted`); the provider (to stop), or None.

    It also becomes OpenTelemetry's global provider when none was set, so that tools'
    own instrumentation (an HTTP client's) joins the same traces.

    Raises:
        TracingUnavailable: the exporter asked for is not installed or not known.
    """
    if not wanted(flag, environ):
        return None
    resource = _HashedResource(Resource.create(
        {SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or "ratchet"}))
    provider = TracerProvider(resource=resource)
    encode_wire_spans()
    provider.add_span_processor(_processor(provider, environ))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    tracing.enable(provider)
    return provider


def stop_tracing(provider: TracerProvider | None) -> None:
    """Stop tracing and flush what is buffered to the exporter (bounded by the SDK's
    export timeout)."""
    if provider is None:
        return
    tracing.disable()
    provider.shutdown()
