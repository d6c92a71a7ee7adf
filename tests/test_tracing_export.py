"""Exporting from a child process (supervisors/node/span_shipper.py): what reaches the OTLP
endpoint is what the in-process exporter would have sent — every span, byte for byte,
with the node's resource and scope; spans the wire form leaves to the encoder still go
out (in process); a child that dies hands the export back to the node; a full queue
drops and counts rather than growing."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ratchet.protocol import tracing
from ratchet.supervisors.node.otel import start_tracing, stop_tracing
from ratchet.supervisors.node.span_shipper import ShippingSpanProcessor
from tests.conftest import ROOT
from tests.test_tracing_spans import SAMPLED, STEP


class _Collector(BaseHTTPRequestHandler):
    requests: list[ExportTraceServiceRequest] = []
    arrived = threading.Condition()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with _Collector.arrived:
            _Collector.requests.append(ExportTraceServiceRequest.FromString(body))
            _Collector.arrived.notify_all()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """An OTLP endpoint here; the variables that name it, set as ``serve`` would find
    them (the in-process exporter reads the process's own)."""
    _Collector.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = otel_context.attach(otel_context.Context())
    variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
                 "OTEL_SERVICE_NAME": "export-test", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    try:
        yield variables
    finally:
        otel_context.detach(token)
        tracing.disable()
        server.shutdown()


def _received() -> dict[bytes, tuple[Any, Any, Any]]:
    """Every span the collector got: span id → (resource, scope, span)."""
    found = {}
    for request in _Collector.requests:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found[span.span_id] = (resource_spans.resource, scope_spans.scope, span)
    return found


def _wait_for(count: int) -> dict[bytes, tuple[Any, Any, Any]]:
    with _Collector.arrived:
        assert _Collector.arrived.wait_for(lambda: len(_received()) >= count, timeout=20)
    return _received()


def _spans(count: int) -> None:
    tracing.enter_task(SAMPLED)
    for index in range(count):
        with tracing.span("ratchet.step", {**STEP, "ratchet.step_index": index}):
            tracing.add_event("step.completed", {"ratchet.sequence": index})


def _shipper(provider: Any) -> ShippingSpanProcessor:
    processors = provider._active_span_processor._span_processors
    return next(p for p in processors if isinstance(p, ShippingSpanProcessor))


def _with_copy(provider: Any) -> InMemorySpanExporter:
    """The same spans, kept in memory too, to encode the in-process way."""
    kept = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    return kept


def test_the_child_sends_what_the_node_would_have_sent(collector: dict[str, str]) -> None:
    from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder

    from tests.test_tracing_spans import make_all_kinds_of_span

    provider = start_tracing(True, collector)
    assert provider is not None and _shipper(provider).shipping
    kept = _with_copy(provider)
    _spans(300)
    make_all_kinds_of_span()  # among them one the wire form leaves to the encoder (a list)
    stop_tracing(provider)  # ships what waits; the child sends it and exits
    assert _shipper(provider)._thread.is_alive() is False
    ours = list(kept.get_finished_spans())
    got = _wait_for(len(ours))
    assert len(got) == len(ours) == 304
    original = getattr(trace_encoder._encode_span, "__wrapped__", trace_encoder._encode_span)
    for span in ours:
        resource, scope, wire = got[span.context.span_id.to_bytes(8, "big")]
        assert wire == original(span), span.name
        assert scope.name == "ratchet"
        assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] \
            == "export-test"


def test_a_child_that_dies_hands_the_export_back(collector: dict[str, str]) -> None:
    provider = start_tracing(True, collector)
    assert provider is not None
    shipper = _shipper(provider)
    assert shipper._child is not None
    shipper._child.kill()
    shipper._child.wait()
    _spans(10)  # shipped into a closed pipe: lost, as an export that fails is
    shipper.force_flush()
    assert shipper.gone.wait(10)  # the shipping thread found the pipe closed
    assert not shipper.shipping
    _spans(5)
    stop_tracing(provider)
    assert len(_wait_for(5)) >= 5


def test_a_child_that_does_not_read_costs_a_bounded_buffer(collector: dict[str, str]) -> None:
    """A child stopped (SIGSTOP: a collector that hangs looks the same to the node): the
    node's writes never wait on it, the spans it cannot take are dropped and counted,
    and what was shipped arrives once it goes on."""
    provider = start_tracing(True, {**collector, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64",
                                    "OTEL_BSP_MAX_QUEUE_SIZE": "1024"})
    assert provider is not None
    shipper = _shipper(provider)
    assert shipper._child is not None
    os.kill(shipper._child.pid, signal.SIGSTOP)
    try:
        _spans(20_000)  # ~4 MB of records against a pipe and a buffer of 1 MiB each
        assert shipper.dropped_total > 0
        assert len(shipper._out) <= shipper._out_limit + 64 * 1024
    finally:
        os.kill(shipper._child.pid, signal.SIGCONT)
    stop_tracing(provider)
    assert len(_wait_for(20_000 - shipper.dropped_total)) == 20_000 - shipper.dropped_total


def test_the_child_never_outlives_its_node(collector: dict[str, str]) -> None:
    """A node SIGKILLed: its end of the pipe closes, and the export process ends too."""
    script = ("import os, sys\n"
              "from ratchet.supervisors.node.otel import start_tracing\n"
              "provider = start_tracing(True, dict(os.environ))\n"
              "shipper = provider._active_span_processor._span_processors[0]\n"
              "print(shipper._child.pid, flush=True)\n"
              "sys.stdin.read()\n")
    node = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert node.stdout is not None
        child = int(node.stdout.readline())
        handle = os.pidfd_open(child)
    finally:
        node.kill()
        node.wait()
    try:
        ready, _, _ = select.select([handle], [], [], 20)  # readable once the child exits
        assert ready == [handle]
    finally:
        os.close(handle)
