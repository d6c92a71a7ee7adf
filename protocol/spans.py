"""Cheap spans for Ratchet's own hot paths (a step's, a tool or model call's), when the
tracer provider is the OpenTelemetry SDK's and samples every trace it is given
(``parentbased_always_on``, the default, or ``always_on``).

Why: the SDK's ``start_span``/``end`` cost ~60 µs of CPU a span in the node (profiled,
docs/operations.md, Traces): a sampler call, attribute validation and copying into
``BoundedAttributes`` at start, at each ``set_attribute`` and each event, a lock per
call, a second object (the ``ReadableSpan`` copy) at the end. Ratchet's spans carry a few
attributes of its own making, strings and integers; this span is itself the finished
``ReadableSpan`` handed to the provider's span processors (``on_start``, ``on_end``), with
ids from the provider's id generator, the provider's resource and the tracer's scope: what
reaches the exporter is what the SDK would have made — same names, parents, trace flags,
attributes, events and status.

Any other sampler (``OTEL_TRACES_SAMPLER``), a disabled tracer, or an SDK without the
parts used here: :func:`fast_starter` returns None and the SDK's own ``start_span`` is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import time_ns
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import (
    Event,
    ReadableSpan,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    sampling,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY

__all__ = ["CheapSpan", "Starter", "fast_starter"]

#: start(name, attributes, kind, parent context) → a started span.
Starter = Callable[[str, Mapping[str, Any] | None, SpanKind, "otel_context.Context | None"],
                   trace.Span]

_PLAIN = (str, int, float, bool)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # the W3C level-2 flag (SDK ≥ 1.40)
_UNSET = Status(StatusCode.UNSET)
#: (sampled, random) → the span's trace flags, made once.
_FLAGS = {(sampled, random): TraceFlags((_SAMPLED if sampled else _NOT_SAMPLED)
                                        | (_RANDOM if random else 0))
          for sampled in (False, True) for random in (False, True)}


def _clean(attributes: Mapping[str, Any], into: dict[str, Any]) -> bool:
    """Copy ``attributes`` into ``into``: plain values as they are (Ratchet's own, the
    common case), anything else through the SDK's validation (a sequence becomes a
    tuple, an invalid value is dropped with its warning). True if all were plain."""
    plain = True
    for key, value in attributes.items():
        if type(value) in _PLAIN and type(key) is str and key:
            into[key] = value
        else:
            plain = False
            into.update(BoundedAttributes(attributes={key: value}))
    return plain


class CheapSpan(trace.Span, ReadableSpan):
    """A recording span that is its own finished ``ReadableSpan`` (module doc). Used from
    one asyncio task at a time (the one whose step or call it is): no lock."""

    # What every span starts with, read from the class until a span sets its own: a
    # start then stores 8 attributes, not 16 (a span is made for each step).
    _links: Sequence[trace.Link] = ()
    _status = _UNSET
    _dropped_events = 0
    _end_time: int | None = None
    _traceparent: str | None = None

    @property
    def _resource(self) -> Any:  # type: ignore[override]  # what ReadableSpan reads
        return self._sdk.resource

    @property
    def _instrumentation_scope(self) -> Any:  # type: ignore[override]
        return self._sdk.scope

    @property
    def _instrumentation_info(self) -> Any:  # type: ignore[override]
        return self._sdk.info

    def __init__(self, name: str, context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: dict[str, Any], sdk: _Sdk,
                 plain: bool = True) -> None:
        self._name = name
        self._context = self._own = context
        self._parent = parent
        self._kind = kind
        self._attributes = self._attrs = attributes
        #: (time, name, attributes) of each event: tuples, not the SDK's ``Event`` objects,
        #: which only an in-process exporter asks for (``_events``, made then).
        self._event_records: list[tuple[int, str, dict[str, Any]]] = []
        self._sdk = sdk
        self._start_time = time_ns()
        #: Every attribute (the span's, its events') a plain str, bool, int or float, and
        #: every event name a str: protocol/span_wire.py then takes them as they are.
        self.plain = plain and type(name) is str

    @property
    def traceparent(self) -> str:
        """This span as a W3C ``traceparent`` (the propagator's form), made once."""
        if self._traceparent is None:
            # The span context is a tuple (trace id, span id, remote, flags, ...): read by
            # index, not through its properties; the trace id's hex form is the previous
            # span's more often than not (a task's steps share their trace).
            context, sdk = self._own, self._sdk
            trace_id = context[0]
            if sdk.hex_trace[0] != trace_id:
                sdk.hex_trace = (trace_id, f"00-{trace_id:032x}-")
            self._traceparent = f"{sdk.hex_trace[1]}{context[1]:016x}-{context[3]:02x}"
        return self._traceparent

    @property
    def dropped_events(self) -> int:
        return self._dropped_events

    def get_span_context(self) -> SpanContext:
        return self._own

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end_time is None and not _clean(attributes, self._attrs):
            self.plain = False

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end_time is None and not _clean({key: value}, self._attrs):
            self.plain = False

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        if self._end_time is not None:
            return
        if len(self._event_records) >= self._sdk.max_events:
            self._dropped_events += 1  # the SDK's limit (OTEL_SPAN_EVENT_COUNT_LIMIT)
            return
        clean: dict[str, Any] = {}
        if attributes and not _clean(attributes, clean):
            self.plain = False
        if type(name) is not str:  # an event's type, a str enum: the string the SDK sends
            name = str.__str__(name) if isinstance(name, str) else str(name)
        self._event_records.append((timestamp or time_ns(), name, clean))

    @property
    def _events(self) -> Sequence[Event]:  # type: ignore[override]  # read-only: add_event adds
        return [Event(name, attributes, timestamp)
                for timestamp, name, attributes in self._event_records]

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        return  # Ratchet's spans have no links; a link added later is not kept

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name
            self.plain = self.plain and type(name) is str

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # The SDK's rules: OK is final, UNSET is ignored.
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def record_exception(self, exception: BaseException, attributes: Any = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        # By type only, as protocol/tracing.py records failures: a message may quote secrets.
        self.add_event("exception", {"exception.type": type(exception).__name__}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            return
        self._end_time = end_time or time_ns()
        self._sdk.on_end(self)


class _Sdk:
    """What a span needs of the SDK's tracer, read once — but its span processors, read
    again whenever the provider's list of them changes (one identity test a span). Hooks
    a processor leaves as the base class's no-ops are not called: a span's start and end
    call only what does something (the node's shipper: ``on_end`` alone)."""

    __slots__ = (
        "_active",
        "_endings",
        "_ends",
        "_seen",
        "_starts",
        "hex_trace",
        "info",
        "max_events",
        "new_span_id",
        "new_trace_id",
        "random_ids",
        "resource",
        "scope",
    )

    def __init__(self, tracer: Any) -> None:
        self._active = tracer.span_processor
        self._seen: object = None
        self._starts: list[Callable[..., None]] = []
        self._endings: list[Callable[[Any], None]] = []
        self._ends: list[Callable[[Any], None]] = []
        self.resource = tracer.resource
        #: (trace id, "00-<its 32 hex digits>-") of the last span asked for its traceparent.
        self.hex_trace: tuple[int, str] = (0, "")
        self.scope = tracer._instrumentation_scope
        self.info = tracer.instrumentation_info
        limit = tracer._span_limits.max_events
        self.max_events = limit if limit is not None else 1 << 62
        self.new_span_id = tracer.id_generator.generate_span_id
        self.new_trace_id = tracer.id_generator.generate_trace_id
        is_random = getattr(tracer.id_generator, "is_trace_id_random", None)
        self.random_ids = bool(is_random and is_random())

    def _hooks(self) -> None:
        active = self._active
        processors = getattr(active, "_span_processors", None)
        if processors is self._seen and processors is not None:
            return
        self._seen = processors
        if not isinstance(active, SynchronousMultiSpanProcessor) or processors is None:
            self._starts, self._ends = [active.on_start], [active.on_end]
            self._endings = [getattr(active, "_on_ending", lambda span: None)]
            return
        base = SpanProcessor
        self._starts = [p.on_start for p in processors
                        if type(p).on_start is not base.on_start
                        and not getattr(p, "ignores_cheap_span_start", False)]
        self._endings = [p._on_ending for p in processors
                         if type(p)._on_ending is not base._on_ending]
        self._ends = [p.on_end for p in processors]

    def on_start(self, span: CheapSpan, parent_context: Any) -> None:
        self._hooks()
        for start in self._starts:
            start(span, parent_context=parent_context)

    def on_end(self, span: CheapSpan) -> None:
        self._hooks()
        for ending in self._endings:
            ending(span)
        for end in self._ends:
            end(span)


def fast_starter(tracer: trace.Tracer) -> Starter | None:
    """A span starter for ``tracer`` when it is the SDK's and samples every trace (module
    doc); None otherwise (the caller uses ``tracer.start_span``)."""
    try:
        enabled = getattr(tracer, "_is_enabled", lambda: True)()
        always = tracer.sampler in (sampling.DEFAULT_ON, sampling.ALWAYS_ON)  # type: ignore[attr-defined]
        parent_based = tracer.sampler is sampling.DEFAULT_ON  # type: ignore[attr-defined]
        limits = tracer._span_limits  # type: ignore[attr-defined]
        # Value lengths cut, or bounds Ratchet's few attributes could reach: the SDK's way.
        bounded = limits.max_attribute_length is not None \
            or limits.max_span_attribute_length is not None \
            or min(limits.max_span_attributes or 64, limits.max_event_attributes or 64) < 64
        sdk = _Sdk(tracer)
    except AttributeError:  # not the SDK's tracer, or an SDK this was not written for
        return None
    if not enabled or not always or bounded:
        return None
    get_current_span = trace.get_current_span
    get_current = otel_context.get_current

    def start(name: str, attributes: Mapping[str, Any] | None, kind: SpanKind,
              parent: otel_context.Context | None) -> trace.Span:
        # The parent: a span of this module's by its exact type, without the SDK lookup's
        # isinstance test against the Span ABC (as long as the rest of it, profiled).
        current: Any = (get_current() if parent is None else parent).get(_SPAN_KEY)
        kind_of = type(current)
        if kind_of is CheapSpan:
            parent_span: SpanContext | None = current._own
        elif kind_of is trace.NonRecordingSpan:  # a task's trace, from its traceparent
            parent_span = current.get_span_context()
        else:
            parent_span = get_current_span(parent).get_span_context()
        if parent_span is not None and parent_span.is_valid:
            trace_id, state = parent_span.trace_id, parent_span.trace_state
            random = parent_span.trace_flags & _RANDOM
            sampled = parent_span.trace_flags.sampled or not parent_based
        else:
            parent_span, state, sampled = None, None, True
            trace_id = sdk.new_trace_id()
            random = _RANDOM if sdk.random_ids else 0
        context = SpanContext(trace_id, sdk.new_span_id(), is_remote=False,
                              trace_flags=_FLAGS[sampled, bool(random)], trace_state=state)
        if not sampled:  # a parent that was not sampled: ParentBased's ALWAYS_OFF
            return trace.NonRecordingSpan(context)
        clean: dict[str, Any] = {}
        plain = _clean(attributes, clean) if attributes else True
        span = CheapSpan(name, context, parent_span, kind, clean, sdk, plain)
        sdk.on_start(span, parent_context=parent)
        return span

    return start
