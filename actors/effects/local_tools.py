"""The node's local tool worker: in-process tools served on the same path as remote ones.

A tool whose code the node has (``ratchet.tool``, ``Tool(...)``) is called like a remote
tool (actors/effects/tool_calls.py): a :class:`~protocol.tool_wire.ToolRequest` with a
correlation id, answered by a :class:`~protocol.tool_wire.ToolReply`, no reply in time an
unknown outcome. Only the transport differs. This worker gets its requests through an
in-process loopback instead of JetStream — the precedent is Temporal's local activities —
and runs them with the worker's code (actors/effects/tool_dispatch.py) in the task's tool
session: a supervised :class:`~actors.effects.tool_session.ToolSession` actor, child
``session:<name>`` of the task's supervisor, which holds the session's state (loaded from
the store when it starts, saved after a call that changed it) and runs blocking code on
its pykka thread.

Why a loopback, not the tool's JetStream subject: a NATS hop costs each call a publish, a
stream write and a reply (~1 ms on this machine; docs/operations.md) that buys nothing
when the code is in the node — the ledger's IN_FLIGHT row, not the request's place in a
stream, is what survives a crash, and a node that dies takes its local worker with it. So
nothing is encoded either: the request carries the argument model, the reply the result
model and the exception raised (``RaisedReply``), as objects.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from ratchet.actors.effects.tool_calls import SessionOf, ToolCalls
from ratchet.actors.effects.tool_dispatch import SessionCall, addressed
from ratchet.actors.workflow.tools import Tool
from ratchet.persistence.records import fence_scope
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.errors import ActorStopped, ToolDeadlineExceeded
from ratchet.protocol.tool_wire import ToolReply, ToolRequest

__all__ = ["LocalToolWorker", "no_remote_tools"]


class LocalToolWorker:
    """Serves the node's in-process tools; the loopback transport of :class:`ToolCalls`.

    Args:
        clock: the node's (the same as its ``ToolCalls``': a request's deadline is read
            with the clock that wrote it).
    """

    #: A call may wait in its session behind the session's earlier calls (fan-out branches
    #: share their task's sessions); its own timeout starts when its session runs it,
    #: which answers ``OUTCOME_UNKNOWN`` at it. The caller waits that much longer at most.
    #: Nothing else holds a request: a node that stops stops its tasks' sessions, whose
    #: queued calls raise ``ActorStopped``.
    grace = 30.0
    #: The session actors keep their state in the node's store themselves.
    carries_state = False
    wire = False  # requests and replies are handed over as objects

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._calls: ToolCalls | None = None
        #: Figures: requests answered.
        self.served = 0

    def attach(self, calls: ToolCalls) -> None:
        self._calls = calls

    def reply_to(self, tenant: str) -> str:
        return "loopback"

    async def send(self, request: ToolRequest, tool: Tool[Any, Any], worker: str | None,
                   session_of: SessionOf, timeout: float) -> Exception | None:
        """Queue ``request`` in the task's session actor (its mailbox is this worker's
        queue); the reply is delivered when the session answers."""
        budget = timeout  # the request was made just now, with this much time left
        if budget <= 0:
            return ToolDeadlineExceeded(f"{tool.name}: past its deadline; not run",
                                        tool=tool.name)
        # A session that cannot be had (no live task supervisor, a store read failing as
        # it starts) raises here, as a crash of the task's own machinery, not a tool
        # outcome: the step fails, the task actor is restarted by its supervisor, and the
        # step run again settles the IN_FLIGHT row (docs/architecture.md).
        session = await session_of(tool.session)
        answer = session.ask_nowait(SessionCall(request, tool, budget, partial(
            self._reply, request), fence_scope.get()), request.correlation_id)
        answer.add_done_callback(partial(self._unanswered, request))
        return None

    def _reply(self, request: ToolRequest, reply: ToolReply) -> None:
        """The session's reply, to its caller at once (from the session's task)."""
        self.served += 1
        if reply.correlation_id != request.correlation_id:  # not made by run_tool
            reply = addressed(reply, request)
        assert self._calls is not None
        self._calls.settle(reply, request.tenant, "loopback")

    def _unanswered(self, request: ToolRequest, answer: asyncio.Future[ToolReply]) -> None:
        """A session that crashed or stopped before it replied (say its store write
        failed): the call raises that, as an ask of the session did before the local
        worker (see ``send``). Runs as a callback of the ask's future; never raises."""
        assert self._calls is not None
        if answer.cancelled():
            self._calls.fail(request.correlation_id, ActorStopped(
                "tool session went away", correlation_id=request.correlation_id))
        elif (exc := answer.exception()) is not None:
            self._calls.fail(request.correlation_id, exc)


#: The tool calls of a runner without a node (a unit test's): in-process tools through a
#: local worker of their own, remote ones refused (nothing is sent). Named before
#: in-process tools took this path; branch code imports it by that name.
_clock = SystemClock()
no_remote_tools = ToolCalls(_clock, local=LocalToolWorker(_clock))
