"""The action sweeper: settles writes whose outcome nobody recorded, on any task.

A task settles its own writes whenever it runs (actors/task/settle_task.py: on recovery,
at the end of a step, before SUCCEEDED). What is left is on tasks that do not run: a call
a cancel detached (it outlived the cancel timeout), or a write a task ended with while the
node went down. Every ``interval`` seconds (on the injected clock) the sweeper reads the
tasks holding a write IN_FLIGHT (not accepted) or UNKNOWN unchanged for ``settle_after``
seconds, and activates each one it owns and that has no live actor: the actor settles
them by ``query`` (found → SUCCEEDED, compensated if the task's end asks for it; not
found → FAILED for an ended task; undecidable → a handoff for a human, once) and stops.

``settle_after`` must exceed the longest tool call: a younger write may still be running.
Tasks parked for a human (UNKNOWN, WAITING_APPROVAL) are left to that human.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import PeriodicService
from ratchet.persistence.ports import StorePort
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import RatchetError
from ratchet.supervisors.supervision.tasks import TaskSupervision, task_actor_name

__all__ = ["ActionSweeper"]

log = structlog.get_logger("ratchet.settle")

#: Statuses whose tasks a human (or a running actor) is looking after.
_LEFT_ALONE = frozenset({"UNKNOWN", "WAITING_APPROVAL"})


class ActionSweeper(PeriodicService):
    def __init__(self, store: StorePort, tasks: TaskSupervision, clock: Clock,
                 interval: float = 60.0, settle_after: float = 300.0, batch: int = 200) -> None:
        self.store = store
        self.tasks = tasks
        self.clock = clock
        self.interval = interval
        self.settle_after = settle_after
        self.batch = batch

    async def sweep(self) -> int:
        """Activate each owned task holding writes unsettled for ``settle_after`` seconds;
        returns how many."""
        activated = 0
        stale = await self.store.stale_unsettled(self.clock.now() - self.settle_after,
                                                 self.batch)
        for task_id, _tenant, status in stale:
            if status in _LEFT_ALONE or not self.tasks.owns(task_id):
                continue
            if self.tasks.system.lookup(task_actor_name(task_id)) is not None:
                continue  # running: it settles its own
            try:
                if await self.tasks.ensure_running(task_id, ended_too=True) is not None:
                    activated += 1
            except RatchetError as exc:  # gone meanwhile, or the partition moved
                log.info("unsettled writes not swept", task_id=task_id, error=repr(exc))
        if activated:
            log.warning("activated tasks to settle their writes", count=activated)
        return activated
