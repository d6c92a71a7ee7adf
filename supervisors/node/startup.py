"""Where a node's start goes, phase by phase (docs/operations.md, "Restart (W4)").

A :class:`StartupPhases` is made when ``ratchet serve`` begins, with its first phase,
``imports``, measured from the process's own start (the interpreter, the imports, the
parsing of the flags), and each later phase from the end of the one before. The node marks
its phases as it starts; ``serve`` logs them (``start-up phases``, at info) and puts them
in its ``serving`` line as ``startup_ms``.

Phases of a restart, in the order a node goes through them:

- ``imports``: process start → ``serve`` runs (interpreter, imports, the flags);
- ``app``: the ``--app`` module imported, the node and its clock made;
- ``store``: the database opened, its migrations checked, the audit seal read;
- ``checks``: partition count and node id checked, trust (admin key, mail seal), secrets;
- ``nats``: the embedded nats-server ready (JetStream recovered) or the external one
  reached, the connection and the streams;
- ``resume``: the essential children (outbox relay, tasks, mail, leases) started, the
  leases taken and the unfinished tasks activated — from here they run;
- ``services``: the rest (requests, admin, timers, schedules, sweepers, intake), their
  modules imported on a thread while the resumed tasks run (later_children.py);
- ``ready``: ``serve``'s readiness check passed.

The marks are monotonic time; the process's start is read from ``/proc/self/stat``
(clock ticks: 10 ms granularity), and is the origin only when it can be read.
"""

from __future__ import annotations

import os
import time

import structlog

__all__ = ["StartupPhases", "process_age"]


def process_age() -> float | None:
    """Seconds since this process started (None where ``/proc`` cannot say)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, IndexError, ValueError, AttributeError):
        return None


class StartupPhases:
    """Phase name → milliseconds it took, in the order marked."""

    def __init__(self) -> None:
        now = time.monotonic()
        age = process_age()
        #: Monotonic time the process started (or this object was made).
        self.origin = now - age if age is not None else now
        self._last = self.origin
        self.phases: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """End ``phase`` now: it lasted since the previous mark (or the process's start)."""
        now = time.monotonic()
        self.phases[phase] = round((now - self._last) * 1000.0, 1)
        self._last = now

    def total_ms(self) -> float:
        """Milliseconds from the origin to the last mark."""
        return round((self._last - self.origin) * 1000.0, 1)

    def log(self, node_id: str) -> None:
        """The ``start-up phases`` line (info)."""
        structlog.get_logger("ratchet.node").info("start-up phases", node=node_id,
                                                  **self.figures())

    def figures(self) -> dict[str, float]:
        """The phases and their ``total``, for a log line or the ``serving`` line."""
        return {**self.phases, "total": self.total_ms()}
