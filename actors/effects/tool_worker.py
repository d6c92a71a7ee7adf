"""``ToolWorker``: serves tools to Ratchet nodes from another process (or host).

A worker consumes ``ratchet.tools.<tenant>.<tool>`` (stream ``RATCHET_TOOLS_<tenant>``:
actors/transport/tool_queues.py) through one durable pull consumer per (tenant, tool),
``tools-<tenant>-<tool>``, shared by every worker of that tool: JetStream hands each
request to one of them, so adding a worker adds capacity, and a slow tool holds up only
its own consumer. Each tool has at most
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
``resources``; for a tool with a session, the session's state and live resources, the
session pinned to this worker (``worker_id``; its own consumer per tool,
``pin-<tenant>-<tool>-<worker>``: actors/effects/pinned_sessions.py), else an empty
``session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from ratchet.actors.effects.pinned_sessions import PinnedSessions
from ratchet.actors.effects.tool_dispatch import addressed, failure, run_tool, wire_reply
from ratchet.actors.transport.bus import deliveries
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.actors.transport.tool_queues import (
    ensure_consumer,
    ensure_stream,
    tool_consumer_config,
    tool_stream_config,
)
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.auth import Signer, inbox_prefix
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import InvalidMessage, ToolDefinitionError
from ratchet.protocol.subjects import (
    check_token,
    check_worker_id,
    dlq_subject,
    tool_ping_subject,
    tool_reply_route,
    tool_stream,
)
from ratchet.protocol.tool_wire import (
    CORRELATION_HEADER,
    ToolReply,
    ToolRequest,
    decode_request,
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
        worker_id: names this worker's pinned sessions' subjects (``[A-Za-z0-9_]{1,32}``);
            give the same one after a restart to take its sessions' queued calls back.
            Default: a fresh one per process.
        session_idle: seconds after which a pinned session unused is stopped here.
    """

    #: Seconds one pull request waits on the server for a request.
    fetch_wait = 5.0

    def __init__(self, nats_or_url: NATS | str, tools: Iterable[Tool[Any, Any]],
                 tenants: Iterable[str] | str, *, max_in_flight: int = 16,
                 resources: Mapping[str, Any] | None = None, ack_wait: float = 30.0,
                 max_deliver: int = 5, clock: Clock | None = None,
                 connect_options: Mapping[str, Any] | None = None,
                 worker_id: str | None = None, session_idle: float = 600.0) -> None:
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
        self.worker_id = check_worker_id(worker_id or f"w{secrets.token_hex(5)}")
        self.sessions = PinnedSessions(self.resources, self.clock, session_idle)
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._pings: list[Any] = []
        #: Figures: requests answered, dead-lettered, and acked unrun (past their deadline).
        self.served = self.dead_lettered = self.expired = 0

    async def __aenter__(self) -> ToolWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect (for a URL), bind the consumers and start fetching.

        A tenant's stream or a tool's consumer that no node has created yet is created here
        if this worker may (a node key); a ``tool_worker`` key may not, and its loop binds
        as soon as a node has (at its first call of the tool)."""
        if isinstance(self._source, str):
            options = dict(self._connect_options)
            seed = options.get("nkeys_seed_str")
            if seed and "inbox_prefix" not in options:
                # JetStream's answers and deliveries come to the inbox: the key's own, the
                # only one its NATS permissions let it subscribe to.
                options["inbox_prefix"] = inbox_prefix(Signer(str(seed).encode()).public_key)
            self.nc = await nats.connect(self._source, name="ratchet-tool-worker",
                                         max_reconnect_attempts=-1, ping_interval=5, **options)
        else:
            self.nc = self._source
        self._js = self.nc.jetstream()
        for tenant in self.tenants:
            for tool in self.tools.values():
                # One room per tool: its shared and its pinned requests count together.
                room = asyncio.Semaphore(self.max_in_flight)
                pinned = [None, self.worker_id] if tool.session != "default" else [None]
                for worker in pinned:
                    sub = await self._try_bind(tenant, tool.name, worker)
                    self._loops.append(asyncio.create_task(
                        self._fetch_loop(sub, tenant, tool, room, worker)))
        self._loops.append(asyncio.create_task(self._sweep_sessions()))
        if any(tool.session != "default" for tool in self.tools.values()):
            # Liveness probes: a node asks before it sends a call pinned to this worker, and
            # NATS says "no responders" at once when this worker's connection is gone.
            for tenant in self.tenants:
                self._pings.append(await self.nc.subscribe(
                    tool_ping_subject(tenant, self.worker_id), cb=_pong))
            await subscriptions_registered(self.nc)  # started = probed alive

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop fetching, let the requests in progress finish (at most ``timeout`` s; the
        rest are redelivered to another worker), close a connection this worker opened.
        Safe to call twice."""
        for sub in self._pings:
            await _unsubscribe(sub)
        self._pings.clear()
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        if self._running:
            await asyncio.wait(self._running, timeout=timeout)
        for task in self._running:
            task.cancel()
        await self.sessions.stop()
        if isinstance(self._source, str) and self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    async def _try_bind(self, tenant: str, tool: str, worker: str | None) -> Any | None:
        """A pull subscription on the tool's consumer (with ``worker``, its pinned one),
        made (with the tenant's stream) if missing and this worker may; None if it cannot
        be bound yet."""
        assert self._js is not None
        config = tool_consumer_config(tenant, tool, self.ack_wait, self.max_deliver, worker)
        stream, durable = tool_stream(tenant), config.durable_name
        assert durable is not None
        try:
            try:
                await self._js.consumer_info(stream, durable)
            except NotFoundError:
                await ensure_stream(self._js, tool_stream_config(tenant))
                await ensure_consumer(self._js, tenant, config)
            return await self._js.pull_subscribe_bind(durable, stream=stream)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no permission to create it, no answer, reconnecting
            log.warning("tool consumer not bound yet; trying again", tenant=tenant,
                        tool=tool, error=repr(exc))
            return None

    async def _fetch_loop(self, sub: Any | None, tenant: str, tool: Tool[Any, Any],
                          room: asyncio.Semaphore, worker: str | None) -> None:
        try:
            while True:
                if sub is None:
                    await asyncio.sleep(1.0)  # pacing against NATS while unbound
                    sub = await self._try_bind(tenant, tool.name, worker)
                    continue
                await room.acquire()  # a request is fetched only when one can start at once
                try:
                    msgs = await sub.fetch(1, timeout=self.fetch_wait)
                except (TimeoutError, NatsTimeoutError):
                    room.release()
                    continue
                except Exception as exc:  # gone, reconnecting, a slow server: go on
                    room.release()
                    log.warning("fetching tool requests failed; binding again", tool=tool.name,
                                error=repr(exc))
                    # The old subscription must go: a pull request it left on the server
                    # would be handed a request that nobody reads until ack_wait.
                    await _unsubscribe(sub)
                    sub = None
                    continue
                task = asyncio.create_task(self._handle(msgs[0], tenant, tool))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                task.add_done_callback(lambda _: room.release())
        finally:
            if sub is not None:
                await _unsubscribe(sub)

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
            await self._reply(request, failure("OUTCOME_UNKNOWN", "dead-lettered after"
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
            if request.session_id is not None:
                outcome = await self.sessions.call(request, tool, remaining)
                outcome = outcome.model_copy(update={"worker": self.worker_id})
            else:
                outcome = await run_tool(request, tool, remaining, {}, {}, self.resources)
        finally:
            beat.cancel()
        await self._reply(request, outcome)
        await msg.ack()  # after the reply: a worker dying in between is redelivered
        self.served += 1

    async def _sweep_sessions(self) -> None:
        """Stop the pinned sessions left unused (a pace, not a wait for a result)."""
        while True:
            await asyncio.sleep(max(1.0, min(self.sessions.idle / 4, 60.0)))
            with contextlib.suppress(Exception):
                await self.sessions.sweep()

    async def _in_progress(self, msg: Msg) -> None:
        """Tell JetStream the request is being worked on, so it is not redelivered to
        another worker while the code runs longer than ``ack_wait``."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)  # a heartbeat's pace, not a wait for a result
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def _reply(self, request: ToolRequest, reply: ToolReply) -> None:
        assert self.nc is not None
        try:
            data = encode(wire_reply(addressed(reply, request)))
        except Exception as exc:  # a result msgpack cannot carry, a field over its limits
            data = encode(addressed(failure("OUTCOME_UNKNOWN", f"result not encodable: {exc}"),
                                    request))
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


async def _pong(msg: Msg) -> None:
    """A liveness probe: answered at once, from the subscription's task."""
    with contextlib.suppress(Exception):  # the prober gave up, or the connection closes
        await msg.respond(b"")


async def _unsubscribe(sub: Any) -> None:
    with contextlib.suppress(Exception):  # the connection may be closing
        await sub.unsubscribe()


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
