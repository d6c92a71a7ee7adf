"""The recovery sweeper: activates unfinished tasks that have no live actor.

The node recovers every QUEUED or RUNNING task when it starts. After that, a task is
activated by its mail; if that mail is lost (JetStream acknowledges before it fsyncs, so
an OS crash can lose it), the task would sit still. The store is the truth, so every
``interval`` seconds (on the injected clock) the sweeper re-derives what should be running
from it and activates what is not.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import PeriodicService
from ratchet.actors.task.fanout import Recount
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.clock import Clock
from ratchet.supervisors.supervision.tasks import (
    TASKS_ROOT,
    TaskSupervision,
    task_supervisor_name,
)

__all__ = ["RecoverySweeper"]

log = structlog.get_logger("ratchet.recovery")


class RecoverySweeper(PeriodicService):
    def __init__(self, store: TaskStore, tasks: TaskSupervision, clock: Clock,
                 interval: float = 30.0) -> None:
        self.store = store
        self.tasks = tasks
        self.clock = clock
        self.interval = interval
        #: Tasks the last sweep found idle: recovered if this sweep finds them idle again.
        self._suspects: set[str] = set()

    async def sweep(self) -> int:
        """Activate every QUEUED/RUNNING task found without a live supervisor by this sweep
        and the one before; returns how many."""
        idle: set[str] = set()
        activated = 0
        for task_id, tenant, status in await self.store.active_tasks():
            if status not in ("QUEUED", "RUNNING"):
                continue  # waiting tasks are woken by their mail or timers
            if not self.tasks.owns(task_id):
                continue  # another node's partition
            if self.tasks.system.lookup(task_supervisor_name(task_id)) is not None:
                continue
            if task_id not in self._suspects:
                idle.add(task_id)  # perhaps its mail is on the way: look again next sweep
                continue
            # Through admission: a task queued for a slot stays queued (not counted).
            if await self.tasks.activate(task_id, tenant) is not None:
                activated += 1
        self._suspects = idle
        if activated:
            log.warning("recovered idle unfinished tasks", count=activated)
        self._recount_joins()
        return activated

    def _recount_joins(self) -> None:
        """A live task waiting at a join is not idle, but the ``branch.done`` mail it waits
        for may be lost: every live join reads its completion set from the store again."""
        for ref in self.tasks.system.live_refs(f"{TASKS_ROOT}/"):
            if "/join:" in ref.name:
                ref.tell(Recount())
