"""Traces: a producer's trace continues through intake, each step and each tool and model
call of its task, with the task's attributes; its events and the audit log carry the trace
id; with tracing off nothing is made. Spans are read from the SDK's in-memory exporter of
a real node in this process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

import ratchet
from ratchet import END
from ratchet.actors.agents.models import ModelRequest
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from ratchet.protocol import tracing
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.messages import Envelope, Reply
from ratchet.protocol.tool_errors import ToolInvalidArgument
from ratchet.supervisors.node.otel import TracingUnavailable, start_tracing, wanted
from tests.conftest import NodeFactory, node_key, wait_terminal

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


class Charge(BaseModel):
    customer: str
    amount: float


class Charged(BaseModel):
    provider_id: str


@ratchet.tool(kind="write", args=Charge, result=Charged, key=lambda a: f"charge:{a.customer}")
async def charge(ctx: ratchet.ToolContext, args: Charge) -> Charged:
    """Charge a customer."""
    return Charged(provider_id=f"ch-{args.customer}")


class Category(BaseModel):
    category: str


class Limit(BaseModel):
    category: str
    limit: float


@ratchet.tool(kind="read", args=Category, result=Limit)
async def lookup_policy(ctx: ratchet.ToolContext, args: Category) -> Limit:
    """Look up the expense policy of a category."""
    return Limit(category=args.category, limit=100.0)


def _script(request: ModelRequest) -> dict[str, Any]:
    if not any(m.role == "tool" for m in request.messages):
        return reply(tool_calls=[("lookup_policy", {"category": "meals"})])
    return reply(json.dumps({"category": "meals", "limit": 100.0}))


def _workflow() -> ratchet.Workflow:
    wf = ratchet.Workflow("traced")

    @wf.step(next="assistant")
    async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
        await ctx.call(charge, {"customer": "c-7", "amount": 12.5})
        return {}

    wf.agent("assistant", model=ScriptedModel(_script), tools=[lookup_policy], output=Limit,
             prompt=lambda state, inp: "What is the limit for meals?", next="done")

    @wf.step(next=END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": ctx.state["assistant"]}

    return wf


@ratchet.tool(kind="read", args=Category, result=Limit)
async def refuse(ctx: ratchet.ToolContext, args: Category) -> Limit:
    """A provider that refuses for good, quoting the caller's key."""
    raise ToolInvalidArgument("HTTP 400: key sk-live-4242 is not valid")


def _failing() -> ratchet.Workflow:
    wf = ratchet.Workflow("traced.fails")

    @wf.step(next=END)
    async def ask(ctx: ratchet.StepContext) -> dict[str, Any]:
        await ctx.call(refuse, {"category": "meals"})
        return {}

    return wf


def _branch(name: str) -> ratchet.Workflow:
    wf = ratchet.Workflow(f"branch.{name}")

    @wf.step
    async def look(ctx: ratchet.StepContext) -> dict[str, Any]:
        found = await ctx.call(lookup_policy, {"category": name})
        return {"output": found.limit}

    return wf


def _fanout() -> ratchet.Workflow:
    wf = ratchet.Workflow("traced.fanout")
    wf.fanout("spread", {b: _branch(b) for b in ("a", "b")}, join="gather")
    wf.join("gather", of="spread")
    return wf


def _approval() -> ratchet.Workflow:
    wf = ratchet.Workflow("traced.approve")

    @wf.step(next="manager")
    async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"amount": 900}

    wf.approval("manager", on_approve="pay", on_reject=END, timeout=3600, on_timeout="cancel")

    @wf.step(next=END)
    async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
        await ctx.call(charge, {"customer": "c-9", "amount": ctx.state["amount"]})
        return {"output": {"paid": ctx.state["amount"]}}

    return wf


APP = ratchet.Registry([_workflow(), _fanout(), _failing(), _approval()])


class Spans(InMemorySpanExporter):
    """The in-memory exporter, and a bounded wait for the spans a test expects (a span
    ends, and is exported, as its ``with`` block leaves: maybe just after the event that
    told the test the task ended)."""

    def __init__(self) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._exported = asyncio.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> Any:
        result = super().export(spans)
        self._loop.call_soon_threadsafe(self._exported.set)
        return result

    async def until(self, found: Callable[[list[ReadableSpan]], bool],
                    timeout: float = 10.0) -> list[ReadableSpan]:
        async with asyncio.timeout(timeout):
            while not found(spans := list(self.get_finished_spans())):
                self._exported.clear()
                await self._exported.wait()
        return spans


