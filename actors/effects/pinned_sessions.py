"""Tool sessions pinned to a tool worker (the code that runs a request: tool_dispatch.py).

A remote tool declared with a session (``remote_tool(..., session="browser")``) keeps a
session per (task, session name): the calls of one task share it, one at a time. The
session has two halves (docs/protocol.md, "Sessions pinned to a worker"):

- its **state** (``ctx.session``: a URL, cookies, a cursor's position), a msgpack map the
  node stores after every call that changed it (the store's ``tool_sessions`` row, as for
  an in-process session) and sends with every request. It is the truth.
- its **live resources** (``ctx.live``: the browser, the database connection), which only
  the worker holding the session has. They are a cache of the state: tool code that finds
  ``ctx.live`` empty (a worker that just took the session: a restart, a move) builds them
  again from ``ctx.session``.

On the worker each session is an actor (:class:`PinnedSession`): its mailbox serializes the
session's calls. :class:`PinnedSessions` supervises them, one for one: an actor that
crashed (not tool code raising, which is an answer; the session code itself failing) is
replaced at the session's next call by a new one built from the state that call carries,
and the call it crashed on is answered ``OUTCOME_UNKNOWN``. A session unused for
``idle`` seconds is stopped, its live resources closed (each value of ``ctx.live`` with a
``close()`` or ``aclose()``); its state is still the node's.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from typing import Any

import structlog

from ratchet.actors.core.actor import Actor, ActorRef, ActorSystem
from ratchet.actors.effects.tool_dispatch import SessionCall, failure, run_tool
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import ActorCrashed, ActorStopped, AskTimeout
from ratchet.protocol.tool_wire import ToolReply, ToolRequest

__all__ = ["PinnedSession", "PinnedSessions"]

log = structlog.get_logger("ratchet.pinned_sessions")


class PinnedSession(Actor):
    """One session this worker holds. Answers :class:`SessionCall` with a reply carrying
    the session's state after the call."""

    def __init__(self, resources: dict[str, Any], clock: Clock) -> None:
        self.resources = resources
        self.clock = clock
        self.live: dict[str, Any] = {}

    async def receive(self, message: Any) -> Any:
        if not isinstance(message, SessionCall):
            return await super().receive(message)
        # The node's state, not this actor's memory of it: the node stored what the last
        # answered call left, and a reply it never got changed nothing there.
        state = copy.deepcopy(message.request.session_state or {})
        reply = await run_tool(message.request, message.tool, message.budget, state,
                               self.live, self.resources)
        return reply.model_copy(update={"session_state": state})

    async def on_stop(self) -> None:
        """Runs in the actor's task as it stops (idle, the worker stopping, a crash):
        closes the live resources; a close that raises is logged."""
        for name, value in list(self.live.items()):
            closer = getattr(value, "aclose", None) or getattr(value, "close", None)
            if closer is None:
                continue
            try:
                done = closer()
                if inspect.isawaitable(done):
                    await done
            except Exception:  # one resource's close must not keep the others open
                log.warning("closing a session's live resource failed", resource=name,
                            exc_info=True)
        self.live.clear()


class PinnedSessions:
    """The sessions a worker holds, by session id, each a supervised :class:`PinnedSession`.

    Args:
        resources: the worker's, shared by every session's tool code.
        idle: seconds after which an unused session is stopped.
    """

    def __init__(self, resources: dict[str, Any], clock: Clock, idle: float = 600.0) -> None:
        self.system = ActorSystem(clock)
        self.resources, self.clock, self.idle = resources, clock, idle
        self._refs: dict[str, ActorRef[PinnedSession]] = {}
        self._used: dict[str, float] = {}  # session id -> when its last call ended
        #: Figures: sessions started (taken, or built again after a restart or a crash),
        #: crashed, and stopped as idle.
        self.started = self.crashed = self.expired = 0

    def __contains__(self, session_id: str) -> bool:
        ref = self._refs.get(session_id)
        return ref is not None and ref.is_alive

    async def call(self, request: ToolRequest, tool: Tool[Any, Any], budget: float) -> ToolReply:
        """Run ``request`` in its session (started here if this worker does not hold it)."""
        sid = request.session_id
        assert sid is not None
        try:
            for _ in range(2):
                try:
                    reply: ToolReply = await self._ref(sid).ask(
                        SessionCall(request, tool, budget), budget + 5.0)
                    return reply
                except ActorStopped:  # stopped (idle) before it took the call: a new one
                    self._refs.pop(sid, None)
            raise ActorStopped("session stopped twice before answering", actor=sid)
        except (ActorCrashed, ActorStopped, AskTimeout) as exc:
            # One for one: the next call builds it again from the state it carries.
            self.crashed += 1
            ref = self._refs.pop(sid, None)
            if ref is not None:
                ref.kill()
            log.warning("a pinned session failed; it is started again at its next call",
                        session=sid, error=repr(exc))
            return failure("OUTCOME_UNKNOWN", f"session {sid} failed: {exc}")
        finally:
            if sid in self._refs:
                self._used[sid] = self.clock.monotonic()
            else:
                self._used.pop(sid, None)

    def _ref(self, sid: str) -> ActorRef[PinnedSession]:
        ref = self._refs.get(sid)
        if ref is None or not ref.is_alive:
            self.started += 1  # in the name: the one it replaces may not have stopped yet
            ref = self.system.spawn(PinnedSession(self.resources, self.clock),
                                    f"session:{sid}:{self.started}")
            self._refs[sid] = ref
        return ref

    async def sweep(self) -> int:
        """Stop the sessions unused for ``idle`` seconds; how many."""
        now, stopped = self.clock.monotonic(), []
        for sid, ref in list(self._refs.items()):
            if now - self._used.get(sid, now) >= self.idle:
                stopped.append(ref)
                del self._refs[sid]
                self._used.pop(sid, None)
        for ref in stopped:
            with contextlib.suppress(Exception):
                await ref.stop_and_wait(10.0)
        self.expired += len(stopped)
        return len(stopped)

    async def stop(self) -> None:
        """Stop every session (the worker stops). Safe to call twice."""
        refs, self._refs, self._used = list(self._refs.values()), {}, {}
        for ref in refs:
            with contextlib.suppress(Exception):
                await ref.stop_and_wait(10.0)
