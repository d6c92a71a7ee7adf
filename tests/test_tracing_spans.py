"""Ratchet's cheap spans (protocol/spans.py) are what the SDK would have exported: same
ids' shape, parents, flags, attributes, events, status, resource and scope; a sampler
other than the default is the SDK's to apply; the node's batching defaults give way to
the user's ``OTEL_BSP_*``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ratchet.protocol import tracing
from ratchet.protocol.catalogue import EventType
from ratchet.supervisors.node.otel import _batching, _HashedResource

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-01"
NOT_SAMPLED = f"00-{TRACE}-00f067aa0ba902b7-00"
STEP = {"ratchet.task_id": "tsk_1", "ratchet.tenant": "acme", "ratchet.step": "pay",
        "ratchet.step_index": 3}


def _traced(sampler: sampling.Sampler | None = None) -> tuple[InMemorySpanExporter,
                                                               TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler,
                              resource=Resource.create({SERVICE_NAME: "spans-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


@pytest.fixture
def in_task() -> Iterator[None]:
    """A task's context (its row's traceparent made current), restored afterwards."""
    token = otel_context.attach(otel_context.Context())
    try:
        yield
    finally:
        otel_context.detach(token)
        tracing.disable()


def _step_with_a_failed_call(traceparent: str) -> str | None:
    """What a step does when traced: its span, an event, a failed tool call, and the
    traceparent its events carry."""
    tracing.enter_task(traceparent)
    with tracing.span("ratchet.step", STEP):
        tracing.add_event("action.started", {"ratchet.sequence": 7, "ratchet.tags": ["a", "b"]})
        inner = tracing.current_traceparent()
        with pytest.raises(ValueError), tracing.span("ratchet.tool", {"ratchet.tool": "x"},
                                                     kind=SpanKind.CLIENT):
            raise ValueError("a secret in the message")
    return inner


def _shape(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None and span.parent is not None
    return {"name": span.name, "kind": span.kind, "trace": span.context.trace_id,
            "flags": int(span.context.trace_flags), "remote_parent": span.parent.is_remote,
            "attributes": dict(span.attributes or {}), "status": (
                span.status.status_code, span.status.description),
            "events": [(e.name, dict(e.attributes or {})) for e in span.events],
            "resource": span.resource.attributes, "scope": span.instrumentation_scope,
            "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
            "timed": 0 < (span.start_time or 0) <= (span.end_time or 0)}


def test_cheap_spans_export_what_the_sdks_would(in_task: None) -> None:
    exporter, provider = _traced()
    tracing.enable(provider)
    inner = _step_with_a_failed_call(SAMPLED)
    cheap = exporter.get_finished_spans()
    # The SDK's own spans, for the same calls: a sampler that is not the default's
    # object (but decides alike) keeps protocol/spans.py out of the way.
    sdk_exporter, sdk_provider = _traced(sampling.ParentBased(sampling.ALWAYS_ON))
    tracing.enable(sdk_provider)
    _step_with_a_failed_call(SAMPLED)
    sdk = sdk_exporter.get_finished_spans()
    assert {type(s) for s in sdk} == {ReadableSpan}  # the SDK's copy of its Span
    assert ReadableSpan not in {type(s) for s in cheap}  # the cheap path was taken
    assert [_shape(s) for s in cheap] == [_shape(s) for s in sdk]
    tool, step = cheap
    assert tool.parent == step.context and step.parent is not None
    assert format(step.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "ValueError"
    assert step.events[0].attributes == {"ratchet.sequence": 7, "ratchet.tags": ("a", "b")}
    carrier: dict[str, str] = {}  # the traceparent inside the step: the propagator's form
    with tracing.span("ratchet.step", STEP):
        TraceContextTextMapPropagator().inject(carrier)
        assert tracing.current_traceparent() == carrier["traceparent"]
    assert inner is not None and inner.startswith(f"00-{TRACE}-") and inner.endswith("-01")
    assert tracing.trace_id() == TRACE


def test_a_parent_not_sampled_records_nothing_but_its_trace_goes_on(in_task: None) -> None:
    exporter, provider = _traced()
    tracing.enable(provider)
    inner = _step_with_a_failed_call(NOT_SAMPLED)
    assert exporter.get_finished_spans() == ()
    assert inner is not None and inner.startswith(f"00-{TRACE}-") and inner.endswith("-00")


@pytest.mark.parametrize("sampler", [sampling.ALWAYS_OFF,
                                     sampling.ParentBasedTraceIdRatio(0.0)])
def test_the_users_sampler_decides(in_task: None, sampler: sampling.Sampler) -> None:
    """OTEL_TRACES_SAMPLER (here its object): the SDK's own path, which applies it."""
    exporter, provider = _traced(sampler)
    tracing.enable(provider)
    _step_with_a_failed_call(SAMPLED if sampler is sampling.ALWAYS_OFF else "")
    assert exporter.get_finished_spans() == ()


