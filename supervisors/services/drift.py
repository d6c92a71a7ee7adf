"""The drift service: runs the workflows' drift reconciliation (``Workflow(reconcile=
Reconcile(every, check))``, actors/workflow/reconcile.py), per partition, periodically.

Every ``poll`` seconds (on the injected clock) it looks at each served workflow whose
latest version declares ``reconcile`` and is due: it reads the succeeded writes of that
workflow's tasks (``DriftStore.succeeded_writes``), keeps those of the partitions this
node holds (as the schedule service keeps its schedules'), and for each partition whose
pass is due (``reconcile_passes.next_at``: durable, so a restart or the partition's next
owner does not run a pass again before it is due) asks ``check`` for the provider's view
of every effect and compares it with the recorded result. A difference is a
``drift.detected`` event on the task that made the effect — a side-channel change (no
compare-and-set with a live actor, whatever the task's status), fenced like every task
write — and a warning in the log. Then the pass moves on by ``every`` seconds
(compare-and-set). Nothing else changes: the ledger stays the record of what Ratchet did.

A ``check`` that raises or overruns ``check_timeout`` counts as no answer for that effect
(logged), never as drift; a sync ``check`` runs on a thread, not on the node's loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from typing import Any

import structlog

from ratchet.actors.core.actor import ServiceActor
from ratchet.actors.workflow.reconcile import Reconcile, RecordedEffect, difference
from ratchet.actors.workflow.registry import Registry
from ratchet.persistence import TaskChange
from ratchet.persistence.ledger import ActionRecord
from ratchet.persistence.ports import StorePort
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.clock import Clock
from ratchet.protocol.redaction import redact, secret_values
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.supervision.tasks import TaskSupervision

__all__ = ["DriftService"]

log = structlog.get_logger("ratchet.drift")


class DriftService(ServiceActor):
    def __init__(self, store: StorePort, registry: Registry, tasks: TaskSupervision,
                 clock: Clock, producer: str, partitions: int, poll: float = 1.0,
                 check_timeout: float = 30.0) -> None:
        self.store = store
        self.registry = registry
        self.tasks = tasks
        self.clock = clock
        self.producer = producer
        self.partitions = partitions
        self.poll = poll
        self.check_timeout = check_timeout
        #: Per workflow, when to look again (the earliest pass due that this node knows).
        self._next_look: dict[str, float] = {}
        #: Effects compared and drifts found by this service (figures for tests and logs).
        self.checked = 0
        self.drifted = 0

    async def serve(self) -> None:
        while True:
            await self.run_due()
            await self.clock.sleep(self.poll)

    def _reconciling(self) -> list[tuple[str, Reconcile]]:
        jobs = []
        for name in self.registry.names():
            job = self.registry.get(name).reconcile
            if job is not None:
                jobs.append((name, job))
        return jobs

    async def run_due(self, now: float | None = None) -> int:
        """Run every pass due on this node's partitions; how many ran."""
        now = self.clock.due_now() if now is None else now
        ran = 0
        for name, job in self._reconciling():
            if now < self._next_look.get(name, now):
                continue
            owned: dict[int, list[ActionRecord]] = defaultdict(list)
            for effect in await self.store.succeeded_writes(name):
                if (not job.tools or effect.tool in job.tools) and self.tasks.owns(effect.task_id):
                    owned[partition_of(effect.task_id, self.partitions)].append(effect)
            look = now + job.every
            for partition, effects in sorted(owned.items()):
                due = await self.store.reconcile_due(name, partition, first_at=now)
                if due > now:
                    look = min(look, due)
                    continue
                checked, drifted = await self._compare(name, job, effects, now)
                await self.store.advance_reconcile(name, partition, due, now + job.every,
                                                   self.clock.now(), checked, drifted)
                ran += 1
            self._next_look[name] = look
        return ran

    async def _compare(self, workflow: str, job: Reconcile, effects: list[ActionRecord],
                       now: float) -> tuple[int, int]:
        checked = drifted = 0
        for e in effects:
            effect = RecordedEffect(e.tenant, e.task_id, e.key, e.tool, e.args, e.result,
                                    e.provider_id)
            try:
                async with asyncio.timeout(self.check_timeout):
                    seen = await self._ask(job, effect)
            except Exception as exc:  # no answer this pass: not drift
                log.warning("reconcile check failed", workflow=workflow, task_id=e.task_id,
                            key=e.key, tool=e.tool, error=repr(exc))
                continue
            checked += 1
            found = difference(e.result, seen)
            if not found:
                continue
            drifted += 1
            shown = redact(found, secret_values(e.result))
            log.warning("drift detected", workflow=workflow, task_id=e.task_id,
                        tenant=e.tenant, key=e.key, tool=e.tool, difference=shown)
            await self.store.apply(TaskChange(
                task_id=e.task_id, expected_version=None, producer=self.producer,
                now=self.clock.now(), events=[(EventType.DRIFT_DETECTED, {
                    "key": e.key, "tool": e.tool, "difference": shown, "checked_at": now})]))
        self.checked += checked
        self.drifted += drifted
        return checked, drifted

    @staticmethod
    async def _ask(job: Reconcile, effect: RecordedEffect) -> Any:
        if inspect.iscoroutinefunction(job.check):
            return await job.check(effect)
        seen = await asyncio.to_thread(job.check, effect)
        return await seen if inspect.isawaitable(seen) else seen
