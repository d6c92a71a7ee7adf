"""The actor core: tell, ask with correlation ids and timeouts, crashes, stops."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from ratchet.actors.core.actor import Actor, ActorSystem
from ratchet.protocol.errors import ActorCrashed, ActorStopped, AskTimeout


class Echo(Actor):
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.stopped = asyncio.Event()
        self.gate = asyncio.Event()

    async def receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom")
        if message == "block":
            await self.gate.wait()
        self.seen.append(message)
        return ("echo", message)

    async def on_stop(self) -> None:
        self.stopped.set()


async def test_tell_delivers_in_order_and_ask_returns_the_answer() -> None:
    system = ActorSystem()
    actor = Echo()
    ref = system.spawn(actor, "echo")
    for i in range(5):
        ref.tell(i)
    assert await ref.ask("last", timeout=1) == ("echo", "last")
    assert actor.seen == [0, 1, 2, 3, 4, "last"]
    await ref.stop_and_wait(1)


async def test_an_unanswered_ask_times_out_with_its_correlation_id() -> None:
    system = ActorSystem()
    ref = system.spawn(Echo(), "slow")
    with pytest.raises(AskTimeout) as info:
        await ref.ask("block", timeout=0.05, correlation_id="cor-42")
    assert info.value.details["correlation_id"] == "cor-42"
    ref.kill()


async def test_a_raising_receive_crashes_the_actor_and_fails_the_ask() -> None:
    system = ActorSystem()
    actor = Echo()
    exits: list[BaseException | None] = []
    ref = system.spawn(actor, "crashy", on_exit=lambda _, reason: exits.append(reason))
    with pytest.raises(ActorCrashed) as info:
        await ref.ask("boom", timeout=1)
    assert isinstance(info.value.__cause__, ValueError)
    await asyncio.wait_for(actor.stopped.wait(), 1)
    assert not ref.is_alive
    assert isinstance(exits[0], ValueError)
    assert system.lookup("crashy") is None


async def test_stop_waits_for_the_current_message_and_refuses_later_mail() -> None:
    system = ActorSystem()
    actor = Echo()
    ref = system.spawn(actor, "busy")
    first = asyncio.ensure_future(ref.ask("block", timeout=1))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(ref.ask("queued", timeout=1))
    await asyncio.sleep(0)
    ref.stop()
    actor.gate.set()
    assert await first == ("echo", "block")
    with pytest.raises(ActorStopped):
        await queued
    with pytest.raises(ActorStopped):
        await ref.ask("late", timeout=1)
    assert actor.seen == ["block"]


async def test_names_are_unique_among_live_actors() -> None:
    system = ActorSystem()
    ref = system.spawn(Echo(), "one")
    with pytest.raises(Exception, match="already running"):
        system.spawn(Echo(), "one")
    await ref.stop_and_wait(1)
    again = system.spawn(Echo(), "one")
    assert system.lookup("one") is again
    await again.stop_and_wait(1)


async def test_a_stopped_actor_is_freed_by_reference_counting_not_left_to_the_collector(
        ) -> None:
    """A stopped actor and its ref pointed at each other: every finished task stayed in
    memory until the cyclic collector's next full pass (docs/operations.md, "Memory")."""
    system = ActorSystem()
    exits: list[BaseException | None] = []
    actor = Echo()
    ref = system.spawn(actor, "done", on_exit=lambda _, reason: exits.append(reason))
    gone = weakref.ref(actor)
    assert await ref.ask("hello", timeout=1) == ("echo", "hello")
    del actor
    gc.disable()
    try:
        await ref.stop_and_wait(1)
        assert gone() is None, "the stopped actor waits for the cyclic collector"
    finally:
        gc.enable()
    assert exits == [None] and not ref.is_alive and ref.interrupt() is False
    assert system.lookup("done") is None
