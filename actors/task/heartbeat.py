"""Heartbeats from inside a long step: ``await ctx.heartbeat(progress=0.4, note="page 4/10")``.

A step that runs for minutes says how far it is without committing anything: the latest
heartbeat of the task's step (or of each fan-out branch's) is one row upserted outside the
task's version and checkpoints (persistence/diagnose_rows.py), at most once per
:data:`MIN_INTERVAL` seconds of the task's clock per step run (one in between is dropped:
the next one due carries the newest figure; the last of a burst may so be lost, which only
shows an older figure). A heartbeat the store cannot take is logged, never a step failure.
``admin diagnose`` and ``admin get`` show it, and the task's percent with it
(:func:`task_percent`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from ratchet.persistence.diagnose_rows import DiagnoseStore
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import InvalidMessage

__all__ = ["MIN_INTERVAL", "StepHeartbeat", "fraction_of", "task_percent"]

log = structlog.get_logger("ratchet.heartbeat")

#: Seconds between two heartbeat writes of one step (or branch), at least.
MIN_INTERVAL = 1.0
_NOTE_MAX = 500


def fraction_of(progress: float | tuple[float, float] | None) -> float | None:
    """A step's progress as a fraction in [0, 1]: a float in [0, 1], or ``(done, total)``
    with weights of the step's own choosing (bytes, pages, items).

    Raises:
        InvalidMessage: anything else (a fraction over 1, a negative or zero total).
    """
    if progress is None:
        return None
    if isinstance(progress, tuple):
        done, total = progress
        if not total > 0 or not 0 <= done:
            raise InvalidMessage("heartbeat progress (done, total) needs total > 0, done >= 0")
        return min(1.0, float(done) / float(total))
    if isinstance(progress, bool) or not 0.0 <= float(progress) <= 1.0:
        raise InvalidMessage("heartbeat progress must be a fraction from 0 to 1, or"
                             " (done, total)", progress=repr(progress)[:50])
    return float(progress)


def task_percent(steps_completed: int, steps_total: int | None, step_fraction: float | None,
                 branches: Iterable[float] = ()) -> int:
    """The task's percent with its running step's heartbeat: each step weighs one step of
    the workflow's ``steps_total``; the running step counts for its fraction — inside a
    fan-out, the mean of its branches' fractions (a finished branch counts 1, one that has
    not beaten 0). Capped at 99 until the task has finished (actors/task/progress.py)."""
    if not steps_total or steps_total <= 0:
        return 0
    shares = list(branches)
    fraction = sum(shares) / len(shares) if shares else (step_fraction or 0.0)
    return max(0, min(99, int(100 * (steps_completed + fraction) / steps_total)))


@dataclass(slots=True)
class StepHeartbeat:
    """The heartbeat of one step run (``scope`` ''), or of one fan-out branch (its name)."""

    store: Any  # the task's store; a DiagnoseStore keeps heartbeats, another ignores them
    clock: Clock
    task_id: str
    scope: str
    owner: str
    _last: float | None = None

    async def beat(self, step: str, attempt: int,
                   progress: float | tuple[float, float] | None = None,
                   note: str | None = None) -> None:
        """Record how far ``step`` (run ``attempt``) is. Never a checkpoint: a crash loses
        nothing but it.

        Raises:
            InvalidMessage: a progress that is not a fraction (see :func:`fraction_of`).
        """
        fraction = fraction_of(progress)  # a bad one is refused even when not written
        now = self.clock.now()
        if self._last is not None and now - self._last < MIN_INTERVAL:
            return  # the next one due carries the newest figure
        if not isinstance(self.store, DiagnoseStore):
            return
        self._last = now
        shown = None if note is None else str(note)[:_NOTE_MAX]
        try:
            await self.store.record_heartbeat(self.task_id, self.scope, step, attempt,
                                              fraction, shown, self.owner, now)
        except Exception as exc:  # a figure for people: never worth failing the step
            log.warning("heartbeat not recorded", task_id=self.task_id, error=repr(exc))
