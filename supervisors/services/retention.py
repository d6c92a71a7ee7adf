"""Retention: finished tasks' events, checkpoints and blobs expire, per tenant.

Every ``interval`` (on the injected clock) the sweeper purges the finished tasks of each
tenant whose retention period has passed since they last changed; blobs go by reference
(a blob still referenced by another checkpoint stays). The action ledger is kept: it guards
against repeating a business action. The store does not grow without bound.
"""

from __future__ import annotations

import structlog

from ratchet.actors.core.actor import PeriodicService
from ratchet.persistence.ports import AdminStore
from ratchet.protocol.clock import Clock

__all__ = ["RetentionSweeper"]

log = structlog.get_logger("ratchet.retention")


class RetentionSweeper(PeriodicService):
    def __init__(self, store: AdminStore, clock: Clock, retention: dict[str, float],
                 interval: float = 600.0) -> None:
        """``retention``: tenant → seconds to keep finished tasks; key ``"*"`` for any
        tenant not named. A tenant with no entry (and no ``"*"``) keeps them for ever."""
        self.store = store
        self.clock = clock
        self.retention = retention
        self.interval = interval

    async def sweep(self) -> int:
        now = self.clock.due_now()  # a forward step of the wall clock purges nothing early
        purged = 0
        for tenant, seconds in self.retention.items():
            others = [t for t in self.retention if t != "*"] if tenant == "*" else []
            expired = await self.store.expired_tasks(None if tenant == "*" else tenant,
                                                     now - seconds, exclude=others)
            for task_id in expired:
                await self.store.purge_task(task_id)
                purged += 1
        if purged:
            log.info("finished tasks purged", count=purged)
        return purged
