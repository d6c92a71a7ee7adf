"""Wall-clock steps: detected, and a forward one held, so that a bad NTP step (or an
operator's ``date -s``) does not fire durable timers or pass task deadlines early.

:class:`ClockGuard` wraps a node's :class:`~ratchet.protocol.clock.Clock`. Every reading
compares how far the wall clock moved since the previous reading with how far a steady
clock (one no step moves: ``CLOCK_BOOTTIME`` for a real node, the fake clock's monotonic
time in tests) moved; a difference above ``threshold`` (5 s) is a **step**. Each step is
counted and handed to ``on_step`` (the node logs it and shows it in its heartbeat).

A forward step is **held**: :meth:`due_now` — the time deadlines and timers are judged
against — stays on the time before the step, carried on by the steady clock, while
:meth:`now` (what rows and events record) follows the wall clock. The hold ends when the
wall clock has gone ``hold`` seconds (600 s) without another step (the new time is then
believed: timers really due fire), when a backward step undoes it (the NTP server was
fixed), or when an operator confirms the new time (:meth:`acknowledge`, ``ratchet admin
clock-ack``). A backward step is not held: timers then fire late, never early.

Nothing here is shared between nodes: each node judges its own wall clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratchet.protocol.clock import Clock, SystemClock

__all__ = ["ClockGuard", "ClockStep", "steady_source"]


@dataclass(frozen=True, slots=True)
class ClockStep:
    """One step of the wall clock: by how much (``seconds``; negative: backwards), the wall
    time just after it, and how much forward time is held now (``held``)."""

    seconds: float
    wall: float
    held: float


def steady_source(clock: Clock) -> Callable[[], float]:
    """The steady time to compare a clock's wall time with: for the system clock,
    ``CLOCK_BOOTTIME`` (it goes on during a suspend, as the wall clock does, so a resumed
    laptop is not taken for a step); otherwise the clock's own monotonic time."""
    if isinstance(clock, SystemClock) and hasattr(time, "CLOCK_BOOTTIME"):
        return lambda: time.clock_gettime(time.CLOCK_BOOTTIME)
    return clock.monotonic


class ClockGuard:
    """A :class:`~ratchet.protocol.clock.Clock` that detects wall-clock steps and holds the
    forward ones (see the module's doc). Safe to read from any thread."""

    def __init__(self, inner: Clock, threshold: float = 5.0, hold: float = 600.0,
                 on_step: Callable[[ClockStep], None] | None = None,
                 steady: Callable[[], float] | None = None) -> None:
        if threshold <= 0 or hold < 0:
            raise ValueError("clock step threshold must be > 0 and the hold >= 0")
        self.inner = inner
        self.threshold = threshold
        self.hold = hold
        self.on_step = on_step
        self._steady = steady or steady_source(inner)
        self._lock = threading.Lock()
        self._last = (inner.now(), self._steady())
        #: Forward step time not yet believed: due_now() = now() - held.
        self.held = 0.0
        self._held_since = 0.0  # steady time of the last step while holding
        #: Steps detected (either way) since the node started.
        self.steps = 0
        self.last_step: ClockStep | None = None

    # -- Clock ----------------------------------------------------------------------------

    def now(self) -> float:
        return self._read()[0]

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def due_now(self) -> float:
        wall, held = self._read()
        return wall - held

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)

    # -- the hold -------------------------------------------------------------------------

    def acknowledge(self) -> float:
        """An operator confirms the wall clock: end the hold; returns the seconds released."""
        with self._lock:
            released, self.held = self.held, 0.0
            return released

    def status(self) -> dict[str, Any]:
        """For the node's heartbeat (``ratchet admin nodes``)."""
        self._read()
        with self._lock:
            left = max(0.0, self._held_since + self.hold - self._steady()) if self.held else 0.0
            last = self.last_step
            return {"clock_steps": self.steps, "clock_held_s": round(self.held, 3),
                    "clock_hold_left_s": round(left, 3),
                    "clock_last_step_s": None if last is None else round(last.seconds, 3)}

    def _read(self) -> tuple[float, float]:
        """The wall time now and the held seconds, after checking for a step."""
        step = None
        with self._lock:
            wall, steady = self.inner.now(), self._steady()
            last_wall, last_steady = self._last
            self._last = (wall, steady)
            drift = (wall - last_wall) - (steady - last_steady)
            if abs(drift) > self.threshold:
                self.steps += 1
                if self.hold > 0:  # a hold of 0: steps are reported, never held
                    self.held = max(0.0, self.held + drift)
                self._held_since = steady
                step = self.last_step = ClockStep(drift, wall, self.held)
            elif self.held and steady - self._held_since >= self.hold:
                self.held = 0.0  # consistent for the whole hold: the new time is believed
            held = self.held
        if step is not None and self.on_step is not None:
            self.on_step(step)
        return wall, held
