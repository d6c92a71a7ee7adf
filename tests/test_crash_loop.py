"""The crash-loop guard: a task recovered too often within a window goes to a human, who
resumes it (approve) or ends it (reject)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog

import ratchet
from ratchet.actors.task.actor import TaskDeps
from ratchet.actors.task.crash_loop import RECOVERY_NODE, crash_loop, record_recovery
from ratchet.actors.task.deps import NoHooks
from ratchet.protocol.clock import FakeClock
from tests.apps import RUNS
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal
from tests.test_admin import APPROVER, admin

# -- the policy, a pure function over the recent history ---------------------------------


def _event(kind: str, at: float, **payload: Any) -> dict[str, Any]:
    return {"type": kind, "sequence": int(at), "occurred_at": at, "payload": payload}


def test_recoveries_up_to_the_limit_go_on() -> None:
    history = [_event("task.recovered", t) for t in (1, 2, 3)]
    assert crash_loop(history, max_recoveries=3) is None


def test_one_recovery_past_the_limit_is_a_crash_loop_with_its_evidence() -> None:
    history = [_event("task.recovered", 1), _event("step.failed", 2, step="s1"),
               _event("task.recovered", 3), _event("task.recovered", 4)]
    loop = crash_loop(history, max_recoveries=2)
    assert loop is not None
    recoveries, failures = loop
    assert [e["occurred_at"] for e in recoveries] == [1, 3, 4]
    assert [e["payload"]["step"] for e in failures] == ["s1"]


def test_the_count_starts_afresh_after_the_latest_stop() -> None:
    history = [_event("task.recovered", 1), _event("task.recovered", 2),
               _event("step.failed", 2.5), _event("task.recovery_stopped", 3),
               _event("task.recovered", 4)]
    assert crash_loop(history, max_recoveries=1) is None
    loop = crash_loop([*history, _event("task.recovered", 5)], max_recoveries=1)
    assert loop is not None
    assert [e["occurred_at"] for e in loop[0]] == [4, 5] and loop[1] == []


def test_no_recoveries_allowed_sends_the_first_one_to_a_human() -> None:
    assert crash_loop([_event("task.recovered", 1)], max_recoveries=0) is not None


@pytest.mark.parametrize(("field_name", "value"), [("max_recoveries", -1),
                                                   ("recovery_window", 0.0)])
def test_task_deps_refuse_a_guard_that_cannot_work(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=field_name):
        TaskDeps(None, None, None, "n", **{field_name: value})  # type: ignore[arg-type]


# -- what a recovery records (an in-memory actor and store) --------------------------------


@dataclass
class _Store:
    history: list[dict[str, Any]] = field(default_factory=list)

    async def checkpoint_names(self, task_id: str) -> list[str]:
        return ["s0", "s1"]

    async def recent_events(self, task_id: str, types: tuple[str, ...],
                            since: float) -> list[dict[str, Any]]:
        return [e for e in self.history if e["type"] in types and e["occurred_at"] >= since]


@dataclass
class _Record:
    last_checkpoint: int = 2


class _Notes(NoHooks):
    """The node's recovery evidence, as a test function."""

    def __init__(self, note: Any) -> None:
        self.note = note

    def recovery_note(self, task_id: str) -> dict[str, Any] | None:
        return self.note(task_id)  # type: ignore[no-any-return]


class _Actor:
    """What :func:`record_recovery` uses of a TaskActor."""

    def __init__(self, note: Any, restarts: int = 0) -> None:
        self.task_id, self.restarts, self.next_step, self.current = "tsk_1", restarts, 2, "s2"
        self.record = _Record()
        self.deps = TaskDeps(_Store(), None, FakeClock(), "node-a",  # type: ignore[arg-type]
                             hooks=_Notes(note))
        self.commits: list[dict[str, Any]] = []
        self.log = structlog.get_logger("test")

    async def commit(self, **kwargs: Any) -> None:
        self.commits.append(kwargs)


async def _recovered(actor: _Actor, reason: str) -> dict[str, Any]:
    assert await record_recovery(actor, reason)  # type: ignore[arg-type]
    [commit] = actor.commits
    [(kind, payload)] = commit["events"]
    assert kind == "task.recovered"
    return dict(payload)


