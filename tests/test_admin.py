"""The admin service's read verbs over NATS, with roles, tenancy, command ids and audit."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import ratchet
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope, Reply
from tests.conftest import NodeFactory, wait_terminal
from tests.keys import client_as

VIEWER = {"name": "vic", "roles": ["viewer"]}


async def admin(client: ratchet.Client, verb: str, *, command_id: str,
                principal: dict[str, Any] | None = None, tenant: str = "acme",
                **body: Any) -> Reply:
    env = Envelope(type=f"admin.{verb}", message_id=command_id, correlation_id=command_id,
                   body={"command_id": command_id, "principal": principal or VIEWER, **body})
    subject, data = f"ratchet.admin.{tenant}.{verb}", encode(env)
    msg = await client.nc.request(subject, data, timeout=10,
                                  headers=client.sign(subject, data) or None)
    return Reply.model_validate(msgpack.unpackb(msg.data))


@pytest.fixture
async def done_task(start_node: NodeFactory, client: ratchet.Client) -> str:
    await start_node()
    task_id = (await client.submit("three", {}, key="admin-1")).task_id
    await wait_terminal(client, task_id)
    return task_id


async def test_get_history_and_list_answer_for_the_tenants_tasks(
    client: ratchet.Client, done_task: str
) -> None:
    got = await admin(client, "get", command_id="c1", task_id=done_task)
    assert got.ok and got.result is not None
    assert got.result["status"] == "SUCCEEDED" and got.result["current_node"] == "END"
    history = await admin(client, "history", command_id="c2", task_id=done_task,
                          args={"after": 2, "limit": 2})
    assert history.result is not None
    assert [e["sequence"] for e in history.result["events"]] == [3, 4]
    assert history.result["next_after"] == 4
    listed = await admin(client, "list", command_id="c3", args={"status": "SUCCEEDED"})
    assert listed.result is not None
    assert [t["task_id"] for t in listed.result["tasks"]] == [done_task]


async def test_another_tenants_task_is_not_found_and_roles_are_checked(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node()
    done_task = (await client.submit("three", {}, key="admin-1")).task_id
    await wait_terminal(client, done_task)
    stranger = await admin(client, "get", command_id="c4", task_id=done_task, tenant="other")
    assert not stranger.ok and stranger.error is not None
    assert stranger.error.code == "NOT_FOUND"
    # The roles are the key's, never the payload's: claiming "viewer" gets nothing.
    eve = await client_as(node, nats_url, "eve", "acme", roles=[])
    nobody = await admin(eve, "get", command_id="c5", task_id=done_task,
                         principal={"name": "eve", "roles": ["viewer", "operator"]})
    assert nobody.error is not None and nobody.error.code == "PERMISSION_DENIED"
    await eve.close()


async def test_a_repeated_command_id_returns_the_first_answer_and_a_reuse_conflicts(
    client: ratchet.Client, done_task: str
) -> None:
    first = await admin(client, "get", command_id="same", task_id=done_task)
    again = await admin(client, "get", command_id="same", task_id=done_task)
    assert first.result == again.result
    reused = await admin(client, "history", command_id="same", task_id=done_task)
    assert reused.error is not None and reused.error.code == "CONFLICT"


async def test_every_command_is_audited_in_a_hash_chain(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    await admin(client, "list", command_id="a1")
    await admin(client, "get", command_id="a2", task_id="tsk_missing")
    assert node.store is not None
    log = await node.store.audit_log("acme")
    assert [(e["command_id"], e["outcome"]) for e in log] == [
        ("a1", "requested"), ("a1", "ok"), ("a2", "requested"), ("a2", "NOT_FOUND")]
    assert (await node.store.verify_audit()).ok


async def test_tree_shows_the_supervision_tree_without_other_tenants_tasks(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    tree = await admin(client, "tree", command_id="t1")
    assert tree.result is not None
    root = tree.result["tree"]
    assert root["name"] == "node"
    names = {c["name"] for c in root["children"]}
    assert {"node/tasks", "node/intake", "node/admin"} <= names


OPERATOR = {"name": "olga", "roles": ["operator"]}


async def test_cancel_interrupts_a_running_step_and_ends_cancelled_not_failed(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    task_id = (await client.submit("ten", {"sleep": 30}, key="long")).task_id
    async for event in client.watch(task_id):
        if event.type == "task.started":
            break
    reply = await admin(client, "cancel", command_id="k1", principal=OPERATOR,
                        task_id=task_id, args={"reason": "wrong report"})
    assert reply.ok and reply.result is not None
    assert reply.result["status"] == "cancel requested"
    events = await wait_terminal(client, task_id, timeout=10)
    types = [e.type for e in events]
    assert types[-1] == "task.cancelled" and "task.failed" not in types
    assert "step.interrupted" in types and "task.cancel_requested" in types
    assert events[-1].payload["by"] == "local-admin" and events[-1].payload["reason"] == "wrong report"
    assert (await client.get(task_id)).status == "CANCELLED"
    again = await admin(client, "cancel", command_id="k2", principal=OPERATOR, task_id=task_id)
    assert again.error is not None and again.error.code == "ILLEGAL_TRANSITION"


async def test_cancel_during_a_fanout_stops_every_branch(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.graph_apps import app as graph_app

    node = await start_node(graph_app)
    task_id = (await client.submit("fan.all", {"hang": ["a", "b", "c"]}, key="fan")).task_id
    async for event in client.watch(task_id):
        if event.type == "fanout.started":
            break
    await admin(client, "cancel", command_id="k3", principal=OPERATOR, task_id=task_id)
    events = await wait_terminal(client, task_id, timeout=10)
    assert events[-1].type == "task.cancelled"
    assert not [n for n in node.system.live() if n.startswith(f"node/tasks/{task_id}")]


async def test_pause_takes_effect_at_a_step_boundary_and_resume_continues(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.apps import RUNS

    node = await start_node()
    task_id = (await client.submit("ten", {"sleep": 0.05}, key="pause")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            break
    paused = await admin(client, "pause", command_id="p1", principal=OPERATOR, task_id=task_id)
    assert paused.result is not None and "next safe point" in paused.result["effect"]
    seen = event.sequence
    async for later in client.watch(task_id, after=seen):
        if later.type == "task.paused":
            break
    assert (await client.get(task_id)).status == "PAUSED"
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # parked
    stale = await admin(client, "resume", command_id="r0", principal=OPERATOR,
                        task_id=task_id, expected_version=1)
    assert stale.error is not None and stale.error.code == "CONFLICT"
    resumed = await admin(client, "resume", command_id="r1", principal=OPERATOR,
                          task_id=task_id)
    assert resumed.result == {"task_id": task_id, "status": "resumed"}
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert all(RUNS[f"{task_id}:s{i}"] == 1 for i in range(10))


async def test_a_viewer_cannot_cancel(start_node: NodeFactory, client: ratchet.Client,
                                      nats_url: str) -> None:
    node = await start_node()
    task_id = (await client.submit("three", {}, key="admin-1")).task_id
    await wait_terminal(client, task_id)
    vic = await client_as(node, nats_url, "vic", "acme", roles=["viewer"])
    denied = await admin(vic, "cancel", command_id="v1", task_id=task_id, principal=OPERATOR)
    assert denied.error is not None and denied.error.code == "PERMISSION_DENIED"
    assert (await admin(vic, "get", command_id="v2", task_id=task_id)).ok
    await vic.close()


APPROVER = {"name": "ann", "roles": ["approver"]}


async def test_approvals_are_one_time_bound_to_the_request_and_expire(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    from tests.graph_apps import app as graph_app

    clock = ratchet.FakeClock()
    node = await start_node(graph_app, clock=clock)
    vic = await client_as(node, nats_url, "vic", "acme", roles=["viewer"])
    ids = []
    for key in ("a1", "a2"):
        task_id = (await client.submit("approve", {"amount": 70}, key=key)).task_id
        async for event in client.watch(task_id):
            if event.type == "approval.requested":
                ids.append((task_id, event.payload))
                break
    (t1, p1), (t2, p2) = ids
    changed = await admin(client, "approve", command_id="x1", principal=APPROVER, task_id=t1,
                          args={"approval_id": p1["approval_id"], "request_hash": "sha256:0"})
    assert changed.error is not None and changed.error.code == "CONFLICT"
    ok = await admin(client, "approve", command_id="x2", principal=APPROVER, task_id=t1,
                     args={"approval_id": p1["approval_id"],
                           "request_hash": p1["request_hash"]})
    assert ok.ok, ok.error
    twice = await admin(client, "approve", command_id="x3", principal=APPROVER, task_id=t1,
                        args={"approval_id": p1["approval_id"]})
    assert twice.error is not None and twice.error.code == "ILLEGAL_TRANSITION"
    assert (await wait_terminal(client, t1))[-1].payload["output"] == {"paid": 70}
    viewer = await admin(vic, "approve", command_id="x4", task_id=t2, principal=APPROVER,
                         args={"approval_id": p2["approval_id"]})
    await vic.close()
    assert viewer.error is not None and viewer.error.code == "PERMISSION_DENIED"
    clock.advance(3599.0)  # a second before its expiry: still valid
    late = await admin(client, "reject", command_id="x5", principal=APPROVER, task_id=t2,
                       args={"approval_id": p2["approval_id"]})
    assert late.ok
    assert (await wait_terminal(client, t2))[-1].payload["output"] == {"paid": 0}


async def test_restart_gives_a_task_a_fresh_actor_from_its_checkpoint(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    task_id = (await client.submit("ten", {"sleep": 0.05}, key="restart")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            break
    reply = await admin(client, "restart", command_id="rs1", principal=OPERATOR,
                        task_id=task_id)
    assert reply.result is not None and reply.result["restarts"] == 1
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    recovered = [e for e in events if e.type == "task.recovered"]
    assert recovered and recovered[0].payload["reason"] == "actor_restart"


async def test_fork_from_checkpoint_3_runs_from_there_and_leaves_the_original_alone(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.apps import RUNS

    node = await start_node()
    original = (await client.submit("ten", {}, key="orig")).task_id
    before = await wait_terminal(client, original)
    reply = await admin(client, "fork", command_id="f1", principal=OPERATOR, task_id=original,
                        args={"checkpoint": 3})
    assert reply.ok, reply.error
    assert reply.result is not None and reply.result["next_node"] == "s3"
    forked = reply.result["task_id"]
    events = await wait_terminal(client, forked)
    assert events[-1].payload["output"] == {"count": 10}  # 3 carried over + 7 run here
    assert [RUNS[f"{forked}:s{i}"] for i in range(10)] == [0, 0, 0] + [1] * 7
    assert await node.store.events(original) == [  # type: ignore[union-attr]
        {"sequence": e.sequence, "event_id": e.event_id, "type": e.type,
         "aggregate_version": e.aggregate_version, "occurred_at": e.occurred_at,
         "payload": e.payload} for e in before]
    got = await admin(client, "get", command_id="f2", task_id=forked)
    assert got.result is not None and got.result["status"] == "SUCCEEDED"


async def test_a_disabled_tool_is_refused_and_freeze_holds_new_steps_until_thawed(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.apps import RUNS

    node = await start_node()
    frozen = await admin(client, "freeze", command_id="z1", principal=OPERATOR)
    assert frozen.result is not None and frozen.result["frozen"] is True
    task_id = (await client.submit("three", {}, key="frozen")).task_id
    async for event in client.watch(task_id):
        if event.type == "task.queued":
            break
    assert (await client.get(task_id)).status == "QUEUED"
    assert RUNS[f"{task_id}:s0"] == 0
    thawed = await admin(client, "thaw", command_id="z2", principal=OPERATOR)
    assert thawed.result is not None and thawed.result["frozen"] is False
    assert (await wait_terminal(client, task_id))[-1].type == "task.succeeded"
    assert node.store is not None and await node.store.switches() == []
    disabled = await admin(client, "disable-tool", command_id="z3", principal=OPERATOR,
                           args={"tool": "submit_claim", "reason": "provider incident"})
    assert disabled.result == {"disabled": ["submit_claim"]}
    assert await node.store.switches() == [("acme", "tool", "submit_claim")]
    log = await node.store.audit_log("acme")
    assert ("z3", "ok") in [(e["command_id"], e["outcome"]) for e in log]


async def test_purge_and_retention_remove_finished_tasks_and_unreferenced_blobs(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from ratchet.supervisors.services.retention import RetentionSweeper

    wf = ratchet.Workflow("bulky")

    @wf.step
    async def big(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"doc": "y" * 10_000, "big": "z" * 1_500_000,  # a chunked blob too
                "output": {"n": ctx.input.get("n")}}

    node = await start_node(ratchet.Registry([wf]))
    store = node.store
    assert store is not None
    running_ids = []
    for n in (1, 2):
        task_id = (await client.submit("bulky", {"n": n}, key=f"bulk-{n}")).task_id
        await wait_terminal(client, task_id)
        running_ids.append(task_id)
    assert await store.count("blobs") == 2  # each document stored once for both tasks
    assert await store.count("blob_chunks") == 2
    busy = await admin(client, "purge", command_id="pg0", principal=OPERATOR,
                       task_id="tsk_unknown")
    assert busy.error is not None and busy.error.code == "NOT_FOUND"
    purged = await admin(client, "purge", command_id="pg1", principal=OPERATOR,
                         task_id=running_ids[0])
    assert purged.result is not None and purged.result["removed"]["blobs"] == 0  # still used
    sweeper = RetentionSweeper(store, node.clock, {"acme": 0.0})
    assert await sweeper.sweep() == 1
    assert await store.count("tasks") == 0 and await store.count("blobs") == 0
    assert await store.count("blob_chunks") == 0
    assert await store.count("events") == 0 and await store.count("checkpoint_values") == 0


async def test_an_expired_approval_is_rejected(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.graph_apps import app as graph_app

    clock = ratchet.FakeClock()
    await start_node(graph_app, clock=clock)
    task_id = (await client.submit("approve", {"amount": 5}, key="exp")).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            asked = event.payload
            break
    clock.advance(3601.0)
    late = await admin(client, "approve", command_id="e1", principal=APPROVER,
                       task_id=task_id, args={"approval_id": asked["approval_id"]})
    assert late.error is not None and late.error.code == "ILLEGAL_TRANSITION"
    assert "expired" in late.error.message or "timed_out" in late.error.message


async def test_a_repeated_cancel_command_answers_once_and_acts_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    task_id = (await client.submit("ten", {"sleep": 30}, key="twice")).task_id
    async for event in client.watch(task_id):
        if event.type == "task.started":
            break
    first = await admin(client, "cancel", command_id="once", principal=OPERATOR,
                        task_id=task_id)
    again = await admin(client, "cancel", command_id="once", principal=OPERATOR,
                        task_id=task_id)
    assert first.result == again.result
    events = await wait_terminal(client, task_id)
    assert [e.type for e in events].count("task.cancel_requested") == 1
    assert node.store is not None
    outcomes = [e["outcome"] for e in await node.store.audit_log("acme")
                if e["command_id"] == "once"]
    assert outcomes == ["requested", "ok"]


async def test_list_pages_through_the_tenants_tasks(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    for i in range(5):
        await wait_terminal(client, (await client.submit("three", {}, key=f"page-{i}")).task_id)
    seen: list[str] = []
    cursor = None
    for n in range(3):
        page = await admin(client, "list", command_id=f"pg-{n}",
                           args={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.result is not None
        seen += [t["task_id"] for t in page.result["tasks"]]
        cursor = page.result["next_cursor"]
    assert len(seen) == len(set(seen)) == 5 and cursor is None


@pytest.mark.parametrize(
    ("verb", "body", "code"),
    [
        ("history", {"task_id": "tsk_nope"}, "NOT_FOUND"),
        ("history", {"task_id": "DONE", "args": {"after": "x"}}, "INVALID_ARGUMENT"),
        ("list", {"args": {"cursor": 7}}, "INVALID_ARGUMENT"),
        ("handoff", {"task_id": "tsk_nope"}, "NOT_FOUND"),
        ("pause", {"task_id": "DONE"}, "ILLEGAL_TRANSITION"),
        ("resume", {"task_id": "DONE"}, "ILLEGAL_TRANSITION"),
        ("restart", {"task_id": "DONE"}, "ILLEGAL_TRANSITION"),
        ("fork", {"task_id": "DONE", "args": {"checkpoint": 99}}, "NOT_FOUND"),
        ("approve", {"task_id": "DONE"}, "INVALID_ARGUMENT"),
        ("disable-tool", {}, "INVALID_ARGUMENT"),
        ("nonsense", {}, "INVALID_ARGUMENT"),
    ],
)
async def test_each_verb_answers_its_errors_typed(
    client: ratchet.Client, done_task: str, verb: str, body: dict[str, Any], code: str
) -> None:
    if body.get("task_id") == "DONE":
        body = {**body, "task_id": done_task}
    roles = {"name": "root", "roles": ["operator", "approver", "viewer"]}
    reply = await admin(client, verb, command_id=f"err-{verb}-{code}", principal=roles, **body)
    assert not reply.ok and reply.error is not None
    assert reply.error.code == code, reply.error


async def test_a_command_id_still_running_is_not_run_twice_and_retryable_errors_are_not_kept(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node()
    assert node.store is not None
    from ratchet.protocol.codec import canonical
    from ratchet.protocol.ids import request_hash
    from ratchet.protocol.messages import AdminCommand

    body = AdminCommand(command_id="busy-id",
                        principal={"name": "local-admin"}).model_dump()  # type: ignore[arg-type]
    assert client.signer is not None
    digest = request_hash(canonical({"verb": "list", "body": body,
                                     "key": client.signer.public_key}))
    state, _ = await node.store.claim_command("acme", "busy-id", "list", digest,
                                              node.clock.now())
    assert state == "new"  # as if a first request with this id were still running
    again = await admin(client, "list", command_id="busy-id")
    assert again.error is not None and again.error.code == "UNAVAILABLE"
    assert again.error.retryable
    await node.store.release_command("acme", "busy-id")
    ok = await admin(client, "list", command_id="busy-id")
    assert ok.ok


async def test_a_join_restarted_mid_fanout_still_hears_the_later_branches(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.graph_apps import app as graph_app

    await start_node(graph_app)
    task_id = (await client.submit("fan.all", {"slow": {"b": 0.3, "c": 0.3}}, key="join-rs")).task_id
    async for event in client.watch(task_id):
        if event.type == "branch.completed":  # a is done; b and c are still working
            break
    reply = await admin(client, "restart", command_id="rj1", principal=OPERATOR,
                        task_id=task_id, args={"actor": "join:spread#0"})
    assert reply.ok, reply.error
    assert reply.result is not None and reply.result["restarts"] == 1
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert set(events[-1].payload["output"]["joined"]) == {"a", "b", "c"}
