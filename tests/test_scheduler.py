"""The fair admission scheduler: pure, so tested without a node — completions are
simulated by releasing granted tasks one at a time."""

from __future__ import annotations

import asyncio
from collections import Counter, deque

import pytest

from ratchet.supervisors.supervision.scheduler import FairScheduler


def _complete_oldest(sched: FairScheduler, running: deque[str]) -> list[tuple[str, str]]:
    """Finish the longest-running task; the tasks granted in its place start running."""
    granted = sched.release(running.popleft())
    running.extend(task_id for task_id, _ in granted)
    return granted


def test_a_tenant_flooding_ten_thousand_tasks_does_not_starve_one_with_ten() -> None:
    sched = FairScheduler(max_running=4)
    running: deque[str] = deque()
    for i in range(10_000):
        if sched.admit(f"a{i}", "A"):
            running.append(f"a{i}")
    b_tasks = [f"b{i}" for i in range(10)]
    assert not any(sched.admit(t, "B") for t in b_tasks)  # A fills every slot: B queues
    assert sched.running == 4 and sched.queued == 10_000 - 4 + 10

    granted_at: dict[str, int] = {}
    releases = 0
    while len(granted_at) < len(b_tasks):
        releases += 1
        for task_id, tenant in _complete_oldest(sched, running):
            if tenant == "B":
                granted_at[task_id] = releases
    # The bound: B's i-th task (0-based) is granted within 2 * (i + 1) releases, however
    # many of A's tasks arrived first.
    for i, task_id in enumerate(b_tasks):
        assert granted_at[task_id] <= 2 * (i + 1), (task_id, granted_at)
    assert [t for t in sorted(granted_at, key=granted_at.__getitem__)] == b_tasks  # FIFO


def test_a_new_task_does_not_jump_ahead_of_a_tenant_waiting_longer_on_the_same_share() -> None:
    sched = FairScheduler(max_running=2)
    assert sched.admit("a1", "A") and sched.admit("b1", "B")
    assert not sched.admit("b2", "B")  # full
    assert sched.release("a1") == [("b2", "B")]  # B queued first: it gets the slot
    # Now A runs 0 and B 2; A's next task would win, but the node is full.
    assert not sched.admit("a2", "A")
    assert not sched.admit("b3", "B")
    assert sched.release("b1") == [("a2", "A")]


def test_a_tenant_with_the_smallest_share_is_admitted_directly_past_the_queue() -> None:
    sched = FairScheduler(max_running=3, quotas={"A": 2})
    assert sched.admit("a1", "A") and sched.admit("a2", "A")
    assert not sched.admit("a3", "A")  # A at its quota, though a slot is free
    assert sched.admit("b1", "B")  # B holds nothing and A cannot take the slot
    assert sched.stats()["tenants"]["A"] == {"running": 2, "queued": 1, "granted": 2}


def test_a_tenant_never_runs_more_than_its_quota() -> None:
    sched = FairScheduler(max_running=10, default_quota=3, quotas={"big": 5})
    small = [t for t in (f"s{i}" for i in range(8)) if sched.admit(t, "small")]
    big = [t for t in (f"g{i}" for i in range(8)) if sched.admit(t, "big")]
    assert len(small) == 3 and len(big) == 5
    assert sched.running == 8 and sched.queued == 8
    assert sched.release(small[0]) == [("s3", "small")]  # two slots free, but quotas hold
    assert sched.release("nobody") == []


def test_weights_split_the_slots_three_to_one_under_saturation() -> None:
    sched = FairScheduler(max_running=8, weights={"heavy": 3.0})
    running: deque[str] = deque()
    for i in range(2_000):
        for tenant in ("heavy", "light"):
            if sched.admit(f"{tenant}{i}", tenant):
                running.append(f"{tenant}{i}")
    shares: Counter[str] = Counter()
    for _ in range(800):
        shares.update(tenant for _, tenant in _complete_oldest(sched, running))
    assert sum(shares.values()) == 800  # each completion frees exactly one slot
    assert 2.7 <= shares["heavy"] / shares["light"] <= 3.3, shares
    assert sched.stats()["tenants"]["heavy"]["running"] == 6