async def test_a_recovery_names_the_node_and_merges_the_nodes_note() -> None:
    def note(task_id: str) -> dict[str, Any]:
        return {"reason": "node_failover", "previous_owner": "node-b", "task": task_id}

    payload = await _recovered(_Actor(note), "node_recovery")
    assert payload["reason"] == "node_failover" and payload["previous_owner"] == "node-b"
    assert payload["node"] == "node-a" and payload["task"] == "tsk_1"
    assert payload["from_checkpoint"] == 2 and payload["steps_skipped"] == ["s0", "s1"]


async def test_no_note_is_fine_and_a_failing_note_is_ignored() -> None:
    def broken(task_id: str) -> dict[str, Any]:
        raise RuntimeError("lease table unavailable")

    assert (await _recovered(_Actor(lambda _: None), "node_recovery"))["reason"] == \
        "node_recovery"
    assert (await _recovered(_Actor(broken), "node_recovery"))["reason"] == "node_recovery"


async def test_an_actor_restarted_by_its_supervisor_is_not_described_by_the_node() -> None:
    def note(task_id: str) -> dict[str, Any]:
        raise AssertionError("not called for an actor restart")

    payload = await _recovered(_Actor(note, restarts=1), "actor_restart")
    assert payload["reason"] == "actor_restart" and payload["restarts"] == 1


# -- on real nodes, restarted around a running task -----------------------------------------


async def _a_step_after(client: ratchet.Client, task_id: str, recoveries: int) -> None:
    """Wait until the task commits a step after its ``recoveries``-th recovery."""

    async def watch() -> None:
        seen = 0
        async for event in client.watch(task_id):
            seen += event.type == "task.recovered"
            if event.type == "step.completed" and seen >= recoveries:
                return

    await asyncio.wait_for(watch(), 30)


#: Short leases: a node that died is reaped within a second.
QUICK_LEASES: dict[str, Any] = {"lease_ttl": 0.6, "lease_interval": 0.1}


async def _die(node: ratchet.Node) -> None:
    """The node goes away as after a crash: its leases are not released (the next node
    reaps them once they expire), its task stays RUNNING in the store, stopped between two
    steps so that none runs twice (which other tests cover). (A clean stop hands
    the partitions over, which the guard does not count.)"""
    assert node.leases is not None and node.tasks is not None
    await node.tasks.stop_tasks(await node.tasks.live_tasks())  # at a safe point
    node.leases.held.clear()  # nothing to release: as if the process had died
    await node.stop()


async def _recover_until_stopped(start_node: NodeFactory, client: ratchet.Client, key: str,
                                 restarts: int, limit: int) -> tuple[ratchet.Node, str]:
    """Run a task, stopping its node mid-task and starting another ``restarts`` times (each
    guarding tasks with ``max_recoveries=limit``); the last start makes the crash loop."""
    node = await start_node(node_id="node-0", max_recoveries=limit, **QUICK_LEASES)
    task_id = (await client.submit("twenty", {"sleep": 0.05}, key=key)).task_id
    for n in range(1, restarts + 1):
        await _a_step_after(client, task_id, n - 1)
        await _die(node)
        node = await start_node(node_id=f"node-{n}", max_recoveries=limit, **QUICK_LEASES)
    async for event in client.watch(task_id):
        if event.type == "task.recovery_stopped":
            break
    return node, task_id


