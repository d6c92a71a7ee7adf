"""Tool sessions: one supervised actor per (task, session).

A session holds its state (tokens, cursors) in the store, reloaded on start, so a restarted
session resumes its cursor. Async tool code runs on the loop; blocking tool code runs on a
pykka ``ThreadingActor`` the session owns (actors/effects/blocking_runner.py, imported at
the first blocking call). The bridge never awaits a pykka future (that
would block the loop): the session ``tell``s the thread ``(call, loop, asyncio_future)``
and the thread settles the future with ``loop.call_soon_threadsafe``.

A call that outlives its timeout cannot be interrupted on its thread: its outcome is
unknown, and the session replaces the thread so the next call is not queued behind it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from ratchet.actors.core.actor import Actor
from ratchet.actors.workflow.tools import Tool, ToolContext
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import ToolOutcomeUnknown

if TYPE_CHECKING:
    import pykka

    from ratchet.actors.effects.blocking_runner import BlockingRunner

__all__ = ["ToolSession", "Invoke"]

log = structlog.get_logger("ratchet.session")


@dataclass(frozen=True, slots=True)
class Invoke:
    """Run ``tool``'s code (``op="call"``) or its ``query`` (``op="query"``) once."""

    tool: Tool[Any, Any]
    args: Any
    key: str | None
    attempt: int
    timeout: float
    op: str = "call"


class ToolSession(Actor):
    """Answers :class:`Invoke` with ``(True, result)`` or ``(False, exception)``: a tool's
    failure is an answer, not a crash of the session."""

    def __init__(self, task_id: str, tenant: str, name: str, store: TaskStore, clock: Clock,
                 resources: Mapping[str, Any]) -> None:
        self.task_id = task_id
        self.tenant = tenant
        self.name = name
        self.store = store
        self.clock = clock
        self.resources = resources
        self.state: dict[str, Any] = {}
        self._runner: pykka.ActorRef[BlockingRunner] | None = None

    async def on_start(self) -> None:
        self.state = await self.store.session_state(self.task_id, self.name)

    async def on_stop(self) -> None:
        self._drop_runner()

    def _drop_runner(self) -> None:
        if self._runner is not None:
            # Not stop(block=True): that would wait for a hung call on the loop thread.
            self._runner.stop(block=False)
            self._runner = None

    async def receive(self, message: Any) -> Any:
        if not isinstance(message, Invoke):
            return await super().receive(message)
        before = copy.deepcopy(self.state)
        ctx = ToolContext(self.task_id, self.tenant, message.tool.name, message.key,
                          message.attempt, self.state, self.resources)
        fn: Callable[..., Any] | None = (message.tool.fn if message.op == "call"
                                         else message.tool.query)
        assert fn is not None, "query invoked on a tool without one"
        try:
            result = await self._run(fn, ctx, message.args, message.timeout)
            outcome: tuple[bool, Any] = (True, result)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            outcome = (False, exc)
        if self.state != before:
            await self.store.save_session_state(self.task_id, self.name, self.state,
                                                self.clock.now())
        return outcome

    async def _run(self, fn: Callable[..., Any], ctx: ToolContext, args: Any,
                   timeout: float) -> Any:
        if asyncio.iscoroutinefunction(fn):
            try:
                return await asyncio.wait_for(fn(ctx, args), timeout)
            except TimeoutError:
                raise ToolOutcomeUnknown(f"{ctx.tool} timed out after {timeout}s",
                                         tool=ctx.tool) from None
        if self._runner is None:
            from ratchet.actors.effects.blocking_runner import BlockingRunner  # pykka: lazily

            self._runner = BlockingRunner.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._runner.tell((lambda: fn(ctx, args), loop, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            log.warning("blocking tool call timed out; replacing its thread",
                        task_id=self.task_id, tool=ctx.tool, timeout=timeout)
            self._drop_runner()
            raise ToolOutcomeUnknown(f"{ctx.tool} timed out after {timeout}s",
                                     tool=ctx.tool) from None
