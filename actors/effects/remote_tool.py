"""A node's calls of remote tools: one request on JetStream, one reply on the node's inbox.

The action runner (actors/effects/actions.py) calls a tool declared with ``remote_tool``
through :meth:`RemoteTools.ask` instead of its tool session, after the ledger's IN_FLIGHT
commit, exactly where an in-process call would run. The request goes to
``ratchet.tools.<tenant>.<tool>`` (stream ``RATCHET_TOOLS_<tenant>``, created with the
tool's consumer before the first request: actors/transport/tool_queues.py;
protocol/tool_wire.py); the reply
comes, on core NATS, to ``ratchet.toolreply.<tenant>.<inbox>``, the inbox being this node
process's own.

Why a node-owned reply subject, not the task's mail subject: mail is sealed by nodes
(protocol/mail_seal.py), which a worker in another language cannot do, and it is delivered
through the task actor's mailbox, which is busy running the very step that awaits the
reply. The consequence: a reply is only heard by the process that asked. One that comes
after the node died, or after the call's timeout, is dropped (logged and counted); the
ledger still says IN_FLIGHT (or UNKNOWN), and the runner reconciles it with the ``query``
op, itself a remote request, as for an in-process call that timed out.

Which reply is believed: one whose correlation id is a call this process sent and still
awaits (so a call recorded IN_FLIGHT, or a query of one recorded UNKNOWN), whose
idempotency key is that call's and which came on a reply subject of that call's tenant.
The correlation id carries 80 bits from ``secrets``: it cannot be guessed, only read from
the request, which only the tenant's workers (and nodes) may read under NATS permissions.
So a forged reply can come only from something that may serve the tenant's tools anyway.

Answers are what a tool session's are: ``(True, result | Accepted | None)`` or
``(False, exception)``; no reply within the timeout is ``ToolOutcomeUnknown``, a write's
UNKNOWN. Nothing is retried here: the runner's policy decides.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import APIError, NoStreamResponseError

from ratchet.actors.effects.tool_session import Invoke
from ratchet.actors.transport.bus import Bus, StreamLimits
from ratchet.actors.transport.tool_queues import ToolQueues
from ratchet.actors.workflow.tools import Accepted
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.clock import Clock
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import InvalidMessage, ToolOutcomeUnknown, ToolTransient
from ratchet.protocol.ids import new_id
from ratchet.protocol.redaction import dump_model
from ratchet.protocol.subjects import (
    is_worker_id,
    tool_pinned_subject,
    tool_reply_route,
    tool_reply_subject,
    tool_subject,
)
from ratchet.protocol.tool_wire import (
    CORRELATION_HEADER,
    DEADLINE_HEADER,
    ToolReply,
    ToolRequest,
    decode_reply,
    exception_of_error,
    request_msg_id,
    revealed,
)
from ratchet.protocol.tracing import outbound_headers

__all__ = ["RemoteAsk", "RemoteTools", "no_remote_tools"]

log = structlog.get_logger("ratchet.remote_tool")


#: How the runner asks a remote tool: ``(task_id, tenant, invoke) -> answer``.
RemoteAsk = Callable[[str, str, Invoke], Coroutine[Any, Any, tuple[bool, Any]]]


async def no_remote_tools(task_id: str, tenant: str, invoke: Invoke) -> tuple[bool, Any]:
    """A runner without a node's connection (a unit test's): nothing is sent."""
    return (False, ToolTransient(f"{invoke.tool.name}: no tool transport here (no node)",
                                 tool=invoke.tool.name))


@dataclass(slots=True)
class _Waiting:
    key: str | None
    tenant: str
    future: asyncio.Future[ToolReply]


class RemoteTools:
    """Publishes remote tool requests and settles each call with the one reply whose
    correlation id, idempotency key and tenant all match it.

    Args:
        bus: the node's connection.
        node_id: names the inbox (with a random suffix: each process has its own).
        clock: the deadline written in each request is ``clock.now() + timeout``.
        limits, replicas: of the tenants' tool streams this node creates.
        store: where the state of tools' sessions is kept (a tool with a session needs it).
    """

    def __init__(self, bus: Bus, node_id: str, clock: Clock,
                 limits: StreamLimits | None = None, replicas: int = 1,
                 store: TaskStore | None = None) -> None:
        self.bus = bus
        self.clock = clock
        self.store = store
        #: (task id, session) -> the worker holding it; bounded (oldest dropped): a session
        #: forgotten here is taken again by any worker, from its stored state.
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.queues = ToolQueues(bus.js, limits, replicas)
        self.inbox = f"{re.sub(r'[^A-Za-z0-9_-]', '_', node_id)[:48]}-{secrets.token_hex(6)}"
        self._waiting: dict[str, _Waiting] = {}
        self._subscribed = False
        self._subscribing = asyncio.Lock()
        #: Replies dropped: malformed, matching no waiting call (late, repeated, forged), or
        #: matching a call's correlation id but not its key or tenant.
        self.dropped = 0

    async def ask(self, task_id: str, tenant: str, invoke: Invoke) -> tuple[bool, Any]:
        """One call or query of a remote tool; its answer, as a tool session gives it."""
        await self._subscribe()
        tool, loop = invoke.tool, asyncio.get_running_loop()
        started = loop.time()
        # Unguessable (the ULID's random bits come from a seeded PRNG): a reply must prove
        # it read the request.
        cid = f"{new_id('tcl')}{secrets.token_hex(10)}"
        pinned = tool.session != "default"
        state = await self._session_state(task_id, tool.session) if pinned else None
        request = ToolRequest(
            correlation_id=cid, task_id=task_id, tenant=tenant, tool=tool.name,
            op="query" if invoke.op == "query" else "call",
            args=revealed(dump_model(invoke.args)), idempotency_key=invoke.key,
            attempt=invoke.attempt, deadline=self.clock.now() + invoke.timeout,
            reply_to=tool_reply_subject(tenant, self.inbox),
            session_id=f"{task_id}:{tool.session}" if pinned else None, session_state=state)
        worker = self._pins.get((task_id, tool.session)) if pinned else None
        waiting = _Waiting(invoke.key, tenant, loop.create_future())
        self._waiting[cid] = waiting  # before the publish: a fast worker answers before its ack
        try:
            refused = await self._publish(request, min(invoke.timeout, 5.0), worker)
            if refused is not None:
                return (False, refused)
            try:
                reply = await asyncio.wait_for(
                    waiting.future, max(0.0, invoke.timeout - (loop.time() - started)))
            except TimeoutError:
                # The worker holding the session may be gone: the next call goes to any
                # worker, which takes the session from its stored state.
                self._pins.pop((task_id, tool.session), None)
                return (False, ToolOutcomeUnknown(
                    f"{tool.name}: no reply from a tool worker within {invoke.timeout:g}s",
                    tool=tool.name, correlation_id=cid))
        finally:
            del self._waiting[cid]
        if pinned:
            await self._session_after(task_id, tool.session, state, reply)
        return _answer(tool.name, reply)

    async def _session_state(self, task_id: str, session: str) -> dict[str, Any]:
        if self.store is None:
            return {}
        return await self.store.session_state(task_id, session)

    async def _session_after(self, task_id: str, session: str, before: dict[str, Any] | None,
                             reply: ToolReply) -> None:
        """Store the session's state the reply carries (if it changed) and pin the session
        to the worker that answered."""
        if reply.worker is not None and is_worker_id(reply.worker):
            self._pins[(task_id, session)] = reply.worker
            self._pins.move_to_end((task_id, session))
            while len(self._pins) > 10_000:
                self._pins.popitem(last=False)
        if reply.session_state is not None and reply.session_state != before and self.store:
            await self.store.save_session_state(task_id, session, reply.session_state,
                                                self.clock.now())

    async def _publish(self, request: ToolRequest, timeout: float,
                       worker: str | None = None) -> Exception | None:
        """Publish ``request`` to its stream (``worker``'s pinned subject, with one); None
        once stored, else the call's failure."""
        headers = outbound_headers({
            "Nats-Msg-Id": request_msg_id(request.idempotency_key, request.attempt, request.op,
                                          request.correlation_id),
            CORRELATION_HEADER: request.correlation_id,
            DEADLINE_HEADER: f"{request.deadline:.3f}"})
        try:
            await self.queues.ensure(request.tenant, request.tool, worker)
        except (APIError, TimeoutError, NatsError) as exc:  # nothing was sent
            return ToolTransient(f"{request.tool}: cannot make its queue: {exc!r}",
                                 tool=request.tool)
        try:
            subject = (tool_subject(request.tenant, request.tool) if worker is None
                       else tool_pinned_subject(request.tenant, request.tool, worker))
            await self.bus.js.publish(subject, encode(request), timeout=timeout,
                                      headers=headers)
        except (APIError, NoStreamResponseError) as exc:  # refused (a full queue, no stream)
            self.queues.forget(request.tenant)  # deleted under us: made again next time
            return ToolTransient(f"{request.tool}: request refused by JetStream: {exc}",
                                 tool=request.tool)
        except (TimeoutError, NatsError) as exc:  # no ack: it may have been stored
            self.queues.forget(request.tenant)  # or there is no stream (nats.py#533)
            return ToolOutcomeUnknown(f"{request.tool}: request not acknowledged: {exc!r}",
                                      tool=request.tool)
        return None

    async def _subscribe(self) -> None:
        if self._subscribed:
            return
        async with self._subscribing:
            if self._subscribed:
                return
            await self.bus.nc.subscribe(f"ratchet.toolreply.*.{self.inbox}", cb=self._on_reply)
            await self.bus.nc.flush()  # the server has it before the first request leaves
            self._subscribed = True

    async def _on_reply(self, msg: Msg) -> None:
        """A message on the inbox. Runs in the subscription's task; never raises."""
        try:
            reply = decode_reply(msg.data)
        except InvalidMessage as exc:
            self._drop("malformed tool reply", msg, error=exc.message)
            return
        waiting = self._waiting.get(reply.correlation_id)
        if waiting is None:
            self._drop("tool reply for no waiting call (late, repeated or forged)", msg,
                       correlation_id=reply.correlation_id)
        elif waiting.key != reply.idempotency_key or waiting.tenant != tool_reply_route(
                msg.subject):
            self._drop("tool reply does not match its call's key or tenant", msg,
                       correlation_id=reply.correlation_id)
        elif not waiting.future.done():
            waiting.future.set_result(reply)

    def _drop(self, why: str, msg: Msg, **details: Any) -> None:
        self.dropped += 1
        log.warning(why, subject=msg.subject[:200], size=len(msg.data), **details)


def _answer(tool: str, reply: ToolReply) -> tuple[bool, Any]:
    if not reply.ok:
        return (False, exception_of_error(reply.error, tool))
    if reply.accepted is not None:
        a = reply.accepted
        return (True, Accepted(a.provider_id, a.correlation_id, a.timeout))
    return (True, reply.result)
