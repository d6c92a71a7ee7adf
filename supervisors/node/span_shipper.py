"""Exporting Ratchet's spans from a child process, so that encoding and sending them does
not take the node's CPU or its GIL (docs/operations.md, Traces).

Why: with the OpenTelemetry SDK's batch processor the exporter runs on a thread of the
node; encoding a span and sending it costs ~15 to 20 µs of CPU, and while that thread holds
the GIL the event loop waits. Here a span, as it ends, becomes a plain tuple
(protocol/span_wire.py ``span_record``, ~2 µs) queued; a full batch goes in ``marshal``
form (~1 µs a span) down a non-blocking pipe to a child process
(supervisors/node/span_export_child.py) that encodes the OTLP request and sends it with
the user's exporter — on the other core.

The same bounds as the SDK's batch processor (``OTEL_BSP_*`` or the node's defaults):
a batch is shipped when ``max_export_batch_size`` spans wait or ``schedule_delay`` has
passed; beyond ``max_queue_size`` waiting spans, or a child that has not read a
megabyte or more of batches, new ones are dropped and counted (a collector that is down
must not grow the node without bound). Spans that are not
Ratchet's own (a tool's instrumentation), or hold a value the wire form does not write,
go to the in-process batch processor as before; so do all spans once the child is gone.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from ratchet.protocol.span_wire import span_record
from ratchet.protocol.spans import CheapSpan

__all__ = ["HashedResource", "ShippingSpanProcessor", "WireSpan", "frame", "in_process_only"]

log = structlog.get_logger("ratchet.otel")
_CHILD = "ratchet.supervisors.node.span_export_child"
_PIPE_BYTES = 1 << 20  # a pipe of 1 MiB where Linux allows: a whole batch in one write
_F_SETPIPE_SZ = 1031


def frame(payload: Any) -> bytes:
    """One message down the pipe: its length (4 bytes, big-endian), then ``marshal``."""
    data = marshal.dumps(payload)
    return len(data).to_bytes(4, "big") + data


class HashedResource(Resource):
    """The provider's resource, hashed once: the OTLP encoder groups each span by its
    resource, and ``Resource.__hash__`` is a JSON dump of its attributes — ~8 µs a span
    on the exporter's thread (profiled; docs/operations.md, Traces). Resources are
    immutable, so the hash is too."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class WireSpan:
    """A span already in its wire form (in the export process), with what the OTLP
    encoder groups spans by (supervisors/node/otel.py ``encode_wire_spans``)."""

    __slots__ = ("instrumentation_scope", "resource", "wire")

    def __init__(self, wire: bytes, resource: Any, scope: Any) -> None:
        self.wire = wire
        self.resource = resource
        self.instrumentation_scope = scope


