"""A node's tool calls: one request, one reply, whoever serves the tool.

The action runner (actors/effects/actions.py) makes every call of a tool — in-process or
remote, call or ``query`` — through :meth:`ToolCalls.ask`, after the ledger's IN_FLIGHT
commit. ``ask`` builds a :class:`~protocol.tool_wire.ToolRequest` with a fresh
correlation id, hands it to a transport, and waits for the one
:class:`~protocol.tool_wire.ToolReply` whose correlation id, idempotency key and tenant all
match it; no reply in time is ``ToolOutcomeUnknown`` (a write's UNKNOWN, reconciled by the
runner with a ``query``, itself a request). Nothing is retried here: the runner's policy
decides.

Two transports (docs/architecture.md, "Tool calls: one path"):

- a tool declared with ``remote_tool`` goes over JetStream to a tool worker in another
  process (:class:`~actors.effects.remote_tool.JetStreamTools`); its session's state
  travels with the request, and the session is pinned to the worker that took it;
- any other tool goes to the node's own worker through an in-process loopback
  (:class:`~actors.effects.local_tools.LocalToolWorker`), Temporal's local activities'
  choice: no NATS hop for code the node has. Its sessions are actors under the task's
  supervisor, holding their state as they always did.

Answers are ``(True, result | Accepted | None)`` or ``(False, exception)``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from ratchet.actors.core.actor import ActorRef
from ratchet.actors.effects.session_state import save_change
from ratchet.actors.effects.tool_dispatch import RaisedReply
from ratchet.actors.workflow.tools import Accepted, Tool
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import ToolOutcomeUnknown, ToolTransient, ToolWorkerGone
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import is_worker_id
from ratchet.protocol.tool_wire import ToolReply, ToolRequest, exception_of_error

__all__ = ["Invoke", "RemoteAsk", "SessionOf", "ToolCalls", "ToolTransport",
           "answer"]

log = structlog.get_logger("ratchet.tool_calls")

#: The task's tool session ``name`` (started if need be): where the local worker runs it.
SessionOf = Callable[[str], Awaitable[ActorRef[Any]]]


@dataclass(frozen=True, slots=True)
class Invoke:
    """Run ``tool``'s code (``op="call"``) or its ``query`` (``op="query"``) once."""

    tool: Tool[Any, Any]
    args: Any
    key: str | None
    attempt: int
    timeout: float
    op: str = "call"


#: How the runner asks: ``(task_id, tenant, invoke, session_of) -> answer``. (The name is
#: from when only remote tools went this way; branch code still imports it by it.)
RemoteAsk = Callable[[str, str, Invoke, SessionOf], Coroutine[Any, Any, tuple[bool, Any]]]


class ToolTransport(Protocol):
    """How requests reach a worker and its replies come back."""

    #: Seconds past a call's timeout its reply is still awaited: 0 for a worker elsewhere;
    #: the local worker times its code out itself (and a call may queue in its session).
    grace: float
    #: The session's state travels with each request (the worker is elsewhere), and the
    #: worker that answered holds the session (pinned).
    carries_state: bool
    #: Replies come as bytes anyone allowed on the subject could send (so correlation ids
    #: must be unguessable), not as objects handed over in process.
    wire: bool

    def attach(self, calls: ToolCalls) -> None:
        """Whose calls this transport's replies settle (once, before any send):
        ``calls.settle`` a reply, ``calls.fail`` a call that cannot have one."""

    def reply_to(self, tenant: str) -> str:
        """The ``reply_to`` of a request of ``tenant``."""

    async def send(self, request: ToolRequest, tool: Tool[Any, Any], worker: str | None,
                   session_of: SessionOf, timeout: float) -> Exception | None:
        """Hand ``request`` over (to ``worker``, pinned, if given); None once it left,
        else the call's failure: ``ToolTransient`` if nothing was sent."""


@dataclass(slots=True)
class _Waiting:
    key: str | None
    tenant: str
    future: asyncio.Future[ToolReply]


