"""Weighted fair admission of tasks on one node: who may start running next.

A pure, synchronous state machine (no I/O, no tasks of its own): the caller asks to
:meth:`FairScheduler.admit` a task, and starts it only when the answer is True; when a task
finishes it calls :meth:`FairScheduler.release` and starts the tasks that call returns.

Rules, in order:

1. At most ``max_running`` tasks hold a slot. :meth:`occupy` counts a task that is already
   running (e.g. recovered after a restart) without asking, and may exceed the cap; then
   nothing is granted until the count is back under it.
2. A tenant runs at most its quota (``quotas[tenant]``, else ``default_quota``, else
   ``max_running``) at once.
3. Among tenants with queued tasks and room under their quota, the slot goes to the one
   with the smallest ``running / weight`` (weights default to 1.0); a tie goes to the tenant
   whose oldest queued task arrived first (an arrival counter, not the clock).
4. Within a tenant, higher ``priority`` first (0 to 9, protocol/messages.py), then first
   in, first out. Priorities never cross tenants: a tenant's urgent task takes the next
   slot *its* share gets, not another tenant's.

A new task never jumps the queue: when anything is queued it is admitted at once only if
its tenant would win rule 3 against every queued tenant (and has nothing queued itself).
So a tenant that floods the node with ten thousand tasks gets its fair share of the slots,
not all of them: another tenant's first task is granted at the next release.

Costs: admit, occupy and release are O(1) per task plus a scan over the tenants with
queued tasks (tenants are few); a task removed while queued is dropped lazily from its
tenant's queue, which is compacted when it holds more dead entries than live ones.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["FairScheduler"]


class FairScheduler:
    """Admission of tasks to the slots of one node (see the module doc for the rules).

    Args:
        max_running: slots on the node (>= 1).
        default_quota: a tenant's cap on running tasks when ``quotas`` has no entry for it
            (None: ``max_running``).
        quotas: per-tenant caps (>= 1).
        weights: per-tenant shares (> 0, default 1.0): under saturation tenants hold slots
            in proportion to their weights.
        max_queued: queue length past which :meth:`has_room` says no (intake backpressure;
            :meth:`admit` itself never refuses).

    Raises:
        ValueError: a limit or weight out of range.
    """

    def __init__(self, *, max_running: int = 64, default_quota: int | None = None,
                 quotas: dict[str, int] | None = None, weights: dict[str, float] | None = None,
                 max_queued: int = 20_000) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {max_queued}")
        if default_quota is not None and default_quota < 1:
            raise ValueError(f"default_quota must be >= 1, got {default_quota}")
        for tenant, quota in (quotas or {}).items():
            if quota < 1:
                raise ValueError(f"quota of tenant {tenant!r} must be >= 1, got {quota}")
        for tenant, weight in (weights or {}).items():
            if not weight > 0:
                raise ValueError(f"weight of tenant {tenant!r} must be > 0, got {weight}")
        self.max_running = max_running
        self.max_queued = max_queued
        self.default_quota = default_quota if default_quota is not None else max_running
        self.quotas = dict(quotas or {})
        self.weights = dict(weights or {})
        self._arrivals = 0
        #: task_id -> tenant, for every task holding a slot.
        self._running: dict[str, str] = {}
        #: task_id -> (tenant, arrival), for every queued task (the truth; queues may lag).
        self._queued: dict[str, tuple[str, int]] = {}
        #: tenant -> its heap of (-priority, arrival, task_id), possibly holding dead entries.
        self._queues: dict[str, list[tuple[int, int, str]]] = {}
        self._tenant_running: Counter[str] = Counter()
        self._tenant_queued: Counter[str] = Counter()
        self._granted: Counter[str] = Counter()
        self._room = asyncio.Event()  # binds to a loop on first wait, not here
        self._room.set()

    # -- reading ------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def running(self) -> int:
        return len(self._running)

    def has_room(self) -> bool:
        """True while the queue is shorter than ``max_queued`` (intake may take more)."""
        return len(self._queued) < self.max_queued

    async def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`has_room`; False if ``timeout`` seconds passed first."""
        try:
            async with asyncio.timeout(timeout):
                while not self.has_room():
                    await self._room.wait()
        except TimeoutError:
            return self.has_room()
        return True

    def stats(self) -> dict[str, Any]:
        """Totals and, per tenant, ``running``, ``queued`` and ``granted`` (slots given so far)."""
        tenants = set(self._tenant_running) | set(self._tenant_queued) | set(self._granted)
        return {
            "running": self.running,
            "queued": self.queued,
            "max_running": self.max_running,
            "granted": sum(self._granted.values()),
            "tenants": {t: {"running": self._tenant_running[t], "queued": self._tenant_queued[t],
                            "granted": self._granted[t]} for t in sorted(tenants)},
        }

    def quota(self, tenant: str) -> int:
        return self.quotas.get(tenant, self.default_quota)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    # -- changing -----------------------------------------------------------------------

    def admit(self, task_id: str, tenant: str, priority: int = 0) -> bool:
        """Ask for a slot: True if ``task_id`` holds one now (it may run), False if queued
        (ahead of its tenant's tasks of lower ``priority``).

        Idempotent: a task already holding a slot gets True again, a queued one stays
        queued once, in its place.
        """
        if task_id in self._running:
            return True
        if task_id in self._queued:
            return False
        if self._may_start_now(tenant):
            self._hold(task_id, tenant)
            self._granted[tenant] += 1
            return True
        self._arrivals += 1
        self._queued[task_id] = (tenant, self._arrivals)
        heapq.heappush(self._queues.setdefault(tenant, []), (-priority, self._arrivals, task_id))
        self._tenant_queued[tenant] += 1
        self._room_changed()
        return False

    def occupy(self, task_id: str, tenant: str) -> None:
        """Count ``task_id`` as running without asking (it runs already); may exceed the cap."""
        if task_id in self._running:
            return
        self._unqueue(task_id)
        self._hold(task_id, tenant)

    def release(self, task_id: str) -> list[tuple[str, str]]:
        """Free ``task_id``'s slot (or its place in the queue; nothing if it had neither),
        then grant free slots. Returns the ``(task_id, tenant)`` pairs granted: the caller
        starts them, and each holds its slot until it is released in turn."""
        tenant = self._running.pop(task_id, None)
        if tenant is not None:
            self._drop_running(tenant)
        else:
            self._unqueue(task_id)
        return self.grant()

    def grant(self) -> list[tuple[str, str]]:
        """Grant free slots to queued tasks, fairest first; returns the pairs granted.

        :meth:`release` does this itself; call it after :meth:`forget` (which frees slots
        but grants nothing) or after changing quotas or weights.
        """
        granted: list[tuple[str, str]] = []
        while len(self._running) < self.max_running:
            tenant = self._fair_pick()
            if tenant is None:
                break
            _, _, task_id = heapq.heappop(self._queues[tenant])  # _fair_pick left a live head
            self._unqueue(task_id)
            self._hold(task_id, tenant)
            self._granted[tenant] += 1
            granted.append((task_id, tenant))
        return granted

    def forget(self, predicate: Callable[[str], bool]) -> list[str]:
        """Drop every queued or running task whose id matches ``predicate`` (their partition
        moved to another node); returns their ids. Grants nothing: see :meth:`grant`."""
        dropped = [t for t in self._running if predicate(t)]
        for task_id in dropped:
            self._drop_running(self._running.pop(task_id))
        unqueued = [t for t in self._queued if predicate(t)]
        for task_id in unqueued:
            self._unqueue(task_id)
        for tenant in list(self._queues):
            self._compact(tenant, force=True)
        return dropped + unqueued

    # -- inside -------------------------------------------------------------------------

    def _may_start_now(self, tenant: str) -> bool:
        """Room, quota, and no queued task that fairness would pick before this one."""
        if len(self._running) >= self.max_running:
            return False
        if self._tenant_running[tenant] >= self.quota(tenant):
            return False
        if not self._queued:
            return True
        if self._tenant_queued[tenant]:
            return False  # its own earlier tasks go first
        share = self._tenant_running[tenant] / self.weight(tenant)
        # The new task is the newest arrival: on equal shares the queued tenant wins.
        return all(share < self._tenant_running[other] / self.weight(other)
                   for other in self._eligible())

    def _fair_pick(self) -> str | None:
        best: tuple[float, int] | None = None
        pick = None
        for tenant in self._eligible():
            key = (self._tenant_running[tenant] / self.weight(tenant), self._head(tenant))
            if best is None or key < best:
                best, pick = key, tenant
        return pick

    def _eligible(self) -> list[str]:
        """Tenants with queued tasks and room under their quota."""
        return [t for t, n in self._tenant_queued.items()
                if n > 0 and self._tenant_running[t] < self.quota(t)]

    def _head(self, tenant: str) -> int:
        """Arrival of the tenant's next live queued task, its most urgent (dead entries are
        dropped here)."""
        queue = self._queues[tenant]
        while queue:
            _, arrival, task_id = queue[0]
            if self._queued.get(task_id) == (tenant, arrival):
                return arrival
            heapq.heappop(queue)
        raise AssertionError(f"tenant {tenant} counted queued tasks it does not hold")

    def _hold(self, task_id: str, tenant: str) -> None:
        self._running[task_id] = tenant
        self._tenant_running[tenant] += 1

    def _drop_running(self, tenant: str) -> None:
        self._tenant_running[tenant] -= 1
        if self._tenant_running[tenant] <= 0:
            del self._tenant_running[tenant]

    def _unqueue(self, task_id: str) -> None:
        entry = self._queued.pop(task_id, None)
        if entry is None:
            return
        tenant = entry[0]
        self._tenant_queued[tenant] -= 1
        if self._tenant_queued[tenant] <= 0:
            del self._tenant_queued[tenant]
        self._compact(tenant)
        self._room_changed()

    def _compact(self, tenant: str, force: bool = False) -> None:
        """Rebuild the tenant's queue without dead entries once they outnumber live ones."""
        queue = self._queues.get(tenant)
        if queue is None:
            return
        live = self._tenant_queued[tenant]
        if live == 0:
            del self._queues[tenant]
        elif force or len(queue) > 2 * live + 32:
            kept = [e for e in queue if self._queued.get(e[2]) == (tenant, e[1])]
            heapq.heapify(kept)
            self._queues[tenant] = kept

    def _room_changed(self) -> None:
        if self.has_room():
            self._room.set()
        else:
            self._room.clear()