async def test_a_task_recovered_too_often_goes_to_a_human_and_approve_resumes_it(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node, task_id = await _recover_until_stopped(start_node, client, "loop", restarts=3,
                                                 limit=2)
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # passivated

    assert node.store is not None
    [handoff] = await node.store.handoffs(task_id)
    package = handoff["package"]
    assert handoff["reason"] == package["why"] == "crash loop: 3 recoveries in 600 s"
    assert package["kind"] == "crash_loop" and package["step_failures"] == []
    recoveries = package["recoveries"]
    assert [r["node"] for r in recoveries] == ["node-1", "node-2", "node-3"]
    assert all(r["reason"] == "node_failover" for r in recoveries)
    checkpoints = [r["from_checkpoint"] for r in recoveries]
    assert checkpoints == sorted(checkpoints) and checkpoints[0] >= 1
    assert all("occurred_at" in r and "next_step" in r for r in recoveries)
    assert package["goal"]["workflow"] == "twenty" and package["timeline"]
    approval = await node.store.approval(package["approval_id"])
    assert approval is not None
    assert approval["status"] == "PENDING" and approval["node"] == RECOVERY_NODE

    ok = await admin(client, "approve", command_id="cl-1", principal=APPROVER, task_id=task_id,
                     args={"approval_id": package["approval_id"],
                           "request_hash": package["request_hash"]})
    assert ok.ok, ok.error
    # The count starts afresh: one more recovery after the approval goes on by itself.
    await _a_step_after(client, task_id, 3)
    await _die(node)
    await start_node(node_id="node-4", max_recoveries=2, **QUICK_LEASES)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert_contiguous(events)
    kinds = [e.type for e in events]
    assert kinds.count("task.recovered") == 4 and kinds.count("task.recovery_stopped") == 1
    stopped = next(e for e in events if e.type == "task.recovery_stopped")
    assert kinds[stopped.sequence - 2] == "task.recovered"  # in the stopping recovery's txn
    assert stopped.payload["recoveries"] == 3 and stopped.payload["max_recoveries"] == 2
    assert stopped.payload["node"] == "node-3"
    decided = next(e for e in events if e.type == "approval.decided")
    assert decided.payload["kind"] == "crash_loop" and decided.payload["decision"] == "approve"
    assert decided.payload["decided_by"] == "local-admin"  # the key's, not the payload's
    steps = [f"s{i}" for i in range(20)] + ["finish"]
    assert all(RUNS[f"{task_id}:{s}"] == 1 for s in steps), RUNS  # committed: never again


async def test_reject_ends_a_crash_looping_task_failed(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node, task_id = await _recover_until_stopped(start_node, client, "loop-no", restarts=2,
                                                 limit=1)
    assert node.store is not None
    [handoff] = await node.store.handoffs(task_id)
    approval_id = handoff["package"]["approval_id"]
    no = await admin(client, "reject", command_id="cl-2", principal=APPROVER, task_id=task_id,
                     args={"approval_id": approval_id, "reason": "the input is poison"})
    assert no.ok, no.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "crash loop: a human rejected resuming the task"
    assert events[-2].type == "approval.decided" and events[-2].payload["decision"] == "reject"
    assert (await client.get(task_id)).status == "FAILED"
    again = await admin(client, "approve", command_id="cl-3", principal=APPROVER,
                        task_id=task_id, args={"approval_id": approval_id})
    assert again.error is not None  # one-time, and the task is finished


async def test_a_step_that_keeps_crashing_its_actor_is_stopped_with_its_errors_as_evidence(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    # Past the supervisor's intensity and the step's attempts, only the guard stops it.
    node = await start_node(task_max_restarts=10, max_step_attempts=10, task_backoff_base=0.01,
                            max_recoveries=2)
    task_id = (await client.submit("three", {"always_fail_at": 1}, key="crashy")).task_id
    async for event in client.watch(task_id):
        if event.type == "task.recovery_stopped":
            break
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    assert node.store is not None
    [handoff] = await node.store.handoffs(task_id)
    package = handoff["package"]
    assert [r["reason"] for r in package["recoveries"]] == ["actor_restart"] * 3
    assert [r["restarts"] for r in package["recoveries"]] == [1, 2, 3]
    failures = package["step_failures"]
    assert [f["attempt"] for f in failures] == [1, 2, 3]
    assert {f["step"] for f in failures} == {"s1"}
    assert failures[-1]["error"] == {"type": "RuntimeError", "message": "step 1 always fails"}
    assert RUNS[f"{task_id}:s1"] == 3  # not a fourth time: the guard stopped it first


def test_clean_hand_overs_are_not_counted() -> None:
    history = [_event("task.recovered", t, reason="partition_handover") for t in (1, 2, 3, 4)]
    assert crash_loop(history, max_recoveries=1) is None
    history.append(_event("task.recovered", 5, reason="node_failover"))
    assert crash_loop(history, max_recoveries=1) is None
    loop = crash_loop([*history, _event("task.recovered", 6, reason="node_recovery")],
                      max_recoveries=1)
    assert loop is not None and len(loop[0]) == 2
