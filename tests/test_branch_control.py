"""Fan-out branches obey their task: a pause stops each at its next safe point and the resume
goes on from there, a freeze holds them until thawed, the task's deadline fails them; a
failed branch runs again from its last committed step, by the fan-out's ``branch_retries``
or by an operator's ``retry-branch``, and the other branches are left alone."""

from __future__ import annotations

import asyncio
from collections import Counter

import ratchet
from tests.branch_apps import GATES, RUNS, STEPS, Gate
from tests.branch_apps import app as branch_app
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal
from tests.test_admin import OPERATOR, admin

BRANCHES = [f"b{i}" for i in range(4)]


def runs_of(task_id: str) -> Counter[tuple[str, int]]:
    return Counter({(b, s): n for (t, b, s), n in RUNS.items() if t == task_id})


def every_step_once(task_id: str) -> bool:
    return runs_of(task_id) == Counter({(b, s): 1 for b in BRANCHES for s in range(STEPS)})


async def submit_gated(client: ratchet.Client, workflow: str, name: str,
                       **input: object) -> tuple[str, Gate]:
    """Submit with every branch held at its step 1's gate; returns once all four wait."""
    gate = GATES[name] = Gate(expect=4)
    task_id = (await client.submit(workflow, {"gate": name, **input}, key=name)).task_id
    async with asyncio.timeout(10):
        await gate.full.wait()
    return task_id, gate


async def test_a_pause_stops_each_branch_at_its_next_safe_point_and_resume_goes_on(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    task_id, gate = await submit_gated(client, "steps.fan", "pause")
    paused = await admin(client, "pause", command_id="bp1", principal=OPERATOR,
                         task_id=task_id)
    assert paused.result is not None
    gate.opened.set()  # the steps in flight end; no branch starts its next one
    async for event in client.watch(task_id):
        if event.type == "task.paused":
            break
    assert (await client.get(task_id)).status == "PAUSED"
    assert runs_of(task_id) == Counter({(b, s): 1 for b in BRANCHES for s in (0, 1)})
    resumed = await admin(client, "resume", command_id="bp2", principal=OPERATOR,
                          task_id=task_id)
    assert resumed.result == {"task_id": task_id, "status": "resumed"}
    events = await wait_terminal(client, task_id)
    assert_contiguous(events)
    assert events[-1].type == "task.succeeded"
    assert every_step_once(task_id)  # held at safe points: nothing ran twice
    joined = events[-1].payload["output"]["joined"]
    assert all(joined[b]["done"] == list(range(STEPS)) for b in BRANCHES)


async def test_a_freeze_holds_branches_at_their_safe_point_until_thawed(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    task_id, gate = await submit_gated(client, "steps.fan", "freeze")
    frozen = await admin(client, "freeze", command_id="bf1", principal=OPERATOR)
    assert frozen.result is not None and frozen.result["frozen"] is True
    gate.opened.set()
    held = set()
    async for event in client.watch(task_id):
        # Each branch commits its progress before step 2, and waits there.
        if event.type == "branch.step_completed" and event.payload["steps"] == 2:
            held.add(event.payload["branch"])
            if held == set(BRANCHES):
                break
    assert not [key for key in runs_of(task_id) if key[1] >= 2]
    thawed = await admin(client, "thaw", command_id="bf2", principal=OPERATOR)
    assert thawed.result is not None and thawed.result["frozen"] is False
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert every_step_once(task_id)


async def test_branches_past_the_task_deadline_fail_at_their_safe_point(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    task_id = (await client.submit("steps.fan", {"sleep": 0.1}, key="late",
                                   deadline_s=0.45)).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "deadline passed"
    failed = [e.payload for e in events if e.type == "branch.failed"]
    assert failed and all(p["error"] == {"type": "DeadlinePassed",
                                         "message": "task deadline passed"} for p in failed)
    assert max(s for _, s in runs_of(task_id)) < STEPS - 1  # none ran its ten steps


async def test_branch_retries_run_a_failed_branch_again_from_its_last_committed_step(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    task_id = (await client.submit("steps.retry", {"fail": {"b1": [4, 2]}},
                                   key="retry")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    retried = [e.payload for e in events if e.type == "branch.retried"]
    assert [(p["branch"], p["attempt"], p["by"]) for p in retried] == [
        ("b1", 1, None), ("b1", 2, None)]
    assert retried[0]["error"]["message"] == "step 4 of b1 breaks"
    runs = runs_of(task_id)
    assert runs[("b1", 4)] == 3  # its failing step, three times
    assert all(n == 1 for key, n in runs.items() if key != ("b1", 4))  # nothing else again
    assert events[-1].payload["output"]["joined"]["b1"]["done"] == list(range(STEPS))


async def test_a_branch_whose_store_is_down_is_run_again_not_failed(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    """The store unreachable (or a write fenced) is the node's failure, not the branch's:
    the branch runs again from its last committed step, and a fan-out without retries
    still succeeds."""
    await start_node(branch_app)
    task_id = (await client.submit("steps.fan", {"fail": {"b1": [4, 1, "store"]}},
                                   key="store-down")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded", events[-1].payload
    assert not [e for e in events if e.type == "branch.failed"]
    runs = runs_of(task_id)
    assert runs[("b1", 4)] == 2  # the step the store failed under, once more
    assert all(n == 1 for key, n in runs.items() if key != ("b1", 4))  # nothing else again
    assert events[-1].payload["output"]["joined"]["b1"]["done"] == list(range(STEPS))


async def test_an_operator_retries_one_failed_branch_and_the_join_counts_it_again(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    GATES["optional"] = gate = Gate(expect=3)  # b3 fails before it reaches the gate
    task_id = (await client.submit("steps.optional", {
        "gate": "optional", "gate_at": 5, "fail": {"b3": [2, 1]}}, key="optional")).task_id
    async for event in client.watch(task_id):
        if event.type == "branch.failed":
            break
    async with asyncio.timeout(10):
        await gate.full.wait()  # the required branches still run: the join waits
    wrong = await admin(client, "retry-branch", command_id="rb0", principal=OPERATOR,
                        task_id=task_id, args={"fanout": "spread", "branch": "b0"})
    assert wrong.error is not None and wrong.error.code == "CONFLICT"  # b0 did not fail
    retried = await admin(client, "retry-branch", command_id="rb1", principal=OPERATOR,
                          task_id=task_id, args={"fanout": "spread", "branch": "b3"})
    assert retried.result == {"task_id": task_id, "fanout": "spread", "branch": "b3",
                              "status": "retried"}
    gate.opened.set()
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    joined = events[-1].payload["output"]["joined"]
    assert sorted(joined) == BRANCHES and joined["b3"]["done"] == list(range(STEPS))
    runs = runs_of(task_id)
    assert runs[("b3", 0)] == runs[("b3", 1)] == 1 and runs[("b3", 2)] == 2
    [again] = [e.payload for e in events if e.type == "branch.retried"]
    assert again["by"] and again["attempt"] is None and again["key"] == "spread#0"


async def test_a_maps_item_retries_run_a_failed_item_again_from_its_last_committed_step(
    start_node: NodeFactory, client: ratchet.Client,
) -> None:
    await start_node(branch_app)
    task_id = (await client.submit("steps.map_retry", {"n": 3, "fail": {"1": [3, 1]}},
                                   key="map-retry")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert [(e.payload["branch"], e.payload["attempt"]) for e in events
            if e.type == "branch.retried"] == [("1", 1)]
    runs = runs_of(task_id)
    assert runs[("1", 3)] == 2 and sum(runs.values()) == 3 * STEPS + 1
