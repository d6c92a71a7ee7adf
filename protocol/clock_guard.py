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

A node that **starts** with a wrong clock has no earlier reading of its own to compare
with, so :meth:`ClockGuard.judge_start` compares it with what the store last recorded:
each node's heartbeat carries a reading of its guard (:meth:`ClockGuard.status`: the wall
time it believed — the wall clock less what it held — and its steady time then, with the
steady clock's ``domain``, the boot for ``CLOCK_BOOTTIME``). From the freshest reading of
the same domain (any node of this host, this boot), the wall time now should be its wall
plus the steady time since; a difference past ``threshold`` (plus what NTP's slewing, at
most 500 ppm, could have moved it since) is a step, held if forward, as a live one. With
no reading of this domain (another boot or host, a fresh store), only a clock **behind**
is visible: one earlier than the newest wall time any node recorded, by more than
``threshold``, has stepped back by at least that. A clock ahead after a reboot cannot be
told from downtime by the store alone.

Nothing here is shared between nodes: each node judges its own wall clock (at start,
against readings of its own steady clock that the store kept).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet.protocol.clock import Clock, SystemClock

__all__ = ["ClockGuard", "ClockStep", "steady_source", "steady_domain", "MAX_SLEW"]

#: How fast NTP may slew a clock (500 ppm): a wall/steady difference that grew faster than
#: this since a reading was a step, not slewing.
MAX_SLEW = 0.0005


@dataclass(frozen=True, slots=True)
class ClockStep:
    """One step of the wall clock: by how much (``seconds``; negative: backwards), the wall
    time just after it, how much forward time is held now (``held``), and what it was
    judged against: ``steady`` (the node's steady clock, while it runs) or ``store`` (the
    readings nodes left in the store, when it starts)."""

    seconds: float
    wall: float
    held: float
    reference: str = "steady"


def steady_source(clock: Clock) -> Callable[[], float]:
    """The steady time to compare a clock's wall time with: for the system clock,
    ``CLOCK_BOOTTIME`` (it goes on during a suspend, as the wall clock does, so a resumed
    laptop is not taken for a step); otherwise the clock's own monotonic time."""
    if isinstance(clock, SystemClock) and hasattr(time, "CLOCK_BOOTTIME"):
        return lambda: time.clock_gettime(time.CLOCK_BOOTTIME)
    return clock.monotonic


def steady_domain(clock: Clock) -> str:
    """What readings of :func:`steady_source` are comparable with: the boot for
    ``CLOCK_BOOTTIME`` (every process of the host until a reboot), else the clock's type (a
    test's fake clock)."""
    if isinstance(clock, SystemClock) and hasattr(time, "CLOCK_BOOTTIME"):
        try:
            uptime = float(Path("/proc/uptime").read_text().split()[0])
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except (OSError, ValueError, IndexError):
            boot, uptime = "", None
        # A process whose boot time is faked (libfaketime without
        # FAKETIME_DONT_FAKE_MONOTONIC) reads a steady clock no other process shares.
        if boot and uptime is not None and abs(
                time.clock_gettime(time.CLOCK_BOOTTIME) - uptime) < 1.0:
            return "boot:" + boot
        return f"process:{os.getpid()}"
    return type(clock).__qualname__


class ClockGuard:
    """A :class:`~ratchet.protocol.clock.Clock` that detects wall-clock steps and holds the
    forward ones (see the module's doc). Safe to read from any thread."""

    def __init__(self, inner: Clock, threshold: float = 5.0, hold: float = 600.0,
                 on_step: Callable[[ClockStep], None] | None = None,
                 steady: Callable[[], float] | None = None, domain: str | None = None) -> None:
        if threshold <= 0 or hold < 0:
            raise ValueError("clock step threshold must be > 0 and the hold >= 0")
        self.inner = inner
        self.threshold = threshold
        self.hold = hold
        self.on_step = on_step
        self._steady = steady or steady_source(inner)
        #: What this guard's steady readings are comparable with (:func:`steady_domain`).
        self.domain = domain or steady_domain(inner)
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
        """For the node's heartbeat (``ratchet admin nodes``), with a reading for
        :meth:`judge_start`: the wall time believed (``clock_wall``) and the steady time
        (``clock_steady``, of ``clock_domain``) at one instant."""
        self._read()
        with self._lock:
            wall, steady = self._last
            left = max(0.0, self._held_since + self.hold - steady) if self.held else 0.0
            last = self.last_step
            return {"clock_steps": self.steps, "clock_held_s": round(self.held, 3),
                    "clock_hold_left_s": round(left, 3),
                    "clock_last_step_s": None if last is None else round(last.seconds, 3),
                    "clock_wall": wall - self.held, "clock_steady": steady,
                    "clock_domain": self.domain}

    def judge_start(self, readings: Iterable[Mapping[str, Any]]) -> ClockStep | None:
        """At a node's start: compare the wall clock with the readings the store kept (each
        node's heartbeat ``info``, as :meth:`status` made it; others are ignored); a
        difference past the threshold counts as a step (see the module's doc). Returns it.
        """
        readings = [r for r in readings if isinstance(r.get("clock_wall"), float | int)
                    and isinstance(r.get("clock_steady"), float | int)]
        same = [r for r in readings if r.get("clock_domain") == self.domain]
        with self._lock:
            wall, steady = self.inner.now(), self._steady()
            self._last = (wall, steady)
        if same:
            latest = max(same, key=lambda r: float(r["clock_steady"]))
            age = steady - float(latest["clock_steady"])
            drift = wall - (float(latest["clock_wall"]) + age)
            if age < 0 or abs(drift) <= self.threshold + MAX_SLEW * age:
                return None
        elif readings:
            drift = wall - max(float(r["clock_wall"]) for r in readings)
            if drift >= -self.threshold:
                return None  # later than every wall time recorded: nothing to say
        else:
            return None
        with self._lock:
            step = self._stepped(drift, wall, steady, "store")
        if self.on_step is not None:
            self.on_step(step)
        return step

    def _read(self) -> tuple[float, float]:
        """The wall time now and the held seconds, after checking for a step."""
        step = None
        with self._lock:
            wall, steady = self.inner.now(), self._steady()
            last_wall, last_steady = self._last
            self._last = (wall, steady)
            drift = (wall - last_wall) - (steady - last_steady)
            if abs(drift) > self.threshold:
                step = self._stepped(drift, wall, steady, "steady")
            elif self.held and steady - self._held_since >= self.hold:
                self.held = 0.0  # consistent for the whole hold: the new time is believed
            held = self.held
        if step is not None and self.on_step is not None:
            self.on_step(step)
        return wall, held

    def _stepped(self, drift: float, wall: float, steady: float, reference: str) -> ClockStep:
        """Count a step and hold it if forward (the lock held)."""
        self.steps += 1
        if self.hold > 0:  # a hold of 0: steps are reported, never held
            self.held = max(0.0, self.held + drift)
        self._held_since = steady
        self.last_step = ClockStep(drift, wall, self.held, reference)
        return self.last_step
