"""OpenTelemetry traces: spans for submit → intake → each node → each tool or model call,
with the W3C ``traceparent`` carried in NATS headers (docs/operations.md, Traces).

**Off by default, and then free:** until :func:`enable` is given a tracer provider, every
helper here returns at its first test — no span, no context, no attribute map is made
(:func:`span` hands back one shared null context). Hot paths test :func:`enabled` before
building attributes. ``ratchet serve --otel`` or the standard ``OTEL_*`` variables turn it
on (``supervisors/node/otel.py`` builds the provider and its exporter).

**Where a trace lives:** in OpenTelemetry's context (a contextvar), so it follows asyncio
tasks. Across processes it travels as the ``traceparent`` header (W3C Trace Context) of the
NATS message: a producer's submit, an admin request, and every event the node publishes.
Across time it is the task row's ``traceparent`` (the intake span's), made current again
for the task actor's whole asyncio task (:func:`enter_task`), so a task resumed days later,
or on another node, continues the trace its submit began.

An inbound header is hostile input like the rest: only ``traceparent`` and ``tracestate``
are read, by OpenTelemetry's W3C propagator, which ignores a malformed one (the span then
starts a trace of its own).

Only the OpenTelemetry *API* is used here; the SDK and exporters stay with the node —
but for the spans of Ratchet's hot paths, which ``protocol/spans.py`` makes cheaply when
the provider is the SDK's and samples everything (the default): a third of the SDK's CPU a span.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation import _SPAN_KEY
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from ratchet.protocol.spans import CheapSpan, Starter

__all__ = ["TRACEPARENT", "add_event", "add_events", "bind_context", "in_call_span", "check_traceparent",
           "current_traceparent",
           "disable", "enable", "enabled", "enter_task", "outbound_headers", "parent_from",
           "set_attributes", "span", "trace_id", "traced"]

T = TypeVar("T")

#: The header (and the task row's column) that carries a span context.
TRACEPARENT = "traceparent"
_TRACESTATE = "tracestate"
#: W3C Trace Context, version 00: what a caller may pass as ``traceparent=``.
_TRACEPARENT_FORM = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")

_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_tracer: trace.Tracer | None = None
_start: Starter | None = None  # _tracer's spans: protocol/spans.py's, or the SDK's own
#: protocol/spans.py's span class once tracing is on (that module loads the OpenTelemetry
#: SDK: imported by :func:`enable`, never while tracing is off — docs/operations.md,
#: "Restart (W4)").
_cheap_span: type | None = None


def _current_span() -> trace.Span:
    """The current span: OpenTelemetry's ``get_current_span``, but a Ratchet span is
    recognised by its exact type — that function's ``isinstance`` test against the
    ``Span`` ABC took as long as the rest of the lookup (profiled, one a step or more)."""
    span = otel_context.get_current().get(_SPAN_KEY)
    if type(span) is _cheap_span:
        return cast("trace.Span", span)
    return trace.get_current_span()


def enable(provider: trace.TracerProvider) -> None:
    """Trace from now on, into ``provider`` (the node's; tests give one with an in-memory
    exporter). Not OpenTelemetry's global provider: a process may trace its own way."""
    global _tracer, _start, _cheap_span
    from ratchet.protocol.spans import CheapSpan, fast_starter

    tracer = provider.get_tracer("ratchet")

    def sdk_start(name: str, attributes: Mapping[str, Any] | None, kind: SpanKind,
                  parent: otel_context.Context | None) -> trace.Span:
        return tracer.start_span(name, context=parent, kind=kind, attributes=attributes)

    _start = fast_starter(tracer) or sdk_start
    _cheap_span = CheapSpan
    _tracer = tracer


def disable() -> None:
    """Stop tracing: the helpers are no-ops again (spans already open end normally)."""
    global _tracer, _start
    _tracer = _start = None


def enabled() -> bool:
    return _tracer is not None


