"""Workflow versions (issue 15, item 5): tasks stay on the version they started on while
others are registered; ``admin migrate`` moves a task that stands still to another version
through the migration that version declares (actors/workflow/migrations.py,
supervisors/services/admin_versions.py); ``ratchet versions`` counts tasks per version;
``serve --route-new-tasks`` sends a share of new tasks to a canary version
(supervisors/services/canary.py). Changed code under one version: tests/test_versions.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet.actors.workflow.migrations import migrate_state
from ratchet.protocol.errors import MigrationRefused, UsageError
from ratchet.supervisors.cli import main
from ratchet.supervisors.cli.parser import parser
from ratchet.supervisors.cli.serve import node_config
from ratchet.supervisors.services.canary import check_routes, parse_routes, routed_version
from tests.conftest import NodeFactory, node_key, wait_terminal
from tests.test_admin import APPROVER, OPERATOR, admin

Step = Callable[[ratchet.StepContext], Awaitable[dict[str, Any]]]
Migration = Callable[[dict[str, Any], str], Any]


async def pay_all(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"], "version": 1}}


async def pay_half(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"] / 2, "version": 1}}


def to_v2(state: dict[str, Any], node: str) -> tuple[dict[str, Any], str]:
    """v1's ``pay`` is v2's ``fee`` (then ``settle``); the other nodes keep their names."""
    return {**state, "currency": "EUR"}, {"pay": "fee"}.get(node, node)


def v1(pay: Step = pay_all) -> ratchet.Workflow:
    wf = ratchet.Workflow("spend", version=1)

    @wf.step
    async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"amount": ctx.input["amount"]}

    wf.approval("manager", on_approve="pay", on_reject="pay", timeout=3600, on_timeout="pay",
                request=lambda s: {"amount": s["amount"]})
    wf.add_step("pay", pay, next=ratchet.END)
    return wf


def v2(migration: Migration = to_v2) -> ratchet.Workflow:
    """Another graph: a fee step after the approval; amounts carry a currency."""
    wf = ratchet.Workflow("spend", version=2)

    @wf.step
    async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"amount": ctx.input["amount"], "currency": "EUR"}

    wf.approval("manager", on_approve="fee", on_reject="fee", timeout=3600, on_timeout="fee",
                request=lambda s: {"amount": s["amount"], "currency": s["currency"]})

    @wf.step(next="settle")
    async def fee(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"fee": 1}

    @wf.step(next=ratchet.END)
    async def settle(ctx: ratchet.StepContext) -> dict[str, Any]:
        s = ctx.state
        return {"output": {"paid": s["amount"] - s["fee"], "currency": s["currency"],
                           "version": 2}}

    wf.migrate_from(1)(migration)
    return wf


async def _parked(client: ratchet.Client, key: str, version: int | None = None
                  ) -> tuple[str, dict[str, Any]]:
    task_id = (await client.submit("spend", {"amount": 10}, key=key, version=version)).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            return task_id, event.payload
    raise AssertionError("never asked for approval")


async def _approve(client: ratchet.Client, task_id: str, asked: dict[str, Any], cid: str) -> None:
    reply = await admin(client, "approve", command_id=cid, principal=APPROVER, task_id=task_id,
                        args={"approval_id": asked["approval_id"],
                              "request_hash": asked["request_hash"]})
    assert reply.ok, reply.error


async def _migrate(client: ratchet.Client, task_id: str, cid: str, **args: Any) -> Any:
    return await admin(client, "migrate", command_id=cid, principal=OPERATOR, task_id=task_id,
                       args={"to_version": 2, **args})


# -- versions side by side ------------------------------------------------------------------


async def test_a_v1_task_parked_while_v2_is_registered_finishes_on_v1(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(ratchet.Registry([v1()]))
    task_id, asked = await _parked(client, "wv-1")
    await node.stop()
    node = await start_node(ratchet.Registry([v1(), v2()]))  # v2 is the default now
    await _approve(client, task_id, asked, "wv-1a")
    done = await wait_terminal(client, task_id)
    assert done[-1].type == "task.succeeded"
    assert done[-1].payload["output"] == {"paid": 10, "version": 1}
    assert (await node.store.load_task(task_id)).workflow_version == 1
    fresh = (await client.submit("spend", {"amount": 10}, key="wv-1new")).task_id
    queued = [e for e in await _until(client, fresh, "approval.requested")
              if e.type == "task.queued"]
    assert queued[0].payload["workflow_version"] == 2  # new tasks: the latest


async def _until(client: ratchet.Client, task_id: str, kind: str) -> list[ratchet.Event]:
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id):
            events.append(event)
            if event.type == kind:
                return

    await asyncio.wait_for(collect(), 30)
    return events


# -- admin migrate ----------------------------------------------------------------------------


async def test_migrate_moves_a_parked_task_to_v2_and_it_finishes_with_v2_steps(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(ratchet.Registry([v1(), v2()]))
    task_id, asked = await _parked(client, "wv-2", version=1)
    before = await node.store.load_task(task_id)
    reply = await _migrate(client, task_id, "wv-2m")
    assert reply.ok, reply.error
    moved = reply.result
    assert (moved["from_version"], moved["to_version"]) == (1, 2)
    assert (moved["from_node"], moved["to_node"]) == ("manager", "manager")
    assert moved["changed"] == ["currency"] and moved["status"] == "WAITING_APPROVAL"
    after = await node.store.load_task(task_id)
    assert after.workflow_version == 2 and after.status == "WAITING_APPROVAL"
    assert after.definition_hash == node.registry.definition_hash("spend", 2)
    assert after.definition_hash != before.definition_hash
    assert after.last_checkpoint == before.last_checkpoint + 1
    assert (await node.store.load_state(task_id)).values["currency"] == "EUR"
    await _approve(client, task_id, asked, "wv-2a")  # the approval stays valid
    done = await wait_terminal(client, task_id)
    assert done[-1].type == "task.succeeded"
    assert done[-1].payload["output"] == {"paid": 9, "currency": "EUR", "version": 2}
    migrated = [e for e in done if e.type == "task.migrated"]
    assert len(migrated) == 1 and migrated[0].payload["by"] == "local-admin"
    assert "@migrate" in await node.store.checkpoint_names(task_id)
    audit = [(e["verb"], e["outcome"]) for e in await node.store.audit_log("acme")
             if e["verb"] == "migrate"]
    assert audit == [("migrate", "requested"), ("migrate", "ok")]


async def test_a_migration_to_an_unknown_node_is_refused_and_changes_nothing(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    def lost(state: dict[str, Any], node: str) -> tuple[dict[str, Any], str]:
        return {**state, "currency": "EUR"}, "nowhere"

    node = await start_node(ratchet.Registry([v1(), v2(lost)]))
    task_id, asked = await _parked(client, "wv-3", version=1)
    before = await node.store.load_task(task_id)
    events_before = await node.store.events(task_id)
    state_before = (await node.store.load_state(task_id)).values
    reply = await _migrate(client, task_id, "wv-3m")
    assert reply.error is not None and reply.error.code == "INVALID_ARGUMENT"
    assert reply.error.details["reason"] == "unknown_node"
    assert "nowhere" in reply.error.message
    assert await node.store.load_task(task_id) == before
    assert await node.store.events(task_id) == events_before
    assert (await node.store.load_state(task_id)).values == state_before
    await _approve(client, task_id, asked, "wv-3a")  # still a v1 task, and it finishes so
    done = await wait_terminal(client, task_id)
    assert done[-1].payload["output"] == {"paid": 10, "version": 1}


async def test_a_migrated_state_that_cannot_be_checkpointed_is_refused_unwritten(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(ratchet.Registry([v1(), v2(lambda s, n: ({**s, "x": object()}, n))]))
    task_id, _ = await _parked(client, "wv-8", version=1)
    before = await node.store.load_task(task_id)
    reply = await _migrate(client, task_id, "wv-8m")
    assert reply.error is not None and reply.error.code == "INVALID_STATE_VALUE"
    assert await node.store.load_task(task_id) == before


async def test_migrate_refuses_a_running_or_finished_task_and_an_unregistered_version(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(ratchet.Registry([v1(), v2()]))
    task_id, asked = await _parked(client, "wv-4", version=1)
    unknown = await _migrate(client, task_id, "wv-4u", to_version=7)
    assert unknown.error is not None and unknown.error.code == "INVALID_ARGUMENT"
    same = await _migrate(client, task_id, "wv-4s", to_version=1)
    assert same.error is not None and same.error.details["reason"] == "same_version"
    await _approve(client, task_id, asked, "wv-4a")
    await wait_terminal(client, task_id)
    done = await _migrate(client, task_id, "wv-4d")
    assert done.error is not None and done.error.code == "ILLEGAL_TRANSITION"


async def test_a_task_paused_for_changed_code_is_migrated_then_resumed_on_v2(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(ratchet.Registry([v1()]))
    task_id, asked = await _parked(client, "wv-5")
    await node.stop()
    node = await start_node(ratchet.Registry([v1(pay_half), v2()]))  # v1's code changed
    await _approve(client, task_id, asked, "wv-5a")
    paused = await _until(client, task_id, "task.paused")
    assert paused[-1].payload["reason"] == "definition_changed"
    reply = await _migrate(client, task_id, "wv-5m")
    assert reply.ok, reply.error
    assert (reply.result["from_node"], reply.result["to_node"]) == ("pay", "fee")
    assert reply.result["then"] == "admin resume"
    resumed = await admin(client, "resume", command_id="wv-5r", principal=OPERATOR,
                          task_id=task_id)  # no accept_definition: it is on v2's now
    assert resumed.ok, resumed.error
    done = await wait_terminal(client, task_id)
    assert done[-1].type == "task.succeeded"
    assert done[-1].payload["output"] == {"paid": 9, "currency": "EUR", "version": 2}


async def test_a_migration_function_is_checked_before_anything_is_written() -> None:
    target = v2(lambda state, node: (state, "pay"))
    with pytest.raises(MigrationRefused) as refused:
        await migrate_state(target, 1, {"amount": 1}, "manager", "WAITING_APPROVAL")
    assert refused.value.details["reason"] == "unknown_node"
    with pytest.raises(MigrationRefused, match="declares no migration from v3"):
        await migrate_state(v2(), 3, {}, "manager", "PAUSED")
    parked = v2(lambda state, node: (state, "fee"))
    with pytest.raises(MigrationRefused) as moved:
        await migrate_state(parked, 1, {}, "manager", "WAITING_APPROVAL")
    assert moved.value.details["reason"] == "parked_node"
    assert (await migrate_state(parked, 1, {"a": 1}, "pay", "PAUSED")).node == "fee"
    with pytest.raises(ratchet.WorkflowDefinitionError, match="earlier version"):
        v2().migrate_from(2)


# -- ratchet versions -----------------------------------------------------------------------


async def test_versions_counts_tasks_per_version_and_status(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    node = await start_node(ratchet.Registry([v1(), v2()]))
    one, asked = await _parked(client, "wv-6a", version=1)
    await _parked(client, "wv-6b", version=1)
    await _parked(client, "wv-6c")
    await _approve(client, one, asked, "wv-6x")
    await wait_terminal(client, one)
    reply = await admin(client, "versions", command_id="wv-6v")
    assert reply.ok, reply.error
    [spend] = [w for w in reply.result["workflows"] if w["workflow"] == "spend"]
    first, second = spend["versions"]
    assert first["tasks"] == {"SUCCEEDED": 1, "WAITING_APPROVAL": 1} and first["total"] == 2
    assert second["tasks"] == {"WAITING_APPROVAL": 1} and second["default"] is True
    assert first["definition_hash"] == node.registry.definition_hash("spend", 1)
    await node.stop()
    await start_node(ratchet.Registry([v2()]))  # v1 no longer registered: its tasks still shown
    args = ["--output", "json", "versions", "spend", "--nats-url", nats_url,
            "--creds", str(node_key(tmp_path)), "--tenant", "acme"]
    assert await asyncio.to_thread(main, args) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["versions"]
    assert [(r["workflow"], r["version"], r["registered"], r["total"]) for r in rows] == [
        ("spend", 1, False, 2), ("spend", 2, True, 1)]
    assert rows[0]["definition_hash"] is None and rows[1]["tasks"] == {"WAITING_APPROVAL": 1}


# -- canary routing -------------------------------------------------------------------------


def test_canary_routing_is_a_share_of_keys_and_the_same_key_lands_on_the_same_version() -> None:
    routes = parse_routes(["spend=2:30"])
    assert routes == {"spend": (2, 30.0)}
    keys = [f"order-{i}" for i in range(1000)]
    chosen = [routed_version(routes, "spend", k) for k in keys]
    assert set(chosen) == {2, None}
    assert 250 <= chosen.count(2) <= 350  # 30% of 1,000, within 3.5 standard deviations
    assert chosen == [routed_version(routes, "spend", k) for k in keys]  # deterministic
    assert routed_version(routes, "other", "order-1") is None  # not routed
    none, every = parse_routes(["spend=2:0"]), parse_routes(["spend=2:100"])
    assert all(routed_version(none, "spend", k) is None for k in keys)
    assert all(routed_version(every, "spend", k) == 2 for k in keys)


@pytest.mark.parametrize("bad", ["spend", "spend=2", "spend=0:10", "spend=2:101", "spend=x:5",
                                 "=2:5"])
def test_a_malformed_route_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="WORKFLOW=VERSION:PERCENT"):
        parse_routes([bad])


def test_a_route_to_an_unregistered_version_is_refused() -> None:
    with pytest.raises(UsageError, match="no version 3"):
        check_routes(parse_routes(["spend=3:10"]), ratchet.Registry([v1(), v2()]))
    with pytest.raises(UsageError, match="routed twice"):
        parse_routes(["spend=1:10", "spend=2:10"])


async def test_new_tasks_follow_the_route_and_an_explicit_version_is_kept(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(ratchet.Registry([v1(), v2()]), new_task_routes={"spend": (1, 100.0)})
    routed, _ = await _parked(client, "wv-7a")
    asked_for, _ = await _parked(client, "wv-7b", version=2)
    for task_id, version in ((routed, 1), (asked_for, 2)):
        reply = await admin(client, "get", command_id=f"wv-7g{version}", task_id=task_id)
        assert reply.ok and reply.result["workflow_version"] == version
    again = await client.submit_sync("spend", {"amount": 10}, key="wv-7a")  # a retry
    assert again.task_id == routed and again.accepted is not None
    assert again.accepted.created is False  # the same version: the same request, no conflict


#: For ``ratchet serve --app tests.test_workflow_versions:app`` below.
app = ratchet.Registry([v1(), v2()])


def test_serve_reads_the_routes_and_refuses_one_to_a_version_the_app_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["serve", "--app", "tests.test_workflow_versions:app", "--state-dir", str(tmp_path)]
    config = node_config(parser().parse_args([*flags, "--route-new-tasks", "spend=1:25"]))
    assert config.new_task_routes == {"spend": (1, 25.0)}
    assert main([*flags, "--route-new-tasks", "spend=9:10"]) == 2  # before NATS starts
    assert "no version 9" in capsys.readouterr().err
