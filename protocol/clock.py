"""Injected time. Everything that reads the time or waits for it takes a :class:`Clock`,
so that a 24-hour timeout is tested in milliseconds with :class:`FakeClock`."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "FakeClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (recorded in events and rows)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""
        ...

    def due_now(self) -> float:
        """The wall time against which durable deadlines and timers are judged: ``now()``,
        except while a forward step of the wall clock is held (protocol/clock_guard.py)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def due_now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told: :meth:`advance` moves wall and monotonic time
    together and wakes the sleepers it passes; :meth:`step` moves the wall clock alone, as
    an NTP step or an operator's ``date -s`` does (sleeps run on monotonic time)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start  # monotonic time (and the wall time, less the steps)
        self._stepped = 0.0  # what the wall clock was stepped by, in all
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now + self._stepped

    def monotonic(self) -> float:
        return self._now

    def due_now(self) -> float:
        return self.now()

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (either way); monotonic time does not move."""
        self._stepped += seconds

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (tests wait for this before advancing)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> None:
        """Move time (wall and monotonic) forward and wake every sleeper it passes."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
