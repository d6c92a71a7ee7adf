"""Remote tools' transport: a request on JetStream, its reply on the node's inbox.

A tool declared with ``remote_tool`` is asked like every tool (actors/effects/tool_calls.py:
correlation, deadline, no reply in time an unknown outcome, reconciliation by ``query``);
this is how its requests travel. The request goes to ``ratchet.tools.<tenant>.<tool>``
(stream ``RATCHET_TOOLS_<tenant>``, created with the tool's consumer before the first
request: actors/transport/tool_queues.py; protocol/tool_wire.py), or to
``ratchet.tools.<tenant>.<tool>.<worker>`` for a session pinned to that worker; the reply
comes, on core NATS, to ``ratchet.toolreply.<tenant>.<inbox>``, the inbox being this node
process's own. A request is checked against the wire's model as it becomes bytes, its
arguments dumped with their secrets in clear (the worker needs them).

Why a node-owned reply subject, not the task's mail subject: mail is sealed by nodes
(protocol/mail_seal.py), which a worker in another language cannot do, and it is delivered
through the task actor's mailbox, which is busy running the very step that awaits the
reply. The consequence: a reply is only heard by the process that asked. One that comes
after the node died, or after the call's timeout, is dropped (logged and counted); the
ledger still says IN_FLIGHT (or UNKNOWN), and the runner reconciles it.

Which reply is believed: one whose correlation id is a call this process sent and still
awaits (so a call recorded IN_FLIGHT, or a query of one recorded UNKNOWN), whose
idempotency key is that call's and which came on a reply subject of that call's tenant.
The correlation id carries 80 bits from ``secrets``: it cannot be guessed, only read from
the request, which only the tenant's workers (and nodes) may read under NATS permissions.
So a forged reply can come only from something that may serve the tenant's tools anyway.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js.errors import APIError, NoStreamResponseError
from pydantic import BaseModel

from ratchet.actors.effects.local_tools import no_remote_tools
from ratchet.actors.effects.tool_calls import RemoteAsk, SessionOf, ToolCalls
from ratchet.actors.transport.bus import Bus, StreamLimits
from ratchet.actors.transport.subscribed import subscriptions_registered
from ratchet.actors.transport.tool_queues import ToolQueues
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import (
    InvalidMessage,
    ToolOutcomeUnknown,
    ToolTransient,
    ToolWorkerGone,
)
from ratchet.protocol.redaction import dump_model
from ratchet.protocol.subjects import (
    tool_ping_subject,
    tool_pinned_subject,
    tool_reply_route,
    tool_reply_subject,
    tool_subject,
)
from ratchet.protocol.tool_wire import (
    CORRELATION_HEADER,
    DEADLINE_HEADER,
    ToolRequest,
    decode_reply,
    request_msg_id,
    revealed,
)
from ratchet.protocol.tracing import outbound_headers

#: ``RemoteAsk`` and ``no_remote_tools`` are re-exported under the names branch code
#: imports them by (they are every tool's now: tool_calls.py, local_tools.py).
__all__ = ["JetStreamTools", "RemoteAsk", "no_remote_tools"]

#: Pauses before asking a silent worker's ping subject again ("no responders" only
#: counts as death when it holds for all of them).
_PING_AGAIN_S = (0.1, 0.4)

log = structlog.get_logger("ratchet.remote_tool")


class JetStreamTools:
    """The transport of remote tools' requests and replies (a ``ToolTransport``).

    Args:
        bus: the node's connection.
        node_id: names the inbox (with a random suffix: each process has its own).
        limits, replicas: of the tenants' tool streams this node creates.
    """

    grace = 0.0  # a reply after the timeout is not believed: the ledger reconciles
    carries_state = True
    wire = True
    #: Seconds a pinned worker's liveness probe waits for its answer (at most).
    probe_timeout = 1.0

    def __init__(self, bus: Bus, node_id: str, limits: StreamLimits | None = None,
                 replicas: int = 1) -> None:
        self.bus = bus
        self.queues = ToolQueues(bus.js, limits, replicas)
        self.inbox = f"{re.sub(r'[^A-Za-z0-9_-]', '_', node_id)[:48]}-{secrets.token_hex(6)}"
        self._calls: ToolCalls | None = None
        self._subscribed = False
        self._subscribing = asyncio.Lock()

    def attach(self, calls: ToolCalls) -> None:
        self._calls = calls

    def reply_to(self, tenant: str) -> str:
        return tool_reply_subject(tenant, self.inbox)

    async def send(self, request: ToolRequest, tool: Tool[Any, Any], worker: str | None,
                   session_of: SessionOf, timeout: float) -> Exception | None:
        """Publish ``request`` to its stream (``worker``'s pinned subject, with one); None
        once stored, else the call's failure."""
        await self._subscribe()
        if worker is not None and not await self._alive(request.tenant, worker, timeout):
            return ToolWorkerGone(f"{request.tool}: tool worker {worker}, holding the session,"
                                  " is gone; the request was not sent", tool=request.tool,
                                  worker=worker)
        args: Any = request.args  # the model, from the caller (tool_calls.py)
        wire = ToolRequest.model_validate({**request.model_dump(exclude={"args"}), "args": (
            revealed(dump_model(args) if isinstance(args, BaseModel) else args))})
        headers = outbound_headers({
            "Nats-Msg-Id": request_msg_id(wire.idempotency_key, wire.attempt, wire.op,
                                          wire.correlation_id),
            CORRELATION_HEADER: wire.correlation_id,
            DEADLINE_HEADER: f"{wire.deadline:.3f}"})
        try:
            await self.queues.ensure(wire.tenant, wire.tool, worker)
        except (APIError, TimeoutError, NatsError) as exc:  # nothing was sent
            return ToolTransient(f"{wire.tool}: cannot make its queue: {exc!r}",
                                 tool=wire.tool)
        try:
            subject = (tool_subject(wire.tenant, wire.tool) if worker is None
                       else tool_pinned_subject(wire.tenant, wire.tool, worker))
            await self.bus.js.publish(subject, encode(wire), timeout=min(timeout, 5.0),
                                      headers=headers)
        except (APIError, NoStreamResponseError) as exc:  # refused (a full queue, no stream)
            self.queues.forget(wire.tenant)  # deleted under us: made again next time
            return ToolTransient(f"{wire.tool}: request refused by JetStream: {exc}",
                                 tool=wire.tool)
        except (TimeoutError, NatsError) as exc:  # no ack: it may have been stored
            self.queues.forget(wire.tenant)  # or there is no stream (nats.py#533)
            return ToolOutcomeUnknown(f"{wire.tool}: request not acknowledged: {exc!r}",
                                      tool=wire.tool)
        return None

    async def _alive(self, tenant: str, worker: str, timeout: float) -> bool:
        """Whether ``worker`` may still be there: False only when NATS answers "no
        responders" on its ping subject three times over half a second (nobody
        subscribed: its connection is gone — not a subscription still on its way to this
        server, through a cluster's routes or a reload of the server's users). A probe
        answered late, or not at all, is not taken as death: the call goes on, and its own
        timeout decides (UNKNOWN, reconciled)."""
        for pause in _PING_AGAIN_S:
            if not await self._unheard(tenant, worker, timeout):
                return True
            await asyncio.sleep(pause)  # the probe's own pacing, not a test's wait
        return not await self._unheard(tenant, worker, timeout)

    async def _unheard(self, tenant: str, worker: str, timeout: float) -> bool:
        """One ping: True when NATS says no one subscribes to ``worker``'s ping subject."""
        try:
            await self.bus.nc.request(tool_ping_subject(tenant, worker), b"",
                                      timeout=min(self.probe_timeout, timeout))
        except NoRespondersError:
            return True
        except (TimeoutError, NatsError):  # late or lost: not a sign of death
            pass
        return False

    async def _subscribe(self) -> None:
        if self._subscribed:
            return
        async with self._subscribing:
            if self._subscribed:
                return
            await self.bus.nc.subscribe(f"ratchet.toolreply.*.{self.inbox}", cb=self._on_reply)
            await subscriptions_registered(self.bus.nc)  # before the first request leaves
            self._subscribed = True

    async def _on_reply(self, msg: Msg) -> None:
        """A message on the inbox. Runs in the subscription's task; never raises."""
        assert self._calls is not None
        source = f"{msg.subject} ({len(msg.data)} bytes)"
        try:
            reply = decode_reply(msg.data)
        except InvalidMessage as exc:
            self._calls.settle(None, None, f"{source}: {exc.message}")  # dropped, counted
            return
        self._calls.settle(reply, tool_reply_route(msg.subject), source)
