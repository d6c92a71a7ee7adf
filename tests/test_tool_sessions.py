"""Tool sessions, behind the node's local tool worker: blocking tool code runs on the
session's pykka thread without stalling the event loop, and a restarted session resumes its
state (cursor) from the store."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratchet.actors.core.actor import ActorRef, ActorSystem
from ratchet.actors.effects.local_tools import LocalToolWorker
from ratchet.actors.effects.tool_calls import Invoke, ToolCalls
from ratchet.actors.effects.tool_session import ToolSession
from ratchet.actors.workflow.tools import Tool, ToolContext
from ratchet.persistence import Store
from ratchet.protocol import FakeClock, SystemClock


class PageArgs(BaseModel):
    size: int


class Page(BaseModel):
    items: list[int]
    thread: str


def _read_page(ctx: ToolContext, args: PageArgs) -> Page:
    time.sleep(0.2)  # blocking I/O stand-in
    cursor = int(ctx.session.get("cursor", 0))
    ctx.session["cursor"] = cursor + args.size
    return Page(items=list(range(cursor, cursor + args.size)),
                thread=threading.current_thread().name)


read_page = Tool("read_page", _read_page, "read", PageArgs, Page, timeout=5.0)


def through_the_local_worker(session: ActorRef[Any]) -> Any:
    """``ask(invoke)``: a call of the session's task, as the action runner makes it."""
    clock = SystemClock()
    calls = ToolCalls(clock, local=LocalToolWorker(clock))

    async def session_of(name: str) -> ActorRef[Any]:
        return session

    async def ask(invoke: Invoke) -> tuple[bool, Any]:
        return await calls.ask("t1", "acme", invoke, session_of)

    return ask


async def test_blocking_tool_code_runs_off_the_loop_and_the_cursor_survives_a_restart(
    tmp_path: Path,
) -> None:
    store = await Store.open(tmp_path / "s.db")
    system = ActorSystem()
    try:
        session = system.spawn(ToolSession("t1", "acme", "pages", store, FakeClock(), {}), "s1")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.ensure_future(ticker())
        ok, page = await through_the_local_worker(session)(
            Invoke(read_page, PageArgs(size=3), None, 1, 5.0))
        beat.cancel()
        assert ok and page.items == [0, 1, 2]
        assert page.thread != threading.main_thread().name
        assert ticks >= 10  # the loop kept running during the 0.2 s blocking call

        await session.stop_and_wait(5)  # the session goes away (crash, node restart, ...)
        again = system.spawn(ToolSession("t1", "acme", "pages", store, FakeClock(), {}), "s1")
        ok, page = await through_the_local_worker(again)(
            Invoke(read_page, PageArgs(size=2), None, 1, 5.0))
        assert ok and page.items == [3, 4]
        assert await store.session_state("t1", "pages") == {"cursor": 5}
        await again.stop_and_wait(5)
    finally:
        await store.close()


async def test_a_blocking_call_past_its_timeout_is_an_unknown_outcome(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    system = ActorSystem()
    slow = Tool("slow", lambda ctx, a: (threading.Event().wait(0.5), Page(items=[], thread=""))[1],
                "write", PageArgs, Page, key=lambda a: "k", timeout=0.1)
    try:
        session = system.spawn(ToolSession("t2", "acme", "x", store, FakeClock(), {}), "s2")
        ask = through_the_local_worker(session)
        ok, error = await ask(Invoke(slow, PageArgs(size=1), "k", 1, 0.1))
        assert not ok and type(error).__name__ == "ToolOutcomeUnknown"
        # The thread was replaced: the next call does not queue behind the hung one.
        fast: Tool[Any, Any] = Tool("fast", lambda ctx, a: Page(items=[1], thread=""), "read",
                                    PageArgs, Page, timeout=0.3)
        ok, page = await ask(Invoke(fast, PageArgs(size=1), None, 1, 0.3))
        assert ok and page.items == [1]
        await session.stop_and_wait(5)
    finally:
        await store.close()