class _Current:
    """A started span made current for a ``with`` block, then ended. Leaner than the SDK's
    ``start_as_current_span`` (no generator-based context manager: ~10 µs a span less,
    measured), and it records what failed by its type only: an exception's message or
    traceback may quote a task's secrets, and spans leave for the user's backend."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        try:
            if exc is not None and not isinstance(exc, asyncio.CancelledError):
                failure = type(exc).__name__
                self._span.set_attribute("error.type", failure)
                self._span.set_status(Status(StatusCode.ERROR, failure))
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._span.end()


def span(name: str, attributes: Mapping[str, Any] | None = None, *,
         kind: SpanKind = SpanKind.INTERNAL,
         parent: otel_context.Context | None = None) -> AbstractContextManager[Any]:
    """A span made current for the ``with`` block (ended, and marked failed with the
    exception's type when it raised, as it leaves); one shared null context when off.

    ``parent``: the context to start from (:func:`parent_from`); None, the current one."""
    if _tracer is None:
        return _NULL
    assert _start is not None
    return _Current(_start(name, attributes, kind, parent))


def parent_from(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The context an inbound message's headers carry; an empty one (the span starts a new
    trace) without a valid ``traceparent``. Never the receiving task's current context:
    a message's span belongs to the message's trace, not to whatever served it before."""
    carrier = {}
    for key, value in (headers or {}).items():
        # Any case: NATS's Go client, like HTTP's, sends "Traceparent".
        name = key.lower() if isinstance(key, str) else ""
        if name in (TRACEPARENT, _TRACESTATE) and isinstance(value, str) and len(value) <= 512:
            carrier[name] = value
    return _PROPAGATOR.extract(carrier, context=otel_context.Context())


def traced(coro: Coroutine[Any, Any, T], name: str, headers: Mapping[str, str] | None, subject: str,
           kind: SpanKind = SpanKind.CONSUMER) -> Coroutine[Any, Any, T]:
    """``coro`` run inside a span whose parent is the message's (its ``headers``, received
    on ``subject``); ``coro`` itself, untouched, when tracing is off."""
    if _tracer is None:
        return coro

    async def run() -> T:
        with span(name, {"messaging.system": "nats", "messaging.destination.name": subject},
                  kind=kind, parent=parent_from(headers)):
            return await coro

    return run()


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span (none when off: test :func:`enabled` first on a
    hot path, so the map is not even built)."""
    if _tracer is not None:
        _current_span().set_attributes(attributes)


def add_event(name: str, attributes: Mapping[str, Any]) -> None:
    """A span event on the current span (the task's events, as they are committed)."""
    if _tracer is not None:
        _current_span().add_event(name, attributes)


def add_events(events: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Span events on the current span, looked up once (a transaction's events)."""
    if _tracer is not None:
        span = _current_span()
        for name, attributes in events:
            span.add_event(name, attributes)


def current_traceparent() -> str | None:
    """The current span context as a ``traceparent`` value; None when off or none."""
    if _tracer is None:
        return None
    span = _current_span()
    if type(span) is _cheap_span:  # it keeps its own: a step's writes ask for it each
        return cast("CheapSpan", span).traceparent
    # The W3C propagator's own form, without its carrier and setter.
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), for logs, events and the audit log."""
    if _tracer is None:
        return None
    context = _current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def enter_task(traceparent: str | None) -> None:
    """Make a task's trace (its row's ``traceparent``) current for the rest of the calling
    asyncio task — the task actor's own, whose context no other task shares; a task
    without one gets an empty context, not its spawner's span."""
    if _tracer is None:
        return
    carrier = {TRACEPARENT: traceparent} if traceparent else {}
    otel_context.attach(_PROPAGATOR.extract(carrier, context=otel_context.Context()))


def bind_context(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` to run later (in the store's writer, maybe on its thread) in the caller's
    context, so that what it writes (events, audit entries) knows the caller's span;
    ``fn`` itself when tracing is off."""
    if _tracer is None:
        return fn
    ctx = contextvars.copy_context()
    return lambda *args: ctx.run(fn, *args)


async def in_call_span(call: Coroutine[Any, Any, tuple[bool, Any]], task_id: str, tenant: str,
                       step_index: int, tool: str, session: str, key: str | None,
                       attempt: int, op: str, args: Any) -> tuple[bool, Any]:
    """Await one tool call (one attempt, or one query) — one model call when the tool is an
    agent turn's (session ``model``; ``args.model`` names the model) — inside its span; an
    answer ``(False, error)`` marks the span failed with the error's type. Just awaited
    when off, or outside a trace (a task begun untraced)."""
    if _tracer is None or not _current_span().get_span_context().is_valid:
        return await call
    attributes: dict[str, Any] = {
        "ratchet.task_id": task_id, "ratchet.tenant": tenant, "ratchet.step_index": step_index,
        "ratchet.tool": tool, "ratchet.attempt": attempt, "ratchet.operation": op}
    if key is not None:
        attributes["ratchet.idempotency_key"] = key
    model = getattr(args, "model", None) if session == "model" else None
    if isinstance(model, str):
        attributes["gen_ai.request.model"] = model
    assert _start is not None
    with _Current(_start("ratchet.model" if session == "model" else "ratchet.tool",
                         attributes, SpanKind.CLIENT, None)) as span:
        ok, value = await call
        if not ok and value is not None:
            failure = type(value).__name__
            span.set_attribute("error.type", failure)
            span.set_status(Status(StatusCode.ERROR, failure))
        return ok, value


def check_traceparent(value: str) -> str:
    """``value`` if it is a W3C ``traceparent`` (version 00, lower case, ids not all zero).

    Raises:
        ValueError: it is not; the message says what one looks like.
    """
    if not _TRACEPARENT_FORM.match(value):
        raise ValueError(f"not a W3C traceparent: {value[:80]!r}; expected"
                         " 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>")
    return value


def outbound_headers(headers: dict[str, str], traceparent: str | None = None) -> dict[str, str]:
    """``headers`` with the trace a message continues: ``traceparent`` if given, else the
    caller's current span, if any (its own OpenTelemetry setup, or this process's).

    Raises:
        ValueError: ``traceparent`` is not a W3C ``00-<trace id>-<span id>-<flags>``.
    """
    if traceparent is not None:
        headers[TRACEPARENT] = check_traceparent(traceparent)
    elif trace.get_current_span().get_span_context().is_valid:
        _PROPAGATOR.inject(headers)
    return headers
