"""``ToolWorker``: serves tools to Ratchet nodes from another process (or host).

A worker consumes ``ratchet.tools.<tenant>.<tool>`` (stream RATCHET_TOOLS) through one
durable pull consumer per (tenant, tool), ``tools-<tenant>-<tool>``, shared by every worker
of that tool: JetStream hands each request to one of them, so adding a worker adds
capacity, and a slow tool holds up only its own consumer. Each tool has at most
``max_in_flight`` requests in progress in one worker; the rest wait in the stream.

For each request (protocol/tool_wire.py): run the tool's code (``op="call"``) or its
``query``, publish the reply to the request's ``reply_to``, then ack. A worker that dies
before its ack leaves the request to be redelivered after ``ack_wait`` (extended while the
code runs): the idempotency key the request carries makes the provider apply it once. The
``max_deliver``-th delivery of a request is not run again but dead-lettered
(``ratchet.dlq.tools.<tenant>``): a request that kills its workers stops there. A request
past its deadline is acked unrun (nobody waits for it: the node reconciles by query); a
malformed one is dead-lettered. Nothing a request holds crashes the worker.

Tool code gets a ``ToolContext`` with the request's task, key and attempt, the worker's
``resources``, and an empty ``session`` (sessions pinned to a worker are not built yet).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError
from pydantic import BaseModel, ValidationError

from ratchet.actors.transport.bus import STREAM_GONE, deliveries, stream_configs
from ratchet.actors.workflow.tools import Accepted, Tool, ToolContext
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import InvalidMessage, ToolDefinitionError
from ratchet.protocol.redaction import dump_model
from ratchet.protocol.subjects import (
    STREAM_TOOLS,
    check_token,
    dlq_subject,
    tool_durable,
    tool_reply_route,
    tool_subject,
)
from ratchet.protocol.tool_wire import (
    CORRELATION_HEADER,
    ToolAccepted,
    ToolReply,
    ToolReplyError,
    ToolRequest,
    decode_request,
    error_of_exception,
    revealed,
)

__all__ = ["ToolWorker"]

log = structlog.get_logger("ratchet.tool_worker")


class ToolWorker:
    """Serves ``tools`` (declarations with code: ``served_by`` or ``@ratchet.tool``) for
    ``tenants``.

    Args:
        nats_or_url: a connected NATS client (kept open at stop) or a server URL.
        max_in_flight: requests of one tool in progress at once in this worker.
        ack_wait: seconds before JetStream redelivers a request this worker has not acked
            (extended every third of it while the code runs).
        max_deliver: the delivery of a request that is dead-lettered instead of run.
        connect_options: passed to ``nats.connect`` (credentials, TLS) for a URL.
    """

    def __init__(self, nats_or_url: NATS | str, tools: Iterable[Tool[Any, Any]],
                 tenants: Iterable[str] | str, *, max_in_flight: int = 16,
                 resources: Mapping[str, Any] | None = None, ack_wait: float = 30.0,
                 max_deliver: int = 5, clock: Clock | None = None,
                 connect_options: Mapping[str, Any] | None = None) -> None:
        self.tools = {t.name: t for t in tools}
        self.tenants = [tenants] if isinstance(tenants, str) else list(tenants)
        for name in self.tools:
            check_token(name, "tool")
        for tenant in self.tenants:
            check_token(tenant, "tenant")
        if not self.tools or not self.tenants or max_in_flight < 1 or max_deliver < 2:
            raise ToolDefinitionError("a ToolWorker needs tools, tenants, max_in_flight >= 1"
                                      " and max_deliver >= 2")
        self._source = nats_or_url
        self._connect_options = dict(connect_options or {})
        self.max_in_flight, self.ack_wait, self.max_deliver = max_in_flight, ack_wait, max_deliver
        self.resources = dict(resources or {})
        self.clock = clock or SystemClock()
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        #: Figures: requests answered, dead-lettered, and acked unrun (past their deadline).
        self.served = self.dead_lettered = self.expired = 0

    async def __aenter__(self) -> ToolWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect (for a URL), create the stream if no node has, bind the consumers and
        start fetching."""
        if isinstance(self._source, str):
            self.nc = await nats.connect(self._source, name="ratchet-tool-worker",
                                         max_reconnect_attempts=-1, ping_interval=5,
                                         **self._connect_options)
        else:
            self.nc = self._source
        self._js = self.nc.jetstream()
        await self._ensure_stream()
        for tenant in self.tenants:
            for tool in self.tools.values():
                sub = await self._bind(tenant, tool.name)
                self._loops.append(asyncio.create_task(self._fetch_loop(sub, tenant, tool)))

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop fetching, let the requests in progress finish (at most ``timeout`` s; the
        rest are redelivered to another worker), close a connection this worker opened.
        Safe to call twice."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        if self._running:
            await asyncio.wait(self._running, timeout=timeout)
        for task in self._running:
            task.cancel()
        if isinstance(self._source, str) and self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    async def _ensure_stream(self) -> None:
        assert self._js is not None
        try:
            await self._js.stream_info(STREAM_TOOLS)
        except NotFoundError:  # no node started yet: the node's own config, its defaults
            config = next(c for c in stream_configs() if c.name == STREAM_TOOLS)
            with contextlib.suppress(BadRequestError):  # a node made it meanwhile
                await self._js.add_stream(config)

    async def _bind(self, tenant: str, tool: str) -> Any:
        assert self._js is not None
        durable = tool_durable(tenant, tool)
        config = ConsumerConfig(
            durable_name=durable, filter_subject=tool_subject(tenant, tool),
            ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait,
            max_deliver=self.max_deliver, max_ack_pending=10_000)
        try:
            # The first worker's settings stand: a later one with others does not change
            # them under the workers already serving (add_consumer would update them).
            await self._js.consumer_info(STREAM_TOOLS, durable)
        except NotFoundError:
            with contextlib.suppress(BadRequestError):  # another worker made it meanwhile
                await self._js.add_consumer(STREAM_TOOLS, config)
        return await self._js.pull_subscribe_bind(durable, stream=STREAM_TOOLS)

    async def _fetch_loop(self, sub: Any, tenant: str, tool: Tool[Any, Any]) -> None:
        room = asyncio.Semaphore(self.max_in_flight)
        while True:
            await room.acquire()  # a request is fetched only when one can start at once
            try:
                msgs = await sub.fetch(1, timeout=5.0)
            except (TimeoutError, NatsTimeoutError):
                room.release()
                continue
            except STREAM_GONE as exc:  # deleted under us: make it again and bind again
                room.release()
                log.warning("tool stream or consumer missing; binding again", error=repr(exc))
                await asyncio.sleep(0.5)  # pacing against NATS
                with contextlib.suppress(Exception):
                    await self._ensure_stream()
                    sub = await self._bind(tenant, tool.name)
                continue
            except Exception as exc:  # reconnecting, a slow server: the loop must go on
                room.release()
                log.warning("fetching tool requests failed; trying again", tool=tool.name,
                            error=repr(exc))
                await asyncio.sleep(0.5)  # pacing against NATS
                continue
            task = asyncio.create_task(self._handle(msgs[0], tenant, tool))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(lambda _: room.release())

    async def _handle(self, msg: Msg, tenant: str, tool: Tool[Any, Any]) -> None:
        """One delivery. Runs in its own task; logs instead of raising."""
        try:
            await self._serve(msg, tenant, tool)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not stop the worker; the request is redelivered
            log.exception("tool request handling failed", subject=msg.subject)

    async def _serve(self, msg: Msg, tenant: str, tool: Tool[Any, Any]) -> None:
        try:
            request = decode_request(msg.data)
            _check_route(request, tenant, tool.name)
        except InvalidMessage as exc:
            await self._dead_letter(msg, tenant, exc.message)
            return
        if deliveries(msg) >= self.max_deliver:
            # Its earlier deliveries' workers died or hung: it is not run again.
            await self._reply(request, _failure("OUTCOME_UNKNOWN", "dead-lettered after"
                                                f" {deliveries(msg)} deliveries"))
            await self._dead_letter(msg, tenant, f"delivered {deliveries(msg)} times")
            return
        remaining = request.deadline - self.clock.now()
        if remaining <= 0:
            self.expired += 1
            log.info("tool request past its deadline; not run", tool=tool.name,
                     correlation_id=request.correlation_id, key=request.idempotency_key)
            await msg.ack()
            return
        beat = asyncio.create_task(self._in_progress(msg))
        try:
            outcome = await self._run(request, tool, remaining)
        finally:
            beat.cancel()
        await self._reply(request, outcome)
        await msg.ack()  # after the reply: a worker dying in between is redelivered
        self.served += 1

    async def _run(self, request: ToolRequest, tool: Tool[Any, Any], budget: float) -> ToolReply:
        """Run the code for ``request`` within ``budget`` seconds; its reply."""
        fn = tool.fn if request.op == "call" else tool.query
        if fn is None:
            return _failure("INVALID_ARGUMENT", f"{tool.name} has no query")
        try:
            args = tool.args.model_validate(request.args)
        except ValidationError as exc:
            return _failure("INVALID_ARGUMENT", f"arguments of {tool.name}: {exc.errors()[:3]}")
        ctx = ToolContext(request.task_id, request.tenant, tool.name, request.idempotency_key,
                          request.attempt, {}, self.resources)
        try:
            async with asyncio.timeout(budget):
                if asyncio.iscoroutinefunction(fn):
                    value = await fn(ctx, args)
                else:  # blocking code: a thread (it cannot be interrupted at the deadline)
                    value = await asyncio.to_thread(fn, ctx, args)
        except TimeoutError:
            return _failure("OUTCOME_UNKNOWN", f"{tool.name} ran past the caller's deadline")
        except Exception as exc:  # the tool's failure is an answer
            return ToolReply(correlation_id=request.correlation_id,
                             idempotency_key=request.idempotency_key, ok=False,
                             error=error_of_exception(exc))
        return _success(value)

    async def _in_progress(self, msg: Msg) -> None:
        """Tell JetStream the request is being worked on, so it is not redelivered to
        another worker while the code runs longer than ``ack_wait``."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)  # a heartbeat's pace, not a wait for a result
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def _reply(self, request: ToolRequest, reply: ToolReply) -> None:
        assert self.nc is not None
        reply = reply.model_copy(update={"correlation_id": request.correlation_id,
                                         "idempotency_key": request.idempotency_key})
        try:
            data = encode(reply)
        except Exception as exc:  # a result msgpack cannot carry
            data = encode(_failure("OUTCOME_UNKNOWN", f"result not encodable: {exc}").model_copy(
                update={"correlation_id": request.correlation_id,
                        "idempotency_key": request.idempotency_key}))
        await self.nc.publish(request.reply_to, data,
                              headers={CORRELATION_HEADER: request.correlation_id})

    async def _dead_letter(self, msg: Msg, tenant: str, why: str) -> None:
        assert self._js is not None
        self.dead_lettered += 1
        log.warning("tool request dead-lettered", subject=msg.subject, error=why[:300])
        with contextlib.suppress(Exception):  # the letter is a courtesy; the term is not
            await self._js.publish(dlq_subject("tools", tenant), msg.data, headers={
                "Ratchet-Error-Code": "INVALID_ARGUMENT", "Ratchet-Error": why[:512],
                "Ratchet-Source-Subject": msg.subject}, timeout=5.0)
        await msg.term()


def _check_route(request: ToolRequest, tenant: str, tool: str) -> None:
    """A request must name the tenant and tool of its subject, and ask for its reply on its
    tenant's reply subjects (nowhere else: a forged request must not aim replies at another
    tenant or at any subject).

    Raises:
        InvalidMessage: it does not.
    """
    if request.tenant != tenant or request.tool != tool:
        raise InvalidMessage(f"request names {request.tenant}/{request.tool}, its subject"
                             f" {tenant}/{tool}")
    if tool_reply_route(request.reply_to) != tenant:
        raise InvalidMessage(f"reply_to {request.reply_to[:100]!r} is not a reply subject"
                             f" of tenant {tenant}")


def _failure(code: str, message: str) -> ToolReply:
    return ToolReply(correlation_id="-", ok=False,
                     error=ToolReplyError(code=code, message=message[:4000]))


def _success(value: Any) -> ToolReply:
    if isinstance(value, Accepted):
        return ToolReply(correlation_id="-", ok=True, accepted=ToolAccepted(
            provider_id=value.provider_id, correlation_id=value.correlation_id,
            timeout=value.timeout))
    if isinstance(value, BaseModel):
        value = revealed(dump_model(value))
    return ToolReply(correlation_id="-", ok=True, result=value)
