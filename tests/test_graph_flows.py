"""Each flow structure end to end through NATS: conditional edges, routing tables,
fan-out/fan-in with every join policy, approvals (with escalation on the fake clock) and
external waits."""

from __future__ import annotations

import asyncio
from typing import Any

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import decision_subject, external_subject, mail_subject
from tests.conftest import NodeFactory, assert_contiguous
from tests.graph_apps import app
from tests.keys import publish_sealed

PARKED = {"approval.requested", "wait.started"}
DONE = {"task.succeeded", "task.failed", "task.cancelled"}


async def run_until(client: ratchet.Client, task_id: str, stop: set[str], after: int = 0,
                    timeout: float = 20.0) -> list[ratchet.Event]:
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, after=after, follow_terminal=True):
            events.append(event)
            if event.type in stop:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def submit(client: ratchet.Client, workflow: str, input: dict[str, Any], key: str,
                 stop: set[str] = DONE) -> tuple[str, list[ratchet.Event]]:
    task_id = (await client.submit(workflow, input, key=key)).task_id
    return task_id, await run_until(client, task_id, stop)


def types(events: list[ratchet.Event]) -> list[str]:
    return [e.type for e in events]


async def test_a_conditional_edge_takes_the_target_its_guard_picks(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, small = await submit(client, "choice", {"amount": 20}, "small")
    _, large = await submit(client, "choice", {"amount": 500}, "large")
    assert small[-1].payload["output"] == {"path": "auto"}
    assert large[-1].payload["output"] == {"path": "manual"}
    edge = next(e for e in large if e.type == "edge.taken")
    assert edge.payload == {"node": "size", "to": "manual"}
    assert_contiguous(large)


async def test_a_guard_choosing_an_undeclared_target_fails_the_task_not_jumps(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, events = await submit(client, "rogue", {}, "rogue")
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "guard chose an undeclared target"
    assert events[-1].payload["error"]["code"] == "ILLEGAL_TRANSITION"
    assert "step.completed" not in types(events)


async def test_a_routing_table_routes_by_key_and_falls_back_to_its_default(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    for region, desk, default_used in (("eu", "eu", False), ("us", "us", False),
                                       ("mars", "elsewhere", True)):
        _, events = await submit(client, "route", {"region": region}, f"r-{region}")
        taken = next(e for e in events if e.type == "route.taken")
        assert (taken.payload["to"], taken.payload["default_used"]) == (desk, default_used)
        assert events[-1].payload["output"] == {"desk": desk}


async def test_a_loop_runs_within_its_declared_bound(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, ok = await submit(client, "loop", {}, "loop-ok")
    assert ok[-1].payload["output"] == {"tries": 2}
    assert types(ok).count("edge.taken") == 2


async def test_fanout_all_joins_every_branch_result(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, events = await submit(client, "fan.all", {}, "all")
    assert events[-1].type == "task.succeeded"
    joined = events[-1].payload["output"]["joined"]
    assert joined == {b: {"branch": b, "seen": b.upper()} for b in "abc"}
    join = next(e for e in events if e.type == "join.completed")
    assert join.payload["succeeded"] == ["a", "b", "c"] and join.payload["ok"] is True
    assert types(events).count("branch.completed") == 3
    assert_contiguous(events)


async def test_fanout_all_fails_when_a_branch_raises_and_says_which(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, events = await submit(client, "fan.all", {"fail": ["b"]}, "all-bad")
    assert events[-1].type == "task.failed"
    failed = next(e for e in events if e.type == "join.failed")
    assert failed.payload["failed"] == ["b"]
    branch = next(e for e in events if e.type == "branch.failed")
    assert branch.payload["error"]["message"] == "branch b breaks"


async def test_k_of_n_completes_without_waiting_for_a_branch_that_never_finishes(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id, events = await submit(client, "fan.k", {"hang": ["c"]}, "k")
    assert events[-1].type == "task.succeeded"
    join = next(e for e in events if e.type == "join.completed")
    assert join.payload["succeeded"] == ["a", "b"] and join.payload["cancelled"] == ["c"]
    rows = await node.store.branches(task_id, "spread#0")  # type: ignore[union-attr]
    assert rows["c"]["status"] == "CANCELLED"
    assert node.system.lookup(f"node/tasks/{task_id}/branch:spread#0:c") is None


async def test_a_required_subset_succeeds_despite_a_failing_optional_branch(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    _, events = await submit(client, "fan.required", {"fail": ["b"]}, "req")
    assert events[-1].type == "task.succeeded"
    assert set(events[-1].payload["output"]["joined"]) == {"a", "c"}
    _, bad = await submit(client, "fan.required", {"fail": ["a"]}, "req-bad")
    assert bad[-1].type == "task.failed"


async def test_a_join_timeout_degrades_missing_branches_to_their_defaults(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    await start_node(app, clock=clock)
    task_id = (await client.submit("fan.degrade", {"hang": ["c"], "fail": ["b"]}, key="deg")).task_id
    await until_settled(client, task_id, 2)
    clock.advance(10.0)  # the join's 10 s timeout, without waiting 10 s
    events = await run_until(client, task_id, DONE)
    join = next(e for e in events if e.type == "join.completed")
    assert join.payload["degraded"] == ["b", "c"] and join.payload["failed"] == ["b"]
    assert join.payload["timed_out"] == ["c"]
    assert events[-1].payload["output"]["joined"] == {
        "a": {"branch": "a", "seen": "A"}, "b": "B?", "c": "C?"}


async def test_each_branch_has_its_own_time_budget(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    await start_node(app, clock=clock)
    task_id = (await client.submit("fan.budget", {"hang": ["c"]}, key="budget")).task_id
    await until_settled(client, task_id, 2)
    clock.advance(5.0)  # c's 5 s budget runs out; a and b are untouched
    events = await run_until(client, task_id, DONE)
    assert events[-1].type == "task.succeeded"
    timed_out = next(e for e in events if e.type == "branch.timed_out")
    assert timed_out.payload["branch"] == "c"


async def test_duplicate_and_forged_branch_notifications_leave_the_join_correct(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id = (await client.submit("fan.k", {"hang": ["c"], "slow": {"b": 0.3}}, key="dup")).task_id
    await run_until(client, task_id, {"branch.completed"})  # a is done; b is still working
    for branch, status in (("a", "SUCCEEDED"), ("a", "SUCCEEDED"),  # repeats
                           ("c", "SUCCEEDED"), ("b", "FAILED")):  # claims the store denies
        env = Envelope(type="branch.done", message_id=f"fake-{branch}-{status}",
                       correlation_id="x", body={"key": "spread#0", "node": "spread",
                                                 "branch": branch, "status": status})
        # Sealed as a node's (unsealed mail never reaches the task: test_trust_internal).
        await publish_sealed(client, node, mail_subject(task_id, "task"), encode(env))
    events = await run_until(client, task_id, DONE)
    joins = [e for e in events if e.type in ("join.completed", "join.failed")]
    assert len(joins) == 1 and joins[0].type == "join.completed"
    # Had the forged "c succeeded" counted, the join would have closed on a and c.
    assert joins[0].payload["succeeded"] == ["a", "b"]
    assert joins[0].payload["cancelled"] == ["c"]
    assert events[-1].type == "task.succeeded"


async def test_an_approval_escalates_on_timeout_then_proceeds_on_a_decision(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(app, clock=clock)
    task_id, events = await submit(client, "approve", {"amount": 900}, "apr", PARKED)
    asked = events[-1].payload
    assert asked["approvers"] == "managers"
    assert asked["request"] == {"amount": 900, "resource": "budget-7"}
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # parked, passivated
    clock.advance(3600.0)  # no manager decided in an hour: escalate to the directors
    events = await run_until(client, task_id, PARKED, after=events[-1].sequence)
    assert events[0].type == "approval.timed_out"
    assert events[0].payload["escalated_to"] == "director"
    director = events[-1].payload
    assert director["approvers"] == "directors"
    await decide(client, task_id, director["approval_id"], "approve", director["request_hash"])
    await decide(client, task_id, director["approval_id"], "reject")  # one-time: ignored
    events = await run_until(client, task_id, DONE, after=events[-1].sequence)
    decided = [e for e in events if e.type == "approval.decided"]
    assert len(decided) == 1 and decided[0].payload["decision"] == "approve"
    assert events[-1].payload["output"] == {"paid": 900}


async def test_an_approval_nobody_decides_cancels_the_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    await start_node(app, clock=clock)
    task_id, _ = await submit(client, "approve", {"amount": 5}, "apr-cancel", PARKED)
    clock.advance(3600.0)
    await run_until(client, task_id, {"approval.requested"}, after=4)  # the escalation
    clock.advance(7200.0)
    events = await run_until(client, task_id, DONE)
    assert events[-1].type == "task.cancelled"
    assert (await client.get(task_id)).status == "CANCELLED"


async def test_a_rejection_routes_to_its_declared_target(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id, events = await submit(client, "approve", {"amount": 50}, "apr-no", PARKED)
    await decide(client, task_id, events[-1].payload["approval_id"], "reject")
    events = await run_until(client, task_id, DONE)
    assert events[-1].payload["output"] == {"paid": 0}


async def test_an_external_wait_resumes_on_its_correlation_id_or_fails_on_timeout(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    await start_node(app, clock=clock)
    task_id, events = await submit(client, "wait", {"order": 42}, "ship", {"wait.started"})
    assert events[-1].payload["correlation_id"] == "order-42"
    env = Envelope(type="external.resolved", message_id="ship-42", correlation_id="ship-42",
                   body={"correlation_id": "order-42", "outcome": "completed",
                         "result": {"tracking": "TRK-1"}})
    await client.publish_signed(external_subject("acme"), encode(env))
    events = await run_until(client, task_id, DONE)
    assert events[-1].payload["output"] == {"tracking": "TRK-1"}
    late, _ = await submit(client, "wait", {"order": 43}, "late", {"wait.started"})
    clock.advance(600.0)
    events = await run_until(client, late, DONE)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "external wait timed out"


async def decide(client: ratchet.Client, task_id: str, approval_id: str, decision: str,
                 request_hash: str | None = None) -> None:
    env = Envelope(type="approval.decision", message_id=f"{approval_id}-{decision}",
                   correlation_id=approval_id,
                   body={"task_id": task_id, "approval_id": approval_id, "decision": decision,
                         "decided_by": "dana", "request_hash": request_hash})
    await client.publish_signed(decision_subject("acme"), encode(env))


async def until_settled(client: ratchet.Client, task_id: str, branches: int) -> None:
    """Wait (bounded) until ``branches`` branches of the task have settled."""
    settled = 0

    async def collect() -> None:
        nonlocal settled
        async for event in client.watch(task_id, follow_terminal=True):
            if event.type in ("branch.completed", "branch.failed"):
                settled += 1
                if settled >= branches:
                    return

    await asyncio.wait_for(collect(), 20)


async def test_a_fanout_completes_with_a_partition_count_other_than_the_default(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """Branch notifications are mail on the task's partition: of this deployment's count."""
    await start_node(app, partitions=4)
    _, events = await asyncio.wait_for(submit(client, "fan.50", {}, "p4"), 20)
    assert events[-1].type == "task.succeeded"
    assert types(events).count("branch.completed") == 50
