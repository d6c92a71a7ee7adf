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
model and the exception raised (``ToolReply._raised``), as objects.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from ratchet.actors.core.actor import ActorRef
from ratchet.actors.effects.tool_calls import Deliver, SessionOf, ToolCalls
from ratchet.actors.effects.tool_dispatch import SessionCall, addressed, failure
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.errors import ActorCrashed, ActorStopped, AskTimeout, ToolTransient
from ratchet.protocol.tool_wire import ToolReply, ToolRequest

__all__ = ["LocalToolWorker", "no_remote_tools"]

log = structlog.get_logger("ratchet.local_tools")


class LocalToolWorker:
    """Serves the node's in-process tools; the loopback transport of :class:`ToolCalls`.

    Args:
        clock: the node's (the same as its ``ToolCalls``': a request's deadline is read
            with the clock that wrote it).
    """

    #: A call may wait in its session behind the session's earlier calls (fan-out branches
    #: share their task's sessions); its own timeout starts when its session runs it,
    #: which answers ``OUTCOME_UNKNOWN`` at it. The caller waits that much longer at most.
    grace = 30.0
    #: The session actors keep their state in the node's store themselves.
    carries_state = False

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._deliver: Deliver | None = None
        self._running: set[asyncio.Task[None]] = set()
        #: Figures: requests answered.
        self.served = 0

    def attach(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def reply_to(self, tenant: str) -> str:
        return "loopback"

    async def send(self, request: ToolRequest, tool: Tool[Any, Any], worker: str | None,
                   session_of: SessionOf, timeout: float) -> Exception | None:
        try:
            session = await session_of(tool.session)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no live task supervisor (a node stopping): nothing ran
            return ToolTransient(f"{tool.name}: no tool session to run it in: {exc}",
                                 tool=tool.name)
        task = asyncio.create_task(self._serve(session, request, tool))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return None

    async def _serve(self, session: ActorRef[Any], request: ToolRequest,
                     tool: Tool[Any, Any]) -> None:
        """One request, in its own task (the caller waits on its reply, bounded)."""
        budget = request.deadline - self.clock.now()
        reply: ToolReply
        if budget <= 0:
            reply = failure("DEADLINE_EXCEEDED", f"{tool.name}: past its deadline; not run")
        else:
            try:
                reply = await session.ask(SessionCall(request, tool, budget),
                                          budget + self.grace)
            except (ActorCrashed, ActorStopped, AskTimeout) as exc:
                # Its supervisor starts the session again from its stored state.
                reply = failure("OUTCOME_UNKNOWN", f"session {tool.session} failed: {exc}")
        self.served += 1
        assert self._deliver is not None
        self._deliver(addressed(reply, request), request.tenant, "loopback")

    async def stop(self, timeout: float = 10.0) -> None:
        """Let the requests in progress answer (at most ``timeout`` s), then cancel the
        rest. Safe to call twice."""
        running = set(self._running)
        if running:
            await asyncio.wait(running, timeout=timeout)
        for task in running:
            task.cancel()


#: The tool calls of a runner without a node (a unit test's): in-process tools through a
#: local worker of their own, remote ones refused (nothing is sent). Named before
#: in-process tools took this path; branch code imports it by that name.
_clock = SystemClock()
no_remote_tools = ToolCalls(_clock, local=LocalToolWorker(_clock))
