"""Supervision: restart policy tables, intensity, backoff on the injected clock."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.actors.core.actor import Actor, ActorSystem
from ratchet.protocol import FakeClock
from ratchet.supervisors import ChildSpec, Restart, Supervisor, backoff_delay, intensity_exceeded
from ratchet.supervisors.supervision.restart_policy import should_restart
from ratchet.supervisors.supervision.supervisor import WhichChildren


def test_restart_types_follow_otp() -> None:
    assert should_restart(Restart.PERMANENT, abnormal=False)
    assert should_restart(Restart.TRANSIENT, abnormal=True)
    assert not should_restart(Restart.TRANSIENT, abnormal=False)
    assert not should_restart(Restart.TEMPORARY, abnormal=True)


def test_intensity_counts_only_restarts_inside_the_period() -> None:
    assert not intensity_exceeded([0.0, 1.0, 2.0], now=2.0, max_restarts=3, period=10)
    assert intensity_exceeded([0.0, 1.0, 2.0, 3.0], now=3.0, max_restarts=3, period=10)
    assert not intensity_exceeded([0.0, 1.0, 2.0, 30.0], now=30.0, max_restarts=3, period=10)


@given(st.integers(0, 30), st.floats(0.001, 1.0), st.floats(1.0, 60.0), st.integers(0, 2**32))
def test_backoff_has_full_jitter_under_an_exponential_cap(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    delay = backoff_delay(attempt, base, cap, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2**attempt)


class Worker(Actor):
    starts: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name

    async def on_start(self) -> None:
        Worker.starts.append(self.name)

    async def receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError(f"{self.name} crashed")
        return self.name


async def _until(predicate: Any, timeout: float = 2.0) -> None:
    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - yields to the loop only; bounded below
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), timeout)


async def test_one_for_one_restarts_only_the_crashed_child_after_its_backoff() -> None:
    clock = FakeClock()
    system = ActorSystem(clock)
    Worker.starts = []
    sup = Supervisor(system, "sup", [ChildSpec("a", lambda n: Worker("a")),
                                     ChildSpec("b", lambda n: Worker("b"))],
                     backoff_base=10.0, backoff_cap=10.0, rng=random.Random(1))
    ref = system.spawn(sup, "sup")
    await _until(lambda: Worker.starts == ["a", "b"])
    b_before = system.lookup("sup/b")
    system.lookup("sup/a").tell("crash")  # type: ignore[union-attr]
    await _until(lambda: clock.sleepers == 1)
    assert system.lookup("sup/a") is None  # still backing off: fake time has not moved
    clock.advance(10.0)
    await _until(lambda: system.lookup("sup/a") is not None)
    assert Worker.starts == ["a", "b", "a"]
    assert system.lookup("sup/b") is b_before
    children = await ref.ask(WhichChildren(), timeout=1)
    assert {c["id"]: c["restarts"] for c in children} == {"a": 1, "b": 0}
    await ref.stop_and_wait(1)
    assert system.live() == []


async def test_exceeding_the_intensity_escalates_after_on_escalate() -> None:
    clock = FakeClock()
    system = ActorSystem(clock)
    escalated: list[BaseException | None] = []
    exits: list[BaseException | None] = []

    async def on_escalate(cause: BaseException | None) -> None:
        escalated.append(cause)

    sup = Supervisor(system, "sup", [ChildSpec("a", lambda n: Worker("a"))], max_restarts=2,
                     period=60, backoff_base=0.0, backoff_cap=0.0, on_escalate=on_escalate)
    ref = system.spawn(sup, "sup", on_exit=lambda _, reason: exits.append(reason))
    for _ in range(3):
        await _until(lambda: system.lookup("sup/a") is not None)
        system.lookup("sup/a").tell("crash")  # type: ignore[union-attr]
        await _until(lambda: system.lookup("sup/a") is None or not ref.is_alive)
    await _until(lambda: not ref.is_alive)
    assert isinstance(escalated[0], RuntimeError)
    assert type(exits[0]).__name__ == "Escalation"
    assert system.live() == []


def test_child_specs_are_validated_up_front() -> None:
    with pytest.raises(ValueError, match="shutdown_timeout"):
        ChildSpec("x", lambda n: Worker("x"), shutdown_timeout=0)
    with pytest.raises(ValueError, match="duplicate child ids"):
        Supervisor(ActorSystem(), "s", [ChildSpec("x", lambda n: Worker("x"))] * 2)
