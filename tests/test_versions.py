"""Workflow definitions (issue 15, item 5, in part): a task records the hash of the
definition it started on (actors/workflow/definition.py); changed code under the same
version pauses it at its next safe point instead of running (actors/task/definition_guard.py)
unless the workflow declares the change compatible; a resume must accept the new one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import ratchet
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import APPROVER, OPERATOR, admin

Step = Callable[[ratchet.StepContext], Awaitable[dict[str, Any]]]


async def pay_all(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"]}}


async def pay_half(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["amount"] / 2}}


def build(pay: Step, compatible: tuple[str, ...] = ()) -> ratchet.Registry:
    wf = ratchet.Workflow("spend", compatible_with=compatible)

    @wf.step
    async def prepare(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"amount": ctx.input["amount"]}

    wf.approval("manager", on_approve="pay", on_reject="pay", timeout=3600, on_timeout="pay",
                request=lambda s: {"amount": s["amount"]})
    wf.add_step("pay", pay, next=ratchet.END)
    return ratchet.Registry([wf])


def test_the_hash_follows_the_code_not_the_object() -> None:
    same, again, other = build(pay_all), build(pay_all), build(pay_half)
    assert same.definition_hash("spend", 1) == again.definition_hash("spend", 1)
    assert same.definition_hash("spend", 1) != other.definition_hash("spend", 1)
    assert str(same.definition_hash("spend", 1)).startswith("sha256:")


async def _parked(client: ratchet.Client, key: str) -> tuple[str, dict[str, Any]]:
    task_id = (await client.submit("spend", {"amount": 10}, key=key)).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            return task_id, event.payload
    raise AssertionError("never asked for approval")


async def _approve(client: ratchet.Client, task_id: str, asked: dict[str, Any], cid: str) -> None:
    reply = await admin(client, "approve", command_id=cid, principal=APPROVER, task_id=task_id,
                        args={"approval_id": asked["approval_id"],
                              "request_hash": asked["request_hash"]})
    assert reply.ok, reply.error


async def test_changed_code_under_the_same_version_pauses_the_task_until_accepted(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(build(pay_all))
    task_id, asked = await _parked(client, "v-1")
    await node.stop()
    await start_node(build(pay_half))  # the same version, other code for `pay`
    await _approve(client, task_id, asked, "v-1a")
    events: list[ratchet.Event] = []
    async for event in client.watch(task_id):
        events.append(event)
        if event.type == "task.paused":
            break
    kinds = [e.type for e in events]
    assert "task.definition_changed" in kinds and "step.completed" not in kinds[
        kinds.index("task.definition_changed"):]
    assert events[-1].payload["reason"] == "definition_changed"
    refused = await admin(client, "resume", command_id="v-1r", principal=OPERATOR,
                          task_id=task_id)
    assert refused.error is not None and refused.error.code == "ILLEGAL_TRANSITION"
    assert "accept_definition" in refused.error.message
    accepted = await admin(client, "resume", command_id="v-1s", principal=OPERATOR,
                           task_id=task_id, args={"accept_definition": True})
    assert accepted.ok
    done = await wait_terminal(client, task_id)
    assert done[-1].type == "task.succeeded" and done[-1].payload["output"] == {"paid": 5.0}
    resumed = [e.payload for e in done if e.type == "task.resumed"]
    assert resumed and resumed[-1]["definition"] is not None


async def test_a_change_declared_compatible_goes_on(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    old = build(pay_all)
    node = await start_node(old)
    task_id, asked = await _parked(client, "v-2")
    await node.stop()
    await start_node(build(pay_half, compatible=(str(old.definition_hash("spend", 1)),)))
    await _approve(client, task_id, asked, "v-2a")
    done = await wait_terminal(client, task_id)
    assert done[-1].type == "task.succeeded"
    assert "task.definition_changed" not in [e.type for e in done]