@pytest.fixture
async def spans() -> AsyncIterator[Spans]:
    exporter = Spans()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.fixture
async def node(start_node: NodeFactory) -> ratchet.Node:
    return await start_node(APP)


@pytest.fixture
async def client(node: ratchet.Node, nats_url: str, tmp_path: Path
                 ) -> AsyncIterator[ratchet.Client]:
    """A client connected once the node serves: connected before, it may find no
    responder for a moment while the server reloads the permissions of the key the node
    has just granted it."""
    c = await ratchet.Client.connect(nats_url, tenant="acme", creds=node_key(tmp_path))
    yield c
    await c.close()


async def _event_headers(client: ratchet.Client, task_id: str) -> tuple[list[Msg], Any]:
    """Every event message of the task as published (headers included), from now on."""
    seen: list[Msg] = []

    async def keep(msg: Msg) -> None:
        seen.append(msg)

    sub = await client.nc.subscribe(f"ratchet.events.acme.{task_id}.>", cb=keep)
    return seen, sub


def _trace_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def _named(spans: list[ReadableSpan], name: str, **attributes: Any) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and all(
        (s.attributes or {}).get(k) == v for k, v in attributes.items())]


def _done(spans: list[ReadableSpan]) -> bool:
    return bool(_named(spans, "ratchet.step", **{"ratchet.step": "done"}))