def test_a_root_span_starts_a_trace_of_its_own(in_task: None) -> None:
    exporter, provider = _traced()
    tracing.enable(provider)
    with tracing.span("ratchet.admin", {"messaging.system": "nats"},
                      parent=tracing.parent_from({})):
        pass
    admin, = exporter.get_finished_spans()
    assert admin.parent is None and admin.context is not None and admin.context.is_valid
    assert admin.context.trace_flags.sampled


def test_batching_defaults_give_way_to_the_users_variables() -> None:
    assert _batching({}) == {"max_queue_size": 8192, "max_export_batch_size": 2048}
    assert _batching({"OTEL_BSP_MAX_QUEUE_SIZE": "1000"}) == {"max_export_batch_size": 1000}
    assert _batching({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}) == {"max_queue_size": 8192}
    assert _batching({"OTEL_BSP_MAX_QUEUE_SIZE": "4096",
                      "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}) == {}


def test_the_hashed_resource_is_the_same_resource() -> None:
    resource = Resource.create({SERVICE_NAME: "node-1", "host.name": "h"})
    hashed = _HashedResource(resource)
    assert hashed == resource and hash(hashed) == hash(resource)
    grouped: dict[Resource, int] = {hashed: 1}  # as the OTLP encoder groups spans
    assert hashed.attributes == resource.attributes and grouped[resource] == 1


def _all_kinds_of_span() -> list[ReadableSpan]:
    """Cheap spans with what a span may hold: a remote parent with a trace state, a local
    one, none; every plain kind of value; events; a failure; a value the wire form leaves
    to the encoder (a list)."""
    exporter, provider = _traced()
    tracing.enable(provider)
    make_all_kinds_of_span()
    return list(exporter.get_finished_spans())


def make_all_kinds_of_span() -> None:
    """Spans of every shape Ratchet makes, into the provider tracing is enabled with."""
    tracing.enter_task(SAMPLED)
    otel_context.attach(TraceContextTextMapPropagator().extract(
        {"traceparent": SAMPLED, "tracestate": "vendor=v1,other=o-2"}))
    with tracing.span("ratchet.step", {**STEP, "x.neg": -5, "x.big": 2**62, "x.f": 0.25,
                                       "x.yes": True, "x.no": False, "x.utf": "é✓"}):
        tracing.add_event("action.started", {"ratchet.sequence": 1, "x.f": -1.5})
        tracing.add_event("bare", {})
        tracing.add_event(EventType.TASK_QUEUED, {"ratchet.sequence": 2})  # a str enum
        with pytest.raises(KeyError), tracing.span("ratchet.tool", {"ratchet.tool": "t"},
                                                   kind=SpanKind.CLIENT):
            raise KeyError("k")
        with tracing.span("ratchet.model", {"x.list": ["a", "b"]}, kind=SpanKind.CONSUMER):
            pass
    with tracing.span("ratchet.admin", {}, parent=tracing.parent_from({})):
        pass


def test_the_wire_form_is_the_message_the_otlp_encoder_makes(in_task: None) -> None:
    from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as WireSpan

    from ratchet.protocol.span_wire import span_message
    from ratchet.supervisors.node.otel import encode_wire_spans

    found = _all_kinds_of_span()
    assert len(found) == 4
    original = getattr(trace_encoder._encode_span, "__wrapped__", trace_encoder._encode_span)
    written = [span_message(s) for s in found]
    assert [s.name for s, data in zip(found, written, strict=True) if data is None] == [
        "ratchet.model"]  # a list value: the encoder's own way
    for span, data in zip(found, written, strict=True):
        if data is not None:
            assert WireSpan.FromString(data) == original(span), span.name
    encode_wire_spans()  # as the node does: the encoder then takes the wire form
    batch = trace_encoder.encode_spans(found)
    assert [s.name for s in batch.resource_spans[0].scope_spans[0].spans] == [
        s.name for s in found]
    assert batch.SerializeToString() == _plain_encoding(found, original)


def _plain_encoding(spans: list[ReadableSpan], original: Any) -> bytes:
    """The whole request as the exporter's own encoder makes it."""
    from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder

    patched = trace_encoder._encode_span
    trace_encoder._encode_span = original
    try:
        data: bytes = trace_encoder.encode_spans(spans).SerializeToString()
        return data
    finally:
        trace_encoder._encode_span = patched
