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
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from ratchet.protocol import tracing
from ratchet.protocol.errors import UsageError
from ratchet.protocol.span_wire import span_message
from ratchet.protocol.spans import CheapSpan

__all__ = ["TracingUnavailable", "start_tracing", "stop_tracing", "wanted"]

_EXPORTERS = {
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                      "opentelemetry-exporter-otlp-proto-http"),
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "opentelemetry-exporter-otlp-proto-grpc"),
}


class TracingUnavailable(UsageError):
    """Traces were asked for but the exporter they name cannot be made: ``serve`` prints
    what to install and exits 2 (docs/cli.md)."""


def wanted(flag: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process traces: ``--otel``, or the standard variables (module doc)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return flag or bool(exporter) or bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")) \
        or bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    name = (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={name!r}: Ratchet knows otlp, console"
                                 " and none", exporter=name)
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


class _HashedResource(Resource):
    """The provider's resource, hashed once: the OTLP encoder groups each span by its
    resource, and ``Resource.__hash__`` is a JSON dump of its attributes — ~8 µs a span
    on the exporter's thread (profiled; docs/operations.md, Traces). Resources are
    immutable, so the hash is too."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


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


def _encode_ours_directly() -> None:
    """Have the OTLP encoder take Ratchet's cheap spans (protocol/spans.py) in their wire
    form (protocol/span_wire.py): half its CPU a span, on a thread that competes with the
    event loop for the GIL. Any other span, and one the wire form does not cover, goes
    through the encoder's own ``_encode_span`` as before. An exporter package without
    that function (another version) is left as it is."""
    try:
        from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder
        from opentelemetry.proto.trace.v1.trace_pb2 import Span as WireSpan
    except ImportError:
        return
    original = getattr(trace_encoder, "_encode_span", None)
    if original is None or getattr(original, "ratchet_cheap_spans", False):
        return

    def encode_span(span: Any) -> Any:
        if type(span) is CheapSpan:
            data = span_message(span)
            if data is not None:
                return WireSpan.FromString(data)
        return original(span)

    encode_span.ratchet_cheap_spans = True  # type: ignore[attr-defined]
    encode_span.__wrapped__ = original  # type: ignore[attr-defined]
    trace_encoder._encode_span = encode_span  # type: ignore[assignment]


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
    _encode_ours_directly()
    bounds = _batching(environ)
    provider.add_span_processor(BatchSpanProcessor(
        _exporter(environ), max_queue_size=bounds.get("max_queue_size"),
        max_export_batch_size=bounds.get("max_export_batch_size")))
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
