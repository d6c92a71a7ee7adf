"""The schedule service: fires schedules' ticks (protocol/schedules.py), one task each.

Like the timer service, it sleeps on the injected clock until the earliest due schedule
(at most ``poll`` seconds), then, for each due schedule whose partition this node holds
(partition of ``sch:<tenant>:<name>``; another node's are left to their owner), plans
the ticks to fire under the schedule's missed-ticks policy and submits each through the
intake's :class:`Acceptor` with the idempotency key ``<schedule>:<tick time>``. Only then
does it move the schedule on (compare-and-set on ``next_at``).

Why exactly one task per tick: the task id is a hash of (tenant, key) and the
``requests`` table keeps the key for good, so a tick submitted again — the node died
between the submit and moving the schedule on, two nodes both believed they held the
partition, a pass raced another — finds the task it made the first time.

A refusal that may pass (the node's queue is full, the store is busy) leaves the
schedule where it is, to be tried at the next pass; one that will not (the workflow is
no longer served here, the input no longer validates) is kept in ``last_error`` and the
tick is skipped, so a broken schedule does not spin.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import ServiceActor
from ratchet.persistence.schedule_rows import ScheduleRow, ScheduleStore
from ratchet.protocol.catalogue import MessageType
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import RatchetError
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope
from ratchet.protocol.schedules import plan_ticks, spec_from_dict, tick_key
from ratchet.supervisors.services.intake import Acceptor
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["ScheduleService", "schedule_owner_key"]

log = structlog.get_logger("ratchet.schedules")


def schedule_owner_key(tenant: str, name: str) -> str:
    """What a schedule's partition is computed from (as a task id's is)."""
    return f"sch:{tenant}:{name}"


class ScheduleService(ServiceActor):
    def __init__(self, store: ScheduleStore, tasks: TaskSupervision, acceptor: Acceptor,
                 clock: Clock, poll: float = 1.0) -> None:
        self.store = store
        self.tasks = tasks
        self.acceptor = acceptor
        self.clock = clock
        self.poll = poll
        #: Ticks submitted by this service (a repeat of a tick counts too).
        self.submitted = 0

    async def serve(self) -> None:
        while True:
            now = self.clock.due_now()
            next_due = await self.store.next_schedule_due()  # idle: one read a poll
            moved = 0
            if next_due is not None and next_due <= now:
                moved = await self.fire_due(now)
                next_due = await self.store.next_schedule_due()
            wait = self.poll if next_due is None else min(self.poll,
                                                          next_due - self.clock.due_now())
            if next_due is not None and next_due <= now and not moved:
                wait = min(self.poll, 0.1)  # due but another node's, or refused: do not spin
            await self.clock.sleep(max(wait, 0.0))

    async def fire_due(self, now: float | None = None) -> int:
        """Fire every due schedule of this node's partitions; how many moved on."""
        now = self.clock.due_now() if now is None else now
        moved = 0
        for row in await self.store.due_schedules(now):
            if not self.tasks.owns(schedule_owner_key(row.tenant, row.name)):
                continue
            moved += await self._fire(row, now)
        return moved

    async def _fire(self, row: ScheduleRow, now: float) -> int:
        plan = plan_ticks(spec_from_dict(row.spec), row.next_at, now)
        for tick in plan.fire:
            try:
                accepted = await self.acceptor.accept(row.tenant, self._submission(row, tick))
            except RatchetError as exc:
                if exc.retryable:
                    log.info("schedule tick deferred", schedule=row.name, tenant=row.tenant,
                             tick=tick, error=exc.message)
                    return 0  # the ticks before it are done: their keys find them again
                row.last_error = f"{exc.code.value}: {exc.message}"[:500]
                log.warning("schedule tick refused", schedule=row.name, tenant=row.tenant,
                            tick=tick, code=exc.code.value, error=exc.message)
                continue
            self.submitted += 1
            row.last_tick, row.last_task_id, row.last_error = tick, accepted.task_id, None
            log.info("schedule tick submitted", schedule=row.name, tenant=row.tenant, tick=tick,
                     task_id=accepted.task_id, created=accepted.created)
        if plan.skipped:
            log.info("missed schedule ticks skipped", schedule=row.name, tenant=row.tenant,
                     skipped=plan.skipped, policy=row.spec.get("missed"))
        return int(await self.store.advance_schedule(row, plan.next_at, self.clock.now()))

    def _submission(self, row: ScheduleRow, tick: float) -> Envelope:
        key = tick_key(row.name, tick)
        body = {"workflow": row.workflow, "workflow_version": row.workflow_version,
                "input": row.input, "idempotency_key": key, "deadline_s": row.deadline_s}
        return Envelope(type=MessageType.TASK_SUBMIT, message_id=new_id("msg"),
                        correlation_id=key, sent_at=self.clock.now(), body=body)
