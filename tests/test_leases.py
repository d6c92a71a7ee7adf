"""Partition leases and fencing tokens, on a real SQLite file and on a real PostgreSQL
database (two Store objects stand for two processes sharing it), and the lease manager's
share/hand-over rules on a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from ratchet.persistence.leases import LeaseRow, SteadyLeaseClock
from ratchet.persistence.store import Store
from ratchet.persistence.store_select import open_store
from ratchet.persistence.txns import NewTask, TaskChange
from ratchet.protocol.clock import FakeClock
from ratchet.protocol.errors import Fenced, PartitionCountMismatch
from ratchet.protocol.subjects import partition_of
from ratchet.supervisors.node.leases import LeaseHooks, LeaseManager, LeaseSettings

P = 4


@pytest.fixture(params=["sqlite", "postgres"])
def where(tmp_path: Path, request: pytest.FixtureRequest) -> str | Path:
    """The store both processes open: one SQLite file, or one PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return tmp_path / "r.db"


async def _stores(where: str | Path, clock: FakeClock | None = None) -> tuple[Store, Store]:
    """Two stores on one database (two processes), sharing the store's lease time:
    ``clock``'s monotonic time (the host's boot time for a real node)."""
    lease_clock = SteadyLeaseClock((clock or FakeClock(start=0.0)).monotonic)
    a = await open_store(where, lease_clock=lease_clock)
    b = await open_store(where, lease_clock=lease_clock)
    await a.ensure_partitions(P)
    return a, b


async def _task(store: Store, key: str = "k") -> str:
    result = await store.accept_submission(NewTask(
        task_id=f"tsk_{key}", tenant="acme", workflow="w", workflow_version=1,
        idempotency_key=key, request_hash="h", input=b"\x80", steps_total=1, deadline_at=None,
        now=0.0, producer="test", message_id=f"m-{key}",
        start_mail=("ratchet.mail.0.x.task", f"mail-{key}", b"")))
    return result.task_id


class _Fence:
    """A fence that carries whatever token it is told to (a node's view of its lease)."""

    def __init__(self, partition: int, token: int) -> None:
        self.value = (partition, token)

    def token_for(self, task_id: str) -> tuple[int, int]:
        return self.value


async def test_tokens_only_increase_and_a_held_lease_is_not_taken(where: str | Path) -> None:
    store_time = FakeClock(start=100.0)
    a, b = await _stores(where, store_time)
    try:
        first = await a.acquire_lease(0, "node-a", ttl=5.0)
        assert first is not None and first.token == 1
        store_time.advance(1.0)
        assert await b.acquire_lease(0, "node-b", ttl=5.0) is None  # still held
        store_time.advance(3.0)
        assert await a.renew_leases("node-a", {0: 1}, ttl=5.0) == []
        store_time.advance(4.0)
        assert await b.acquire_lease(0, "node-b", ttl=5.0) is None  # renewed to 109
        store_time.advance(1.5)
        taken = await b.acquire_lease(0, "node-b", ttl=5.0)  # expired: reaped
        assert taken == LeaseRow(0, "node-b", 2, 114.5, "node-a", reaped=True, ttl_left=5.0)
        # The old owner cannot renew a lease that moved on: it learns it lost it.
        store_time.advance(0.5)
        assert await a.renew_leases("node-a", {0: 1}, ttl=5.0) == [0]
        await b.release_leases("node-b", {0: 2})
        store_time.advance(1.0)
        again = await a.acquire_lease(0, "node-a", ttl=5.0)
        assert again is not None and again.token == 3 and again.previous_owner == "node-b"
        assert not again.reaped  # handed over, not taken from the dead
    finally:
        await a.close()
        await b.close()


