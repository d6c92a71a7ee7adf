"""What a node does as partitions come and go: the lease manager's hooks.

- acquired: recover the partition's unfinished tasks from their checkpoints (each records
  ``task.recovered``; after a failover, naming the previous owner), then start its mail
  router. Tasks first: they run while the routers start (a JetStream consumer each, one
  round trip), and mail for them waits in its stream until its router consumes it, as at
  any other moment the router is not running (docs/operations.md, "Restart (W4)").
- lost (the lease was taken by another node — this node was paused or cut off): stop the
  mail router and the tasks at once. Their writes are already refused by fencing.
- handing over (drain, rebalance, clean stop): stop the mail router, stop each task at its
  next safe point, flush the outbox; the lease manager then releases the lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from ratchet.actors.core.actor import ActorRef
from ratchet.persistence.leases import LeaseRow
from ratchet.persistence.ports import TaskStore
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.services.mail_router import MailRouter
from ratchet.supervisors.supervision.restart_policy import Restart
from ratchet.supervisors.supervision.supervisor import (
    ChildSpec,
    StartChild,
    StopChildren,
    Supervisor,
)
from ratchet.supervisors.supervision.tasks import TaskSupervision, task_actor_name

__all__ = ["PartitionWork"]

log = structlog.get_logger("ratchet.partitions")


class PartitionWork:
    def __init__(self, *, node_id: str, partitions: int, store: TaskStore, tasks: TaskSupervision,
                 mail_supervisor: Callable[[], ActorRef[Supervisor] | None],
                 make_router: Callable[[int], MailRouter],
                 flush_outbox: Callable[[], Any],
                 activate: Callable[[str, str], Any],
                 forget: Callable[[set[int]], None]) -> None:
        self.node_id = node_id
        self.partitions = partitions
        self.store = store
        self.tasks = tasks
        self.mail_supervisor = mail_supervisor
        self.make_router = make_router
        self.flush_outbox = flush_outbox
        #: (task_id, tenant) → start it (through the node's admission scheduler)
        self.activate = activate
        #: partitions → drop their tasks from admission (queued or running here)
        self.forget = forget
        self._resuming: set[asyncio.Task[None]] = set()

    async def acquired(self, rows: list[LeaseRow]) -> None:
        await self.recover({r.partition for r in rows})
        sup = self.mail_supervisor()
        for row in rows:
            if sup is not None:
                partition = row.partition
                await sup.ask(StartChild(ChildSpec(
                    f"p{partition}", lambda _, p=partition: self.make_router(p),  # type: ignore[misc]
                    Restart.PERMANENT, shutdown_timeout=10.0)), timeout=30.0)

    async def recover(self, partitions: set[int]) -> int:
        """Activate the QUEUED and RUNNING tasks of these partitions (waiting ones stay
        passivated: their mail or timers wake them), then run the RUNNING branches placed
        there (after a takeover, or a late renewal whose lapse fenced them); returns how
        many tasks."""
        count = 0
        for task_id, tenant, status in await self.store.active_tasks():
            if status in ("QUEUED", "RUNNING") \
                    and partition_of(task_id, self.partitions) in partitions:
                await self.activate(task_id, tenant)
                count += 1
        if count:
            log.info("recovering tasks", count=count, partitions=sorted(partitions))
        # In the background: the partitions' mail routers start without waiting for it.
        resuming = asyncio.get_running_loop().create_task(self._resume_branches(partitions))
        self._resuming.add(resuming)
        resuming.add_done_callback(self._resuming.discard)
        return count

    async def _resume_branches(self, partitions: set[int]) -> None:
        try:  # from their last committed steps
            await self.tasks.branch_host.resume(partitions)
        except Exception as exc:  # their tasks' next starts run them
            log.warning("placed branches not resumed", error=repr(exc))

    async def _stop_routers(self, partitions: list[int]) -> None:
        sup = self.mail_supervisor()
        if sup is not None:
            await sup.ask(StopChildren([f"p{p}" for p in partitions]), timeout=30.0)

    async def _tasks_in(self, partitions: list[int]) -> list[str]:
        wanted = set(partitions)
        return [t for t in await self.tasks.live_tasks()
                if partition_of(t, self.partitions) in wanted]

    async def lost(self, partitions: list[int]) -> None:
        self.forget(set(partitions))
        await self._stop_routers(partitions)
        await self.tasks.branch_host.release(set(partitions))
        doomed = await self._tasks_in(partitions)
        # No safe point to wait for: nothing they do can commit any more. Interrupt running
        # steps, then stop.
        for task_id in doomed:
            actor = self.tasks.system.lookup(task_actor_name(task_id))
            if actor is not None:
                actor.interrupt()
        try:
            await self.tasks.stop_tasks(doomed, timeout=10.0)
        except Exception as exc:  # still stopping in the background
            log.warning("isolated tasks still stopping", error=repr(exc))
        log.warning("partitions isolated", partitions=partitions, tasks_stopped=len(doomed))

    async def handing_over(self, partitions: list[int]) -> None:
        self.forget(set(partitions))
        await self._stop_routers(partitions)
        # Their branches stop now (the new owner runs them from their last committed
        # steps), not at a safe point: a branch's step in flight runs again there.
        await self.tasks.branch_host.release(set(partitions))
        moving = await self._tasks_in(partitions)
        await self.tasks.stop_tasks(moving)
        await self.flush_outbox()
        log.info("partitions ready to hand over", partitions=partitions, tasks=len(moving))