class ToolCalls:
    """Asks tools through ``local`` (in-process tools) or ``remote`` (``remote_tool``);
    settles each call with the one reply that matches it.

    Args:
        clock: the deadline written in each request is ``clock.now() + timeout``.
        store: where remote tools' sessions' state is kept.
        remote, local: the transports; a tool with none is refused (``ToolTransient``).
    """

    def __init__(self, clock: Clock, store: TaskStore | None = None, *,
                 remote: ToolTransport | None = None,
                 local: ToolTransport | None = None) -> None:
        self.clock, self.store, self.remote, self.local = clock, store, remote, local
        for transport in (remote, local):
            if transport is not None:
                transport.attach(self)
        #: (task id, session) -> the worker holding it; bounded (oldest dropped): a session
        #: forgotten here is taken again by any worker, from its stored state.
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._waiting: dict[str, _Waiting] = {}
        #: Replies dropped: malformed, matching no waiting call (late, repeated, forged), or
        #: matching a call's correlation id but not its key or tenant.
        self.dropped = 0

    async def __call__(self, task_id: str, tenant: str, invoke: Invoke,
                       session_of: SessionOf) -> tuple[bool, Any]:
        return await self.ask(task_id, tenant, invoke, session_of)

    async def ask(self, task_id: str, tenant: str, invoke: Invoke,
                  session_of: SessionOf) -> tuple[bool, Any]:
        """One call or query of ``invoke.tool``; its answer."""
        tool = invoke.tool
        transport = self.remote if tool.remote else self.local
        if transport is None:
            return (False, ToolTransient(f"{tool.name}: no tool transport here (no node)",
                                         tool=tool.name))
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Unguessable over a wire (the ULID's random bits come from a seeded PRNG): a reply
        # must prove it read the request. A loopback's cannot be forged (a urandom call
        # costs ~10 µs here).
        cid = new_id("tcl") + (secrets.token_hex(10) if transport.wire else "")
        # An in-process tool always has its session; a remote one only when it says so.
        session = tool.session if not tool.remote or tool.session != "default" else None
        kept = session is not None and transport.carries_state
        state, version = await self._session_state(task_id, tool.session) if kept \
            else (None, 0)
        worker = self._pins.get((task_id, tool.session)) if kept else None
        request = ToolRequest.model_construct(
            _FIELDS, schema_version=1, correlation_id=cid, task_id=task_id, tenant=tenant, tool=tool.name,
            op="query" if invoke.op == "query" else "call", args=invoke.args,
            idempotency_key=invoke.key, attempt=invoke.attempt,
            deadline=self.clock.now() + invoke.timeout, reply_to=transport.reply_to(tenant),
            session_id=f"{task_id}:{session}" if session is not None else None,
            session_state=state)
        waiting = _Waiting(invoke.key, tenant, loop.create_future())
        self._waiting[cid] = waiting  # before the send: a fast worker answers before it ends
        try:
            refused = await transport.send(request, tool, worker, session_of, invoke.timeout)
            if refused is not None:
                if isinstance(refused, ToolWorkerGone):  # the next call: to any worker
                    self._pins.pop((task_id, tool.session), None)
                return (False, refused)
            # The future itself with a timer, not wait_for's wrapper nor a timeout scope: a
            # loop turn and a few objects less, on every tool call's path.
            timer = loop.call_at(started + invoke.timeout + transport.grace, _expire,
                                 waiting.future)
            try:
                reply = await waiting.future
            except TimeoutError:
                # The worker holding the session may be gone: the next call goes to any
                # worker, which takes the session from its stored state.
                self._pins.pop((task_id, tool.session), None)
                return (False, ToolOutcomeUnknown(
                    f"{tool.name}: no reply from a tool worker within {invoke.timeout:g}s",
                    tool=tool.name, correlation_id=cid))
            finally:
                timer.cancel()
        finally:
            del self._waiting[cid]
        if kept:
            await self._session_after(task_id, tool.session, state, version, reply)
        return answer(tool.name, reply)

    def settle(self, reply: ToolReply | None, tenant: str | None, source: str) -> None:
        """A reply from a transport (None: bytes that were no reply), with the tenant of
        the route it came on: it settles the call it matches, else it is dropped. Never
        raises."""
        if reply is None:
            self.drop("malformed tool reply", source)
            return
        waiting = self._waiting.get(reply.correlation_id)
        if waiting is None:
            self.drop("tool reply for no waiting call (late, repeated or forged)", source,
                      correlation_id=reply.correlation_id)
        elif waiting.key != reply.idempotency_key or waiting.tenant != tenant:
            self.drop("tool reply does not match its call's key or tenant", source,
                      correlation_id=reply.correlation_id)
        elif not waiting.future.done():
            waiting.future.set_result(reply)

    def fail(self, correlation_id: str, exc: BaseException) -> None:
        """The call ``correlation_id`` raises ``exc`` instead of getting a reply: the
        worker is in this process and failed, which is the node's own failure, not the
        tool's answer (the local worker: its session crashed or stopped)."""
        waiting = self._waiting.get(correlation_id)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(exc)

    def drop(self, why: str, source: str, **details: Any) -> None:
        self.dropped += 1
        log.warning(why, source=source[:200], **details)

    async def _session_state(self, task_id: str, session: str) -> tuple[dict[str, Any], int]:
        if self.store is None:
            return {}, 0
        return await self.store.session_state_at(task_id, session)

    async def _session_after(self, task_id: str, session: str, before: dict[str, Any] | None,
                             version: int, reply: ToolReply) -> None:
        """Store the session's state the reply carries (if it changed) and pin the session
        to the worker that answered."""
        if reply.worker is not None and is_worker_id(reply.worker):
            self._pins[(task_id, session)] = reply.worker
            self._pins.move_to_end((task_id, session))
            while len(self._pins) > 10_000:
                self._pins.popitem(last=False)
        if reply.session_state is not None and reply.session_state != before and self.store:
            # Under its version: branches on other nodes may call the session too.
            await save_change(self.store, task_id, session, before or {},
                              reply.session_state, version, self.clock.now())


#: Every field of a request is given (no default to look up: every call's path).
_FIELDS = set(ToolRequest.model_fields)


def _expire(future: asyncio.Future[ToolReply]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def answer(tool: str, reply: ToolReply) -> tuple[bool, Any]:
    """What the runner gets for ``reply``: a failure's exception (the one raised, when the
    reply was handed over in process), an ``Accepted``, or the result."""
    if not reply.ok:
        if isinstance(reply, RaisedReply):
            return (False, reply._raised)
        return (False, exception_of_error(reply.error, tool))
    if reply.accepted is not None:
        a = reply.accepted
        return (True, Accepted(a.provider_id, a.correlation_id, a.timeout))
    return (True, reply.result)