async def test_a_write_with_an_old_token_is_refused_in_the_store(where: str | Path) -> None:
    """The zombie case: node A's lease was taken over while it was paused; whatever it still
    believes, the store refuses its write (and commits nothing of it)."""
    store_time = FakeClock(start=100.0)
    a, b = await _stores(where, store_time)
    try:
        task_id = await _task(a)
        p = partition_of(task_id, P)
        await a.acquire_lease(p, "node-a", ttl=5.0)
        store_time.advance(1.0)
        a.fence = _Fence(p, 1)
        change = TaskChange(task_id=task_id, expected_version=None, producer="node-a",
                            now=101.0, events=[("note", {"n": 1})])
        await a.apply(change)  # the current token: accepted
        store_time.advance(5.0)
        await b.acquire_lease(p, "node-b", ttl=5.0)  # A's lease expired: token 2
        store_time.advance(0.5)
        a.fence = _Fence(p, 1)  # A wakes up, still holding token 1
        with pytest.raises(Fenced) as refused:
            await a.apply(TaskChange(task_id=task_id, expected_version=None,
                                     producer="node-a", now=106.5, events=[("note", {"n": 2})]))
        assert refused.value.details["current_token"] == 2
        assert a.fenced_refused == 1  # counted for ratchet_fenced_writes_total{where="store"}
        store_time.advance(0.5)
        b.fence = _Fence(p, 2)
        await b.apply(TaskChange(task_id=task_id, expected_version=None, producer="node-b",
                                 now=107.0, events=[("note", {"n": 3})]))
        notes = [e["payload"]["n"] for e in await b.events(task_id) if e["type"] == "note"]
        assert notes == [1, 3]
        # An expired lease refuses writes even before anyone takes it over.
        store_time.advance(93.0)
        with pytest.raises(Fenced):
            await b.apply(TaskChange(task_id=task_id, expected_version=None,
                                     producer="node-b", now=200.0, events=[("note", {})]))
        assert (a.fenced_refused, b.fenced_refused) == (1, 1)
    finally:
        await a.close()
        await b.close()


async def test_the_partition_count_is_fixed_per_store(where: str | Path) -> None:
    a, b = await _stores(where)
    try:
        with pytest.raises(PartitionCountMismatch):
            await b.ensure_partitions(P * 2)
    finally:
        await a.close()
        await b.close()


class _Work:
    def __init__(self) -> None:
        self.acquired: list[int] = []
        self.lost: list[int] = []
        self.handed: list[int] = []

    def hooks(self) -> LeaseHooks:
        async def acquired(rows: list[LeaseRow]) -> None:
            self.acquired += [r.partition for r in rows]

        async def lost(ps: list[int]) -> None:
            self.lost += ps

        async def handing_over(ps: list[int]) -> None:
            self.handed += ps

        return LeaseHooks(acquired=acquired, lost=lost, handing_over=handing_over)


async def _settle(*managers: LeaseManager) -> None:
    """Ticks until nothing moves (hand-overs run in the background of a tick)."""


    for _ in range(6):
        for m in managers:
            await m.tick()
            for task in list(m._background):
                await asyncio.wait_for(task, 5)


async def test_nodes_share_partitions_hand_over_on_drain_and_reap_the_dead(
        where: str | Path) -> None:
    clock = FakeClock(start=1000.0)
    a_store, b_store = await _stores(where, clock)
    work_a, work_b = _Work(), _Work()
    settings = LeaseSettings(ttl=5.0, interval=1.0, safety=0.5)
    a = LeaseManager(a_store, clock, "node-a", P, work_a.hooks(), settings)
    b = LeaseManager(b_store, clock, "node-b", P, work_b.hooks(), settings)
    try:
        await a.start()
        assert sorted(a.held) == [0, 1, 2, 3]  # alone: everything
        await b.start()
        await _settle(a, b)
        assert len(a.held) == 2 and len(b.held) == 2 and not set(a.held) & set(b.held)
        assert sorted(work_a.handed) == sorted(b.held)  # handed over cleanly, not reaped

        task_on_b = next(f"t{i}" for i in range(100) if b.owns(f"t{i}"))
        assert b.token_for(task_on_b)[1] == b.held[partition_of(task_on_b, P)]
        with pytest.raises(Fenced):
            a.token_for(task_on_b)  # not A's partition: A must not write for it

        # Drain B: its partitions go to A, handed over first.
        assert await a_store.set_node_status("node-b", "draining")
        await _settle(b, a)
        assert b.held == {} and sorted(a.held) == [0, 1, 2, 3]
        assert await a_store.set_node_status("node-b", "active")
        await _settle(a, b)
        assert len(b.held) == 2

        # B stops renewing (dead or paused): after the TTL A reaps its partitions, and B's
        # own view refuses writes even before it learns it lost them.
        b_partitions = sorted(b.held)
        clock.advance(4.6)
        with pytest.raises(Fenced):
            b.token_for(task_on_b)  # within the safety margin of its lease's end
        clock.advance(1.0)
        await _settle(a)
        assert sorted(a.held) == [0, 1, 2, 3]
        assert all(p in work_a.acquired for p in b_partitions)
        await b.tick()  # B wakes up: renewal fails, it isolates those partitions
        assert sorted(work_b.lost) == b_partitions
    finally:
        await a_store.close()
        await b_store.close()