class ShippingSpanProcessor(SpanProcessor):
    """Ship Ratchet's spans to an exporting child process (module doc).

    A full batch is written by whoever ends its last span — the event loop, in the
    common case — without waiting: the pipe is non-blocking, and what it cannot take yet
    stays in a bounded buffer, written at the next batch or tick. No thread of the node
    spends long with the GIL: a thread that did (``marshal`` of a batch) would stall the
    loop each time the loop let go of it for SQLite or a socket. A timer thread only
    ships what is left of a batch every ``schedule_delay``."""

    def __init__(self, fallback: SpanProcessor, hello: tuple[Any, ...],
                 bounds: Mapping[str, int], environ: Mapping[str, str]) -> None:
        self._fallback = fallback
        self._batch = bounds["max_export_batch_size"]
        self._queue = bounds["max_queue_size"]
        self._delay = bounds["schedule_delay_millis"] / 1000
        self._pending: deque[bytes] = deque()  # spans' records, each marshalled
        self._out = bytearray()  # frames the pipe has not taken yet
        self._out_limit = max(_PIPE_BYTES, self._queue * 1024)
        self._dropped = 0
        self.dropped_total = 0  # spans dropped since the start (the log says each time)
        self._lock = threading.Lock()  # one shipper at a time: the loop's or the timer's
        self._wake = threading.Event()
        self.gone = threading.Event()  # set when the child is found gone
        self._stopping = False
        self._child: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", _CHILD], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, env=_child_environment(environ))
        assert self._child.stdin is not None
        self._fd = self._child.stdin.fileno()
        try:
            import fcntl
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        except (ImportError, OSError):
            pass  # the default pipe: more of a batch waits in the buffer
        os.set_blocking(self._fd, False)
        self._out += frame(hello)
        self._thread = threading.Thread(target=self._tick, name="ratchet-span-shipper",
                                        daemon=True)
        self._thread.start()

    @property
    def shipping(self) -> bool:
        """Whether spans still go to the child (False once it is gone)."""
        return self._child is not None

    #: protocol/spans.py need not call :meth:`on_start` for its spans: it does nothing then.
    ignores_cheap_span_start = True

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if type(span) is not CheapSpan:
            self._fallback.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        record = span_record(span) if type(span) is CheapSpan and self._child else None
        if record is None:
            self._fallback.on_end(span)
            return
        # In marshal form at once: bytes, which the garbage collector does not track, where
        # a queued tuple of lists and dicts would survive collections until it is shipped.
        data = marshal.dumps(record)
        pending = self._pending
        if len(pending) >= self._queue:
            self._dropped += 1
            self.dropped_total += 1
            return
        pending.append(data)  # deque.append: atomic under the GIL, as popleft is
        if len(pending) >= self._batch:
            self._ship()

    def _tick(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._ship()

    def _ship(self) -> None:
        """Frame what waits and write what the pipe takes now; never waits on the child."""
        if not self._lock.acquire(blocking=False):
            return  # the other shipper is at it
        try:
            self._frame_pending()
            self._flush_out()
        except Exception as exc:  # a batch that cannot be written is lost, not the node
            log.error("span batch dropped", error=type(exc).__name__)
        finally:
            self._lock.release()
        if self._dropped:
            log.warning("spans dropped", count=self._dropped,
                        reason="the span queue was full (is the collector slow or down?)")
            self._dropped = 0

    def _frame_pending(self) -> None:
        pending, take = self._pending, self._pending.popleft
        while pending and self._child is not None:
            batch = [take() for _ in range(min(len(pending), self._batch))]
            if len(self._out) > self._out_limit:  # the child is not keeping up
                self._dropped += len(batch)
                self.dropped_total += len(batch)
                continue
            self._out += frame(batch)

    def _flush_out(self) -> None:
        out = self._out
        try:
            while out and self._child is not None:
                written = os.write(self._fd, out)
                del out[:written]
        except BlockingIOError:
            return  # the pipe is full: the rest goes at the next batch or tick
        except (BrokenPipeError, OSError):
            self._lost()

    def _lost(self) -> None:
        child, self._child = self._child, None
        self._out.clear()
        self.gone.set()
        log.error("span export process gone", returncode=None if child is None else child.poll(),
                  fallback="spans are exported from the node's own thread from now on")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand what waits to the child (it sends on receipt), and flush the fallback."""
        self._ship()
        return self._fallback.force_flush(timeout_millis)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ship what waits, close the pipe, and wait (bounded) for the child to send it."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            self._frame_pending()
            if self._child is not None:
                os.set_blocking(self._fd, True)  # the last of it, whole
                self._flush_out()
        child, self._child = self._child, None
        if child is not None:
            try:
                assert child.stdin is not None
                child.stdin.close()
            except OSError:
                pass
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("span export process slow to end", action="killed", timeout_s=timeout)
                child.kill()
                child.wait()
        self._fallback.shutdown()


def _child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The node's environment with ``environ`` over it (the ``OTEL_*`` it was started
    with), and this very ``ratchet`` first on the import path."""
    here = str(Path(__file__).resolve().parents[2])
    merged = {**os.environ, **environ}
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (here, merged.get("PYTHONPATH")) if p)
    return merged


def in_process_only(environ: Mapping[str, str]) -> bool:
    """``RATCHET_OTEL_EXPORT_PROCESS=0``: export from the node's own thread (debugging)."""
    return environ.get("RATCHET_OTEL_EXPORT_PROCESS", "").strip() in ("0", "false", "no")