def test_admit_is_idempotent_for_running_and_queued_tasks() -> None:
    sched = FairScheduler(max_running=1)
    assert sched.admit("t1", "A") and sched.admit("t1", "A")
    assert not sched.admit("t2", "A") and not sched.admit("t2", "A")
    assert sched.running == 1 and sched.queued == 1
    assert sched.release("t1") == [("t2", "A")]
    assert sched.release("t2") == [] and sched.running == 0 and sched.queued == 0


def test_releasing_a_queued_task_removes_it_from_the_queue_without_granting_it() -> None:
    sched = FairScheduler(max_running=1)
    sched.admit("t1", "A")
    for i in range(2, 6):
        sched.admit(f"t{i}", "A")
    assert sched.release("t3") == []  # t3 never held a slot: none was freed
    assert sched.queued == 3
    assert sched.release("t1") == [("t2", "A")]
    assert sched.release("t2") == [("t4", "A")]  # t3 is gone


def test_releasing_an_unknown_task_changes_nothing() -> None:
    sched = FairScheduler(max_running=2)
    sched.admit("t1", "A")
    assert sched.release("ghost") == []
    assert sched.running == 1 and sched.queued == 0


def test_occupy_counts_a_running_task_past_the_cap_and_blocks_grants_until_under_it() -> None:
    sched = FairScheduler(max_running=2)
    for task_id in ("r1", "r2", "r3"):
        sched.occupy(task_id, "A")
    sched.occupy("r1", "A")  # counted once
    assert sched.running == 3
    assert not sched.admit("b1", "B")
    assert sched.release("r1") == []  # 2 running: still at the cap
    assert sched.release("r2") == [("b1", "B")]


def test_occupy_takes_a_queued_task_out_of_the_queue() -> None:
    sched = FairScheduler(max_running=1)
    sched.admit("t1", "A")
    sched.admit("t2", "A")
    sched.occupy("t2", "A")
    assert sched.queued == 0 and sched.running == 2
    assert sched.admit("t2", "A")


def test_forget_drops_queued_and_running_tasks_of_a_lost_partition() -> None:
    sched = FairScheduler(max_running=2)
    for task_id in ("p1-a", "p2-b", "p1-c", "p2-d", "p1-e"):
        sched.admit(task_id, "A")
    dropped = sched.forget(lambda task_id: task_id.startswith("p1-"))
    assert sorted(dropped) == ["p1-a", "p1-c", "p1-e"]
    assert sched.running == 1 and sched.queued == 1
    assert sched.grant() == [("p2-d", "A")]  # forget frees slots; grant fills them
    assert sched.release("p1-c") == []  # forgotten: unknown now


def test_a_bad_limit_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="max_running"):
        FairScheduler(max_running=0)
    with pytest.raises(ValueError, match="weight of tenant 'x'"):
        FairScheduler(weights={"x": 0.0})
    with pytest.raises(ValueError, match="quota of tenant 'y'"):
        FairScheduler(quotas={"y": 0})


def test_has_room_reflects_the_queue_limit() -> None:
    sched = FairScheduler(max_running=1, max_queued=2)
    sched.admit("t1", "A")
    sched.admit("t2", "A")
    assert sched.has_room()
    sched.admit("t3", "A")
    assert not sched.has_room()
    sched.release("t1")  # t2 runs: one queued
    assert sched.has_room()


async def test_wait_for_room_returns_when_a_release_shortens_the_queue() -> None:
    sched = FairScheduler(max_running=1, max_queued=1)
    sched.admit("t1", "A")
    sched.admit("t2", "A")
    assert not sched.has_room()
    waiter = asyncio.create_task(sched.wait_for_room(timeout=5.0))
    await asyncio.sleep(0)  # let it start waiting
    assert not waiter.done()
    sched.release("t1")
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_wait_for_room_gives_up_after_its_timeout() -> None:
    sched = FairScheduler(max_running=1, max_queued=1)
    sched.admit("t1", "A")
    sched.admit("t2", "A")
    assert await sched.wait_for_room(timeout=0.01) is False
    assert await FairScheduler().wait_for_room() is True  # room already: no wait
