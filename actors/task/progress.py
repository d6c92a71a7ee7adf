"""Progress heartbeats: ``task.progress`` events computed by the runtime from completed work.

A model never reports progress; the runtime counts what it committed. The event rides in
the step boundary's own transaction (no extra write), at most once per interval of the task
actor's clock. The interval is kept in memory only: after a restart the first boundary past
one interval from activation may emit one, which keeps the rate bounded without a read.

Everything here is pure: the task actor supplies the numbers and the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ProgressMeter", "percent", "progress_payload"]


def percent(completed: int, total: int | None, *, finished: bool = False) -> int:
    """How far the task is, in whole percent.

    100 only once it has finished; up to then at most 99, since a graph may revisit nodes
    (loops, agent turns) and so complete more boundaries than it has steps. 0 when the
    total is not known.
    """
    if finished:
        return 100
    if not total or total <= 0:
        return 0
    return max(0, min(99, (100 * completed) // total))


def progress_payload(*, node: str, steps_completed: int, steps_total: int | None,
                     last_checkpoint: int, owner: str,
                     actions: int | None = None) -> dict[str, Any]:
    """The ``task.progress`` payload of a step boundary that leaves the task at ``node``.

    Args:
        node: the graph node the task runs next.
        steps_completed: node boundaries committed so far, this one included.
        steps_total: the workflow's step count, if known.
        last_checkpoint: the checkpoint written by this boundary.
        owner: the node (process) running the task.
        actions: side effects recorded so far, when known without a read; else omitted.
    """
    payload: dict[str, Any] = {
        "node": node, "steps_completed": steps_completed, "steps_total": steps_total,
        "percent": percent(steps_completed, steps_total), "last_checkpoint": last_checkpoint,
        "owner": owner,
    }
    if actions is not None:
        payload["actions"] = actions
    return payload


@dataclass(slots=True)
class ProgressMeter:
    """When the next heartbeat is due: at most one per ``interval`` seconds.

    ``last`` is the time of the last heartbeat (or of activation); None means the first
    boundary is due at once.
    """

    interval: float
    last: float | None = None

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= self.interval

    def mark(self, now: float) -> None:
        """Record a heartbeat (or an activation) at ``now``."""
        self.last = now