async def test_a_submit_with_a_traceparent_is_traced_through_intake_steps_tool_and_model_calls(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    task_id = task_id_for("acme", "traced-1")
    messages, sub = await _event_headers(client, task_id)
    await client.submit("traced", {}, key="traced-1", traceparent=TRACEPARENT)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    found = await spans.until(_done)
    ours = [s for s in found if _trace_of(s) == TRACE]
    task = {"ratchet.task_id": task_id, "ratchet.tenant": "acme"}

    intake, = _named(ours, "ratchet.intake", **task, **{"ratchet.idempotency_key": "traced-1"})
    assert intake.parent is not None and format(intake.parent.span_id, "016x") == PARENT
    steps = _named(ours, "ratchet.step", **task)
    assert {(s.attributes or {})["ratchet.step"] for s in steps} == {"pay", "assistant", "done"}
    assert all(s.parent is not None and s.parent.span_id == intake.context.span_id  # type: ignore[union-attr]
               and (s.attributes or {})["ratchet.idempotency_key"] == "traced-1" for s in steps)
    pay, = _named(steps, "ratchet.step", **{"ratchet.step": "pay"})
    turns = {s.context.span_id for s in _named(steps, "ratchet.step",  # type: ignore[union-attr]
                                               **{"ratchet.step": "assistant"})}
    tool, = _named(ours, "ratchet.tool", **task, **{"ratchet.tool": "charge"})
    assert (tool.attributes or {})["ratchet.idempotency_key"] == "charge:c-7"
    assert tool.parent is not None and tool.parent.span_id == pay.context.span_id  # type: ignore[union-attr]
    models = _named(ours, "ratchet.model", **task)
    assert len(models) == 2 and all(  # one model call per agent turn, inside the turn's span
        m.parent is not None and m.parent.span_id in turns
        and (m.attributes or {})["gen_ai.request.model"] == "scripted:1" for m in models)
    assert _named(ours, "ratchet.tool", **task, **{"ratchet.tool": "lookup_policy"})
    # The events a node committed are span events of it (but the routine step.completed),
    # and every event message carries the trace: the producer's trace id in traceparent.
    assert {"action.started", "action.succeeded"} <= {e.name for e in pay.events}
    await sub.unsubscribe()
    assert {decode_map(m.data)["type"] for m in messages} >= {"task.started", "task.succeeded"}
    assert all(TRACE in (m.headers or {}).get("traceparent", "") for m in messages)


async def test_the_tool_calls_of_fanout_branches_are_children_of_the_fanouts_span(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    handle = await client.submit("traced.fanout", {}, key="fan-1", traceparent=TRACEPARENT)
    assert (await wait_terminal(client, handle.task_id))[-1].type == "task.succeeded"
    found = await spans.until(lambda found: len(_named(found, "ratchet.tool")) == 2)
    spread, = _named(found, "ratchet.step", **{"ratchet.step": "spread"})
    calls = _named(found, "ratchet.tool", **{"ratchet.tool": "lookup_policy"})
    assert len(calls) == 2 and all(
        _trace_of(c) == TRACE and c.parent is not None
        and c.parent.span_id == spread.context.span_id for c in calls)  # type: ignore[union-attr]


async def test_a_failed_call_marks_its_spans_failed_by_type_without_its_message(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    handle = await client.submit("traced.fails", {}, key="fails-1", traceparent=TRACEPARENT)
    assert (await wait_terminal(client, handle.task_id))[-1].type == "task.failed"
    found = await spans.until(lambda found: bool(_named(found, "ratchet.step")))
    call, = _named(found, "ratchet.tool", **{"ratchet.tool": "refuse"})
    step, = _named(found, "ratchet.step", **{"ratchet.step": "ask"})
    assert call.status.status_code is StatusCode.ERROR
    assert (call.attributes or {})["error.type"] == "ToolInvalidArgument"
    assert {"step.failed", "task.failed"} <= {e.name for e in step.events}
    # An exception's message may quote a secret: spans leave for the user's backend.
    assert "sk-live-4242" not in repr([(s.attributes, s.status.description,
                                         [(e.name, e.attributes) for e in s.events])
                                        for s in found])


async def test_a_task_resumed_by_a_decision_goes_on_in_its_submits_trace(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    """Parked for an approval, the task's actor is gone; the one the decision starts reads
    the trace from the task's row. The decision's routing is in the approver's trace."""
    task_id = task_id_for("acme", "approve-1")
    asked: list[ratchet.Event] = []
    async with asyncio.timeout(20):
        await client.submit("traced.approve", {}, key="approve-1", traceparent=TRACEPARENT)
        async for event in client.watch(task_id):
            if event.type == "approval.requested":
                asked.append(event)
                break
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # passivated
    request = asked[0].payload
    env = Envelope(type="approval.decision", message_id="decision-1",
                   correlation_id=request["approval_id"],
                   body={"task_id": task_id, "approval_id": request["approval_id"],
                         "decision": "approve", "decided_by": "dana",
                         "request_hash": request["request_hash"]})
    decider = TracerProvider().get_tracer("approver")  # the approver's own tracing
    with decider.start_as_current_span("approve") as approving:
        await client.publish_signed("ratchet.decisions.acme", encode(env))
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    found = await spans.until(lambda found: bool(
        _named(found, "ratchet.step", **{"ratchet.step": "pay"}))
        and bool(_named(found, "ratchet.decisions")))
    intake, = _named(found, "ratchet.intake", **{"ratchet.task_id": task_id})
    pay, = _named(found, "ratchet.step", **{"ratchet.step": "pay"})
    call, = _named(found, "ratchet.tool", **{"ratchet.idempotency_key": "charge:c-9"})
    assert _trace_of(pay) == _trace_of(call) == TRACE
    assert pay.parent is not None and pay.parent.span_id == intake.context.span_id  # type: ignore[union-attr]
    assert node.store is not None
    applied = [e for e in await node.store.audit_log("acme") if e["outcome"] == "applied"]
    assert [e["detail"].get("trace_id") for e in applied] == [TRACE]
    # The decision's routing is a span of the approver's trace.
    routed, = _named(found, "ratchet.decisions")
    assert routed.parent is not None \
        and routed.parent.span_id == approving.get_span_context().span_id


async def test_the_callers_current_span_is_continued_without_a_traceparent_argument(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    tracer = TracerProvider().get_tracer("producer")  # the producer's own OpenTelemetry
    with tracer.start_as_current_span("producer") as producer:
        handle = await client.submit_sync("traced", {}, key="traced-2")
    await wait_terminal(client, handle.task_id)
    found = await spans.until(_done)
    trace_id = format(producer.get_span_context().trace_id, "032x")
    api, = [s for s in _named(found, "ratchet.api") if _trace_of(s) == trace_id]
    assert api.parent is not None and api.parent.span_id == producer.get_span_context().span_id
    assert (api.attributes or {})["ratchet.task_id"] == handle.task_id
    assert {(s.attributes or {}).get("ratchet.step") for s in _named(found, "ratchet.step")
            if _trace_of(s) == trace_id} == {"pay", "assistant", "done"}
    assert node.store is not None
    assert trace_id in ((await node.store.load_task(handle.task_id)).traceparent or "")


async def _admin_list(client: ratchet.Client, command_id: str, traceparent: str,
                      header: str = "traceparent") -> Reply:
    """``admin list`` as a foreign client sends it, with a ``traceparent`` header. The
    client connected before the node granted its key: the first requests may find no
    responder while the server takes the new permissions (a bounded number of tries, each
    after a round trip to the server)."""
    env = Envelope(type="admin.list", message_id=command_id, correlation_id=command_id,
                   body={"command_id": command_id})
    subject, data = "ratchet.admin.acme.list", encode(env)
    for _ in range(50):
        try:
            msg = await client.nc.request(subject, data, timeout=10, headers={
                **client.sign(subject, data), header: traceparent})
            return Reply.model_validate(decode_map(msg.data))
        except NoRespondersError:
            await client.nc.flush()
    raise AssertionError("no admin service answered")


async def test_an_admin_command_in_a_trace_is_audited_with_its_trace_id(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    """A foreign client's request: the traceparent header is all it takes (here as NATS's
    Go client spells it)."""
    assert (await _admin_list(client, "cmd-1", TRACEPARENT, header="Traceparent")).ok
    assert node.store is not None
    log = await node.store.audit_log("acme")
    assert [(e["outcome"], e["detail"].get("trace_id")) for e in log] == [
        ("requested", TRACE), ("ok", TRACE)]
    assert (await node.store.verify_audit()).ok
    admin, = await spans.until(lambda found: bool(_named(found, "ratchet.admin")))
    assert _trace_of(admin) == TRACE


async def test_a_malformed_traceparent_starts_a_trace_of_its_own(
    node: ratchet.Node, client: ratchet.Client, spans: Spans
) -> None:
    await _admin_list(client, "cmd-2", "00-" + "z" * 32 + "-" + "0" * 16 + "-01")
    admin, = await spans.until(lambda found: bool(_named(found, "ratchet.admin")))
    assert admin.parent is None and admin.context is not None and admin.context.is_valid
    with pytest.raises(ValueError, match="traceparent"):
        await client.submit("traced", {}, key="bad", traceparent="not-a-traceparent")


async def test_tracing_off_makes_no_span_and_events_carry_no_trace(
    node: ratchet.Node, client: ratchet.Client
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # the user's own provider; Ratchet's tracing stays off
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    task_id = task_id_for("acme", "untraced")
    messages, sub = await _event_headers(client, task_id)
    await client.submit("traced", {}, key="untraced", traceparent=TRACEPARENT)
    events = await wait_terminal(client, task_id)
    await sub.unsubscribe()
    assert events[-1].type == "task.succeeded"
    assert not tracing.enabled() and exporter.get_finished_spans() == ()
    assert messages and not any("traceparent" in (m.headers or {}) for m in messages)
    assert node.store is not None
    assert (await node.store.load_task(task_id)).traceparent is None
    assert tracing.span("x") is tracing.span("y")  # one shared null context, no span


def test_serve_traces_on_the_flag_or_the_standard_variables() -> None:
    assert not wanted(False, {})
    assert wanted(True, {})
    assert wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(False, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted(True, {"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(True, {"OTEL_SDK_DISABLED": "true"})
    assert start_tracing(False, {}) is None and not tracing.enabled()


def test_an_exporter_that_is_not_installed_refuses_with_what_to_install() -> None:
    with pytest.raises(TracingUnavailable, match="opentelemetry-exporter-otlp-proto-grpc"):
        start_tracing(True, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(TracingUnavailable, match="zipkin"):
        start_tracing(True, {"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not tracing.enabled()

