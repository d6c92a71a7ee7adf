"""Priorities: a submission carries ``priority`` (0 to 9); within a tenant's share the
fair scheduler admits higher priorities first, first in first out among equals; a
priority never takes another tenant's share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import ratchet
from ratchet.protocol.catalogue import MessageType
from ratchet.supervisors.supervision.scheduler import FairScheduler
from tests.conftest import NodeFactory, wait_terminal


def test_within_a_tenant_higher_priorities_are_granted_first_then_first_in_first_out() -> None:
    sched = FairScheduler(max_running=1)
    assert sched.admit("a0", "acme")
    assert not sched.admit("low1", "acme", priority=0)
    assert not sched.admit("mid", "acme", priority=5)
    assert not sched.admit("low2", "acme")
    assert not sched.admit("high1", "acme", priority=9)
    assert not sched.admit("high2", "acme", priority=9)
    order = []
    running = "a0"
    while True:
        granted = sched.release(running)
        if not granted:
            break
        [(running, _)] = granted
        order.append(running)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


def test_a_priority_does_not_take_another_tenants_share() -> None:
    sched = FairScheduler(max_running=2)
    assert sched.admit("a1", "acme") and sched.admit("b1", "globex")
    assert not sched.admit("b-low", "globex", priority=0)
    assert not sched.admit("a-urgent", "acme", priority=9)
    assert not sched.admit("a-urgent2", "acme", priority=9)
    # globex's slot frees: it is globex's share, so its own low task runs, not acme's urgent.
    assert sched.release("b1") == [("b-low", "globex")]
    assert sched.release("a1") == [("a-urgent", "acme")]


def test_a_queued_task_removed_from_a_priority_queue_is_never_granted() -> None:
    sched = FairScheduler(max_running=1)
    assert sched.admit("run", "acme")
    for i in range(40):
        assert not sched.admit(f"t{i}", "acme", priority=i % 10)
    for i in range(0, 40, 2):
        sched.release(f"t{i}")  # dropped while queued (lazily, then compacted)
    order = []
    running = "run"
    while granted := sched.release(running):
        [(running, _)] = granted
        order.append(running)
    expected = sorted((f"t{i}" for i in range(1, 40, 2)),
                      key=lambda t: (-(int(t[1:]) % 10), int(t[1:])))
    assert order == expected


GATE = asyncio.Event()
STARTED: list[str] = []


def prioritised_app() -> ratchet.Registry:
    gate = ratchet.Workflow("gate")

    @gate.step
    async def hold(ctx: ratchet.StepContext) -> dict[str, Any]:
        STARTED.append("gate")
        await GATE.wait()
        return {}

    job = ratchet.Workflow("job")

    @job.step
    async def work(ctx: ratchet.StepContext) -> dict[str, Any]:
        STARTED.append(ctx.input["name"])
        return {}

    return ratchet.Registry([gate, job])


async def until(condition: Callable[[], bool]) -> None:
    """Poll in-process state (bounded): the node runs in this event loop."""
    async with asyncio.timeout(15):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)  # polling the node's state, not waiting on a timer


async def test_a_node_with_one_slot_runs_the_high_priority_submission_before_earlier_low_ones(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    GATE.clear()
    STARTED.clear()
    node = await start_node(prioritised_app(), max_running=1)
    gate_id = (await client.submit("gate", {}, key="gate")).task_id
    await until(lambda: STARTED == ["gate"])  # the gate holds the one slot
    ids = []
    for queued, (name, priority) in enumerate((("low1", 0), ("low2", 0), ("high", 9)), 1):
        ids.append((await client.submit("job", {"name": name}, key=name,
                                        priority=priority)).task_id)
        # Queued one by one: mail of different tasks may arrive in any order.
        await until(lambda n=queued: node.scheduler is not None  # type: ignore[misc]
                    and node.scheduler.queued == n)
    GATE.set()
    for task_id in [gate_id, *ids]:
        assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    assert STARTED == ["gate", "high", "low1", "low2"]


async def test_a_priority_outside_zero_to_nine_is_refused_as_invalid(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    body = {"workflow": "three", "idempotency_key": "p10", "input": {}, "priority": 10}
    with pytest.raises(ratchet.RemoteError) as refused:
        await client.request("submit", MessageType.TASK_SUBMIT, body)
    assert refused.value.code == "INVALID_ARGUMENT"
    ok = await client.request("submit", MessageType.TASK_SUBMIT, {**body, "priority": 9})
    assert ok["created"] is True
