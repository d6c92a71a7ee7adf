"""The partition leases this node holds, as the rest of the node reads them.

:class:`HeldLeases` is written by the lease manager (``supervisors/node/leases.py``) and read by
the store (it is the store's :class:`~persistence.records.Fence`: the token a task's writes
carry), by task supervision (does this node own a task?) and by task recovery (how did the
partition come to us?). It holds no I/O, so the node creates it first and hands it, fully
formed, to each of them.

Its view of each lease's validity is on the clock's **monotonic** time (measured from just
before the renewal that the store recorded), never on the wall clock: a step of the wall
clock neither stretches nor cuts it short.
"""

from __future__ import annotations

from typing import Any

import structlog

from ratchet.persistence.leases import LeaseRow
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import Fenced
from ratchet.protocol.subjects import partition_of

__all__ = ["HeldLeases"]

log = structlog.get_logger("ratchet.leases")


class HeldLeases:
    def __init__(self, node_id: str, partitions: int, clock: Clock, safety: float = 0.0) -> None:
        self.node_id = node_id
        self.partitions = partitions
        self.clock = clock
        #: Stop writing this long before a lease's expiry as this node last renewed it.
        self.safety = safety
        self.held: dict[int, int] = {}  # partition → fencing token
        #: partition → the lease's end as last renewed, on the clock's monotonic time
        self.valid_until: dict[int, float] = {}
        #: Held partitions whose writes were refused because renewal came late.
        self.lapsed: set[int] = set()
        #: partition → how it came to us: the lease row at acquisition (recovery evidence)
        self.taken: dict[int, LeaseRow] = {}
        self.fenced_writes = 0
        #: Leases taken and let go (lost, handed over, released) since the start: a metric.
        self.changes = {"acquired": 0, "dropped": 0}

    # -- the Fence the store asks ---------------------------------------------------------

    def token_for(self, task_id: str) -> tuple[int, int]:
        """``(partition, token)`` for a write of the task's; raises :class:`Fenced` when the
        lease is not held or about to lapse (so no new side effect starts)."""
        partition = partition_of(task_id, self.partitions)
        now = self.clock.monotonic()
        token = self.held.get(partition)
        if token is None or now >= self.valid_until.get(partition, 0.0) - self.safety:
            if token is not None:
                self.lapsed.add(partition)  # still ours unless renewal says otherwise
            self.fenced_writes += 1
            log.warning("write fenced: lease not held", task_id=task_id, partition=partition,
                        token=token)
            raise Fenced("write refused: this node does not hold the task's partition lease",
                         partition=partition, node=self.node_id)
        return partition, token

    def owns(self, task_id: str) -> bool:
        return partition_of(task_id, self.partitions) in self.held

    def recovery_note(self, task_id: str) -> dict[str, Any] | None:
        """Why a RUNNING task is being recovered here: ``node_failover`` (its node died or
        froze), ``partition_handover`` (its node let the partition go cleanly: drain,
        rebalance, a clean stop — this node's own too), or None: ``node_recovery``, this
        node restarting after a crash."""
        row = self.taken.get(partition_of(task_id, self.partitions))
        if row is None or row.previous_owner is None:
            return None
        if row.reaped and row.previous_owner == self.node_id:
            return None  # our previous incarnation crashed: node_recovery
        return {"reason": "node_failover" if row.reaped else "partition_handover",
                "previous_owner": row.previous_owner, "lease_token": row.token}

    # -- written by the lease manager -----------------------------------------------------

    def take(self, row: LeaseRow, valid_until: float) -> None:
        """``valid_until``: monotonic time (just before the acquisition + the TTL)."""
        self.held[row.partition] = row.token
        self.changes["acquired"] += 1
        self.valid_until[row.partition] = valid_until
        self.taken[row.partition] = row

    def drop(self, partitions: list[int]) -> None:
        for p in partitions:
            if self.held.pop(p, None) is not None:
                self.changes["dropped"] += 1
            self.valid_until.pop(p, None)

    def release_all(self) -> dict[int, int]:
        """Forget every lease; returns what was held (partition → token)."""
        held, self.held = dict(self.held), {}
        self.changes["dropped"] += len(held)
        self.valid_until.clear()
        return held