async def test_a_second_live_process_under_the_same_node_id_is_refused(
        where: str | Path, monkeypatch: Any) -> None:
    import ratchet.supervisors.node.leases as leases_module

    clock = FakeClock(start=1000.0)
    a_store, b_store = await _stores(where, clock)
    try:
        first = LeaseManager(a_store, clock, "node-x", P, _Work().hooks())
        await first.start()
        monkeypatch.setattr(leases_module.os, "getpid", lambda: 1)  # "another process"
        second = LeaseManager(b_store, clock, "node-x", P, _Work().hooks())
        with pytest.raises(Exception, match="in use by live process"):
            await second.start()
    finally:
        await a_store.close()
        await b_store.close()


async def test_a_read_sees_every_commit_made_before_it_began_even_under_load(
        where: str | Path) -> None:
    """Reads of many actors run at once on the read connection; none may keep it on an old
    snapshot (a restarted actor would load a version its predecessor already moved past)."""


    reader, writer = await _stores(where)
    try:
        task_id = await _task(writer)
        busy = True

        async def crowd() -> None:
            while busy:
                await asyncio.gather(*(reader.load_task(task_id) for _ in range(20)))

        background = asyncio.get_running_loop().create_task(crowd())
        try:
            for i in range(30):
                await writer.apply(TaskChange(task_id=task_id, expected_version=None,
                                              producer="w", now=1.0, events=[("note", {})]))
                assert (await reader.load_task(task_id)).last_event_seq == i + 2
        finally:
            busy = False
            await background
    finally:
        await reader.close()
        await writer.close()


async def _until_asleep(clock: FakeClock, sleepers: int) -> None:
    while clock.sleepers < sleepers:  # noqa: ASYNC110 - yields to the loop; bounded by the caller
        await asyncio.sleep(0)


async def test_renewal_goes_on_while_a_tick_is_stuck_in_its_hooks(where: str | Path) -> None:
    """A tick that hangs (a heartbeat queued behind other writes, a takeover recovering
    hundreds of tasks) must not hold the renewals up: they have a loop of their own, so
    the node keeps its leases and its writes go on."""
    clock = FakeClock(start=1000.0)
    a_store, b_store = await _stores(where, clock)
    stuck, release = asyncio.Event(), asyncio.Event()

    async def each_tick() -> None:
        if stuck.is_set():
            await release.wait()

    hooks = _Work().hooks()
    hooks.each_tick = each_tick
    a = LeaseManager(a_store, clock, "node-a", P, hooks, LeaseSettings(ttl=5.0, interval=1.0))
    serving: asyncio.Task[None] | None = None
    try:
        await a.start()
        task_id = "t0"
        stuck.set()
        serving = asyncio.get_running_loop().create_task(a.serve())
        await asyncio.wait_for(_until_asleep(clock, 2), 5)  # the tick loop and the renewals
        for _ in range(12):  # 12 s: more than twice the TTL, the tick stuck all along
            clock.advance(1.0)
            await asyncio.wait_for(_until_asleep(clock, 1), 5)  # the renewal slept again
        assert a.token_for(task_id)[1] == a.held[partition_of(task_id, P)]  # not Fenced
        assert [row.owner for row in await b_store.leases()] == ["node-a"] * P
    finally:
        release.set()
        if serving is not None:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        await a_store.close()
        await b_store.close()
