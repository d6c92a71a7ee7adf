"""Tool sessions: one supervised actor per (task, session), behind the node's local worker.

The node's local tool worker (actors/effects/local_tools.py) runs each request of an
in-process tool in the task's session: it asks this actor with a
:class:`~actors.effects.tool_dispatch.SessionCall`, and the actor runs it with the code every
tool worker runs requests with (``run_tool``), so its calls are serialized by its mailbox.
A session holds its state (tokens, cursors) in the store, reloaded on start, so a restarted
session resumes its cursor; written under its version (actors/effects/session_state.py),
since a task's fan-out branches placed on other nodes call the session there too. Async tool code runs on the loop; blocking tool code runs on a
pykka ``ThreadingActor`` the session owns (actors/effects/blocking_runner.py, imported at
the first blocking call). The bridge never awaits a pykka future (that would block the
loop): the session ``tell``s the thread ``(call, loop, asyncio_future)`` and the thread
settles the future with ``loop.call_soon_threadsafe``.

A call that outlives its timeout cannot be interrupted on its thread: its outcome is
unknown, and the session replaces the thread so the next call is not queued behind it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from ratchet.actors.core.actor import Actor
from ratchet.actors.effects.session_state import save_change
from ratchet.actors.effects.tool_dispatch import SessionCall, run_tool
from ratchet.persistence.ports import TaskStore
from ratchet.persistence.records import fence_scope
from ratchet.protocol.clock import Clock

if TYPE_CHECKING:
    import pykka

    from ratchet.actors.effects.blocking_runner import BlockingRunner

__all__ = ["ToolSession"]

log = structlog.get_logger("ratchet.session")


class ToolSession(Actor):
    """Answers :class:`SessionCall` with a :class:`~protocol.tool_wire.ToolReply`: a
    tool's failure is an answer, not a crash of the session."""

    def __init__(self, task_id: str, tenant: str, name: str, store: TaskStore, clock: Clock,
                 resources: Mapping[str, Any],
                 shared: Callable[[], bool] = lambda: False) -> None:
        """``shared``: asked before each call, whether to read the state first (other
        nodes may have changed it: the task's fan-out branches run there,
        actors/task/branch_sessions.py), so that the call sees their changes."""
        self.task_id = task_id
        self.tenant = tenant
        self.name = name
        self.store = store
        self.clock = clock
        self.resources = resources
        self.shared = shared
        self.state: dict[str, Any] = {}
        self.version = 0  # of the state as read or last written (migration 25)
        self._runner: pykka.ActorRef[BlockingRunner] | None = None

    async def on_start(self) -> None:
        self.state, self.version = await self.store.session_state_at(self.task_id, self.name)

    async def on_stop(self) -> None:
        self._drop_runner()

    def _drop_runner(self) -> None:
        if self._runner is not None:
            # Not stop(block=True): that would wait for a hung call on the loop thread.
            self._runner.stop(block=False)
            self._runner = None

    async def receive(self, message: Any) -> Any:
        if not isinstance(message, SessionCall):
            return await super().receive(message)
        if self.shared():
            self.state, self.version = await self.store.session_state_at(self.task_id,
                                                                         self.name)
        before = copy.deepcopy(self.state)
        reply = await run_tool(message.request, message.tool, message.budget, self.state, {},
                               self.resources, self._blocking)
        if self.state != before:
            # Fenced by the lease of the partition the call was made on behalf of (a
            # branch's own, when a branch made it), not by the session's task's.
            scope = fence_scope.set(message.fence) if message.fence else None
            try:
                self.state, self.version = await save_change(
                    self.store, self.task_id, self.name, before, self.state, self.version,
                    self.clock.now())
            finally:
                if scope is not None:
                    fence_scope.reset(scope)
        if message.on_reply is not None:
            message.on_reply(reply)
        return reply

    async def _blocking(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the session's thread. Cut off by its deadline (a cancel), the
        thread may be stuck in it: it is replaced, so later calls do not queue behind."""
        if self._runner is None:
            from ratchet.actors.effects.blocking_runner import BlockingRunner  # pykka: lazily

            self._runner = BlockingRunner.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._runner.tell((call, loop, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # cut off, not answered: the thread is still in the call
                log.warning("blocking tool call cut off; replacing its thread",
                            task_id=self.task_id, session=self.name)
                self._drop_runner()
            raise
