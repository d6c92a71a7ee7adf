"""Recovery edges: racing activations, lost start mail, mail for nothing, a workflow gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ratchet
from ratchet.actors.task.fanout import BranchesDone, JoinActor
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope, StartTask
from ratchet.protocol.subjects import STREAM_DLQ, mail_subject
from ratchet.supervisors.services.recovery import RecoverySweeper
from ratchet.supervisors.supervision.supervisor import StopChild
from tests.apps import RUNS
from tests.conftest import NodeFactory, wait_terminal
from tests.graph_apps import app as graph_app
from tests.keys import publish_sealed


async def test_racing_activations_of_one_task_share_one_actor(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    assert node.root is not None and node.tasks is not None
    await node.root.ask(StopChild("mail"), timeout=10)  # keep the start mail away
    accepted = await client.submit_sync("three", {"sleep": 0.01}, key="race")
    task_id = accepted.task_id
    refs = await asyncio.gather(*(node.tasks.ensure_running(task_id) for _ in range(5)))
    assert len({id(r) for r in refs}) == 1
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert node.system.lookup("node/tasks") is not None  # the tasks supervisor survived
    assert RUNS[f"{task_id}:s0"] == 1


async def test_the_sweeper_starts_a_task_whose_start_mail_was_lost(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    assert node.root is not None and node.tasks is not None and node.store is not None
    await node.root.ask(StopChild("mail"), timeout=10)
    task_id = (await client.submit_sync("three", {}, key="lost-mail")).task_id
    assert (await client.get(task_id)).status == "QUEUED"
    sweeper = RecoverySweeper(node.store, node.tasks, node.clock)
    assert await sweeper.sweep() == 0  # idle once: its mail may be on the way
    assert (await client.get(task_id)).status == "QUEUED"
    assert await sweeper.sweep() == 1  # idle twice: recovered
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"


async def test_the_sweeper_leaves_a_task_alone_that_became_live_between_sweeps(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    assert node.root is not None and node.tasks is not None and node.store is not None
    await node.root.ask(StopChild("mail"), timeout=10)
    task_id = (await client.submit_sync("three", {}, key="late-mail")).task_id
    sweeper = RecoverySweeper(node.store, node.tasks, node.clock)
    assert await sweeper.sweep() == 0
    await node.tasks.ensure_running(task_id)  # its mail arrived after all
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    assert await sweeper.sweep() == 0  # finished: nothing to recover, nothing suspected
    assert sweeper._suspects == set()


async def test_mail_for_a_task_that_does_not_exist_is_dead_lettered(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    env = Envelope(type="task.start", message_id="m-ghost", correlation_id="c",
                   body=StartTask(task_id="tsk_ghost", tenant="acme").model_dump())
    await publish_sealed(client, node, mail_subject("tsk_ghost", "task"), encode(env))
    sub = await client.js.pull_subscribe("ratchet.dlq.mail.>", "ghost", stream=STREAM_DLQ)
    [msg] = await sub.fetch(1, timeout=10)
    assert msg.headers is not None and msg.headers["Ratchet-Error-Code"] == "NOT_FOUND"


async def test_a_task_whose_workflow_is_gone_fails_once_instead_of_crash_looping(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    assert node.root is not None
    await node.root.ask(StopChild("mail"), timeout=10)
    task_id = (await client.submit_sync("three", {}, key="orphan")).task_id
    await node.stop()
    wf = ratchet.Workflow("other", version=1)

    @wf.step
    async def only(ctx: ratchet.StepContext) -> None:
        return None

    await start_node(ratchet.Registry([wf]))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "workflow not registered on this node"
    assert [e.type for e in events].count("task.failed") == 1


async def test_a_parked_task_stays_passivated_when_its_node_restarts(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.graph_apps import app as graph_app

    node = await start_node(graph_app)
    task_id = (await client.submit("approve", {"amount": 3}, key="parked")).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            break
    await node.stop()
    again = await start_node(graph_app)
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    assert again.system.lookup(f"node/tasks/{task_id}/actor") is None


async def test_a_malformed_timer_mail_does_not_hurt_a_running_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    task_id = (await client.submit("ten", {"sleep": 0.02}, key="poison")).task_id
    for kind in ("branch_timeout", "join_timeout", "approval_timeout", "wait_timeout"):
        env = Envelope(type="timer.fired", message_id=f"bad-{kind}", correlation_id="x",
                       body={"kind": kind, "payload": {}})
        await publish_sealed(client, node, mail_subject(task_id, "task"), encode(env))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert "task.recovered" not in [e.type for e in events]


async def test_an_event_too_large_for_nats_does_not_stall_other_tasks(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    wf = ratchet.Workflow("huge")

    @wf.step
    async def big(ctx: ratchet.StepContext) -> dict[str, object]:
        return {"output": {"blob": "x" * 1_500_000}}

    from tests.apps import three

    node = await start_node(ratchet.Registry([wf, three]))
    huge = (await client.submit("huge", {}, key="huge")).task_id
    events = await wait_terminal(client, huge)
    assert events[-1].payload == {"truncated": True, "bytes": events[-1].payload["bytes"]}
    small = (await client.submit("three", {}, key="small")).task_id
    assert (await wait_terminal(client, small))[-1].type == "task.succeeded"
    assert node.store is not None and (await node.store.load_task(huge)).status == "SUCCEEDED"


async def test_the_sweeper_finishes_a_join_whose_branch_notifications_were_lost(
    start_node: NodeFactory, client: ratchet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start_node(graph_app)
    assert node.root is not None and node.tasks is not None and node.store is not None
    told = JoinActor.receive

    async def deaf(self: JoinActor, message: Any) -> Any:
        if isinstance(message, BranchesDone):
            return None  # the settler's notification is lost (the branches' rows are not)
        return await told(self, message)

    monkeypatch.setattr(JoinActor, "receive", deaf)
    task_id = (await client.submit("fan.all", {"sleep": 0.3}, key="lost-branch-note")).task_id
    seen: list[str] = []

    async def three_branches() -> None:
        async for event in client.watch(task_id, follow_terminal=True):
            seen.append(event.type)
            if seen.count("branch.completed") == 3:
                return

    await asyncio.wait_for(three_branches(), 20.0)
    assert "join.completed" not in seen
    assert (await client.get(task_id)).status == "RUNNING"  # the join still waits
    sweeper = RecoverySweeper(node.store, node.tasks, node.clock)
    await sweeper.sweep()  # the join reads its completion set from the store
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
