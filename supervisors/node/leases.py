"""The lease manager: which partitions this node owns, kept true against the store.

Every ``interval`` (about ttl / 4), in a loop of its own that waits for nothing else, it
renews its leases; a lease it could not renew (another node holds a newer token) is
*lost*: the node refuses its writes at once and isolates that partition (stops consuming its
mail and stops its task actors) right after, in the background. And every ``interval`` a
tick:

1. records the node's heartbeat (liveness plus what it holds and runs) and reads back its
   status — an operator's ``drain`` is seen here;
2. rebalances: its target is an equal share of the partitions among the live, active
   nodes (zero while draining). Above target, it hands partitions over cleanly (stop their
   mail and tasks at a safe point, then release the lease); below target, it acquires free
   or expired leases — that is the reaper: a dead node's leases expire and the survivors
   take them, bumping the fencing token, and recover the tasks from their checkpoints.

Whether a lease ran out, and whether a node is live, is the store's judgement on its own
time (persistence/leases.py); this node's own view of its leases is on its clock's
monotonic time. Its wall clock only labels the heartbeat for people.

What it holds is kept in a :class:`~supervisors.node.held_leases.HeldLeases`, which the store
asks for the token a task's writes carry (the Fence).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from ratchet.actors.core.actor import ServiceActor
from ratchet.persistence.leases import LeaseRow
from ratchet.persistence.ports import LeaseStore
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import ErrorCode, StartRefused
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.node.embedded_nats import pid_alive
from ratchet.supervisors.node.held_leases import HeldLeases

__all__ = ["LeaseManager", "LeaseHooks", "LeaseSettings", "check_start"]

log = structlog.get_logger("ratchet.leases")


@dataclass
class LeaseSettings:
    #: Seconds a lease lasts without renewal; bounds failover (a dead node's partitions
    #: are taken at most ``ttl + interval`` after its last renewal).
    ttl: float = 5.0
    #: Seconds between heartbeats (renewal, rebalancing, reaping).
    interval: float = 1.0
    #: Stop writing this long before the lease's expiry as this node last renewed it. Not
    #: needed for safety — a write that commits after another node took the partition
    #: carries an old token and is refused by the store — so 0 by default.
    safety: float = 0.0


async def _nothing() -> None:
    return None


@dataclass
class LeaseHooks:
    """What the node does when partitions come and go (run under the tick lock, one after
    another: in the tick, or after a renewal, in the background)."""

    acquired: Callable[[list[LeaseRow]], Awaitable[None]]
    #: Lost without warning: isolate now (the store already refuses the writes).
    lost: Callable[[list[int]], Awaitable[None]]
    #: About to be released on purpose: stop at a safe point first.
    handing_over: Callable[[list[int]], Awaitable[None]]
    #: Renewed late but still ours: restart the tasks whose writes were refused meanwhile.
    resumed: Callable[[list[int]], Awaitable[Any]] = field(default=lambda ps: _nothing())
    #: Extra liveness and progress for the heartbeat row (live tasks, in-flight, ...).
    info: Callable[[], dict[str, Any]] = field(default=lambda: {})
    #: Run every tick after the heartbeat (e.g. reload the kill switches other nodes set).
    each_tick: Callable[[], Awaitable[None]] | None = None


def _pid_alive(pid: Any) -> bool:
    return isinstance(pid, int) and pid_alive(pid)


async def check_start(store: LeaseStore, node_id: str, partitions: int, ttl: float) -> None:
    """Whether this node may start on the store: run before it starts anything else, so a
    refused start costs nothing to undo, and again as the lease manager starts.

    Raises:
        PartitionCountMismatch: the store has another number of partitions.
        StartRefused: NODE_ID_IN_USE, a live process on this host runs under ``node_id``
            (a ``nodes`` row not stopped, with a fresh heartbeat, whose pid is alive and
            not ours).
    """
    await store.ensure_partitions(partitions)
    for row in await store.nodes():
        pid = row.info.get("pid")
        if row.node_id == node_id and row.status != "stopped" and pid != os.getpid() \
                and row.age < ttl and _pid_alive(pid):
            raise StartRefused(ErrorCode.NODE_ID_IN_USE,
                               f"node id {node_id} is in use by live process {pid} (a node"
                               " already serving this state dir); a second node needs its own"
                               " --node-id", node=node_id, pid=pid)


class LeaseManager(ServiceActor):
    def __init__(self, store: LeaseStore, clock: Clock, node_id: str, partitions: int,
                 hooks: LeaseHooks, settings: LeaseSettings | None = None,
                 holding: HeldLeases | None = None) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.partitions = partitions
        self.hooks = hooks
        self.settings = settings or LeaseSettings()
        self.holding = holding or HeldLeases(node_id, partitions, clock, self.settings.safety)
        self.status = "active"
        self._tick_lock = asyncio.Lock()
        #: Held around each renewal and release: the two never interleave in the store.
        self._renew_lock = asyncio.Lock()
        self._handing_over: set[int] = set()
        #: Hand-overs and the hooks of renewals, running in the background.
        self._background: set[asyncio.Task[None]] = set()
        self._rng = random.Random()
        self._reclaim = False
        #: Set when the node begins a clean stop: ticks only renew from then on.
        self.stopping = False
        #: Monotonic time of the last heartbeat the store recorded (None: none yet).
        self.last_heartbeat: float | None = None

    # -- what the node reads (HeldLeases) ---------------------------------------------------

    @property
    def held(self) -> dict[int, int]:
        return self.holding.held

    @property
    def fenced_writes(self) -> int:
        return self.holding.fenced_writes

    def token_for(self, task_id: str) -> tuple[int, int]:
        return self.holding.token_for(task_id)

    def owns(self, task_id: str) -> bool:
        return self.holding.owns(task_id)

    async def lease_of(self, task_id: str) -> LeaseRow | None:
        """The store's lease row of the task's partition (who owns it, whatever we think)."""
        return await self.store.lease(partition_of(task_id, self.partitions))

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Register the node and take a first share (before the node recovers tasks).

        Raises:
            StartRefused: NODE_ID_IN_USE, another live process on this host runs under the
                same node id.
            PartitionCountMismatch: the store has another number of partitions.
        """
        await check_start(self.store, self.node_id, self.partitions, self.settings.ttl)
        await self.store.node_heartbeat(self.node_id, self.clock.now(), self._info(),
                                        starting=True)
        self._reclaim = True
        try:
            await self.tick()
        finally:
            self._reclaim = False

    async def serve(self) -> None:
        # Renewal has a loop of its own: nothing a tick does (a heartbeat queued behind
        # other writes, acquiring partitions and recovering their tasks) may delay it past
        # the TTL — a renewal that waited for the tasks a late renewal resumed made the next
        # one late too, and a loaded node's leases lapsed over and over.
        renewing = asyncio.get_running_loop().create_task(self._renew_loop())
        try:
            while True:
                await self.clock.sleep(self.settings.interval)
                try:
                    await self.tick(renew=False)
                except Exception as exc:  # the store is unreachable: retried next tick
                    log.error("lease tick failed", error=repr(exc))
        finally:
            renewing.cancel()

    async def _renew_loop(self) -> None:
        while True:
            await self.clock.sleep(self.settings.interval)
            try:
                await self._renew(defer_hooks=True)
            except Exception as exc:  # the store is unreachable: leases lapse, writes stop
                log.error("lease renewal failed", error=repr(exc))
                self._later(self._expire_overdue)

    async def tick(self, *, renew: bool = True) -> None:
        """Renew (unless the renewal loop does), heartbeat, rebalance; the hooks of what
        changed are awaited here, under the tick lock, one change after another."""
        async with self._tick_lock:
            if renew:  # first: on a loaded node nothing else may delay it
                await self._renew()
            if self.stopping:
                return  # shutting down: keep what we hold until release_all, take nothing
            self.status = await self.store.node_heartbeat(self.node_id, self.clock.now(),
                                                          self._info())
            self.last_heartbeat = self.clock.monotonic()  # the store took a write: /readyz
            if self.hooks.each_tick is not None:
                await self.hooks.each_tick()
            await self._rebalance()

    async def release_all(self) -> None:
        """Clean shutdown: hand every partition over (the caller stopped the tasks)."""
        self.stopping = True
        try:  # a tick still running is waited for, but not for ever
            await asyncio.wait_for(self._tick_lock.acquire(), timeout=10.0)
        except TimeoutError:
            log.warning("lease tick still running at stop; releasing anyway")
        else:
            self._tick_lock.release()
        for task in list(self._background):
            task.cancel()
        async with self._renew_lock:
            held = self.holding.release_all()
            if held:
                await self.store.release_leases(self.node_id, held)
                log.info("leases released", partitions=sorted(held))
        await self.store.set_node_status(self.node_id, "stopped")

    # -- internals ------------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "partitions": sorted(self.held),
                "fenced_writes": self.fenced_writes,
                **self.hooks.info()}

    async def _renew(self, *, defer_hooks: bool = False) -> None:
        """Renew what is held; the hooks of partitions resumed or lost run after, awaited
        (a tick) or under the tick lock in the background (the renewal loop)."""
        async with self._renew_lock:
            held = dict(self.held)
            if not held:
                return
            # Read before the renewal: the store's expiry is at least this far ahead.
            since = self.clock.monotonic()
            lost = await self.store.renew_leases(self.node_id, held, self.settings.ttl)
            took = self.clock.monotonic() - since
            if took > self.settings.ttl / 3:  # an operator's early sign of lapses to come
                log.warning("lease renewal slow", seconds=round(took, 3),
                            ttl=self.settings.ttl)
            for partition in held:
                if partition not in lost and partition in self.held:
                    self.holding.valid_until[partition] = since + self.settings.ttl
            resumed = sorted(p for p in self.holding.lapsed
                             if p in held and p in self.held and p not in lost)
            self.holding.lapsed.difference_update(held)
            if lost:
                log.error("leases lost: another node holds them now; isolating",
                          partitions=lost)
                self._drop(lost)  # writes refused from now on; the hook isolates
        if resumed:
            # Renewal came late, but nobody took the partitions: the tasks whose writes were
            # refused meanwhile stopped; start them again from their checkpoints.
            log.warning("leases renewed late; resuming their tasks", partitions=resumed)
        if defer_hooks:
            self._later(lambda: self._changed(resumed, lost))
        else:
            await self._changed(resumed, lost)

    async def _changed(self, resumed: list[int], lost: list[int]) -> None:
        if resumed:
            await self.hooks.resumed(resumed)
        if lost:
            await self.hooks.lost(lost)

    def _later(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work()`` under the tick lock, in the background (in order with the ticks'
        own hooks). Made there, not here: a task cancelled before it got the lock (a stop)
        leaves no coroutine never awaited."""
        async def locked() -> None:
            async with self._tick_lock:
                await work()

        self._in_background(locked())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """A task kept until done, cancelled at stop."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire_overdue(self) -> None:
        now = self.clock.monotonic()
        overdue = [p for p in self.held if now >= self.holding.valid_until.get(p, 0.0)]
        if overdue:
            log.error("leases expired without renewal; isolating", partitions=overdue)
            self._drop(overdue)
            await self.hooks.lost(overdue)

    def _drop(self, partitions: list[int]) -> None:
        self.holding.drop(partitions)

    async def _target(self) -> int:
        if self.status != "active":
            return 0  # draining (or told to stop): hand everything over
        live = {n.node_id for n in await self.store.nodes()
                if n.status == "active" and n.age < self.settings.ttl}
        live.add(self.node_id)  # this node counts even if its heartbeat row lags
        return math.ceil(self.partitions / len(live))

    async def _rebalance(self) -> None:
        target = await self._target()
        keeping = len(self.held) - len(self._handing_over)
        if keeping > target:
            surplus = sorted(p for p in self.held if p not in self._handing_over)[target:]
            self._handing_over.update(surplus)
            # In the background: stopping tasks at a safe point may take a while, and the
            # ticks must go on renewing (the partitions are still ours until released).
            self._in_background(self._hand_over(surplus, target))
            return
        if keeping >= target or self._handing_over:
            return
        free = [row.partition for row in await self.store.leases()
                if row.partition not in self.held
                and (row.owner is None or row.ttl_left <= 0
                     or (self._reclaim and row.owner == self.node_id))]
        self._rng.shuffle(free)  # nodes racing for free partitions mostly pick different ones
        acquired: list[LeaseRow] = []
        for partition in free[: target - len(self.held)]:
            since = self.clock.monotonic()
            row = await self.store.acquire_lease(partition, self.node_id, self.settings.ttl,
                                                 reclaim=self._reclaim)
            if row is None:
                continue  # another node got there first
            self.holding.take(row, since + self.settings.ttl)
            acquired.append(row)
        if acquired:
            log.info("partitions acquired", partitions=[r.partition for r in acquired],
                     tokens=[r.token for r in acquired],
                     from_owners=[r.previous_owner for r in acquired],
                     reaped=[r.partition for r in acquired if r.reaped])
            await self.hooks.acquired(acquired)

    async def _hand_over(self, partitions: list[int], target: int) -> None:
        try:
            await self.hooks.handing_over(partitions)
            async with self._tick_lock, self._renew_lock:
                released = {p: self.held[p] for p in partitions if p in self.held}
                self._drop(list(released))
                await self.store.release_leases(self.node_id, released)
            log.info("partitions handed over", partitions=sorted(released), target=target,
                     status=self.status)
        except Exception as exc:  # kept (and renewed); the next tick tries again
            log.error("hand-over failed", partitions=partitions, error=repr(exc))
        finally:
            self._handing_over.difference_update(partitions)

    async def on_stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await super().on_stop()
