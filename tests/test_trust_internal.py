"""Defence in depth inside the node (docs/security.md, "Inside the node"): against a NATS
that lets anyone publish anywhere — the fixture's server has no authentication at all —
the node's own checks hold.

- A resolution of an external wait must name an open wait of the task it reaches.
- Kill switches are scoped: a tenant's freeze or disabled tool holds only its tasks; the
  ``_system`` ones hold every tenant's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.task.actor import DeliverMail
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from tests.apps import RUNS, three
from tests.conftest import NodeFactory, wait_terminal
from tests.graph_apps import app as graph_app
from tests.keys import client_as
from tests.test_admin import admin
from tests.test_graph_flows import DONE, run_until, submit

# -- a workflow whose write is accepted (202) and waits for its confirmation ---------------


class ShipArgs(BaseModel):
    order: int


class Shipped(BaseModel):
    tracking: str


@ratchet.tool(kind="write", args=ShipArgs, result=Shipped, key=lambda a: f"ship:{a.order}")
def ship(ctx: ratchet.ToolContext, args: ShipArgs) -> ratchet.Accepted:
    return ratchet.Accepted(correlation_id=f"ship-{args.order}", timeout=600.0)


@ratchet.tool(kind="read", args=ShipArgs, result=Shipped)
def lookup(ctx: ratchet.ToolContext, args: ShipArgs) -> Shipped:
    return Shipped(tracking=f"TRK-{args.order}")


shipping = ratchet.Workflow("shipping")


@shipping.step
async def send(ctx: ratchet.StepContext) -> dict[str, Any]:
    shipped = await ctx.call(ship, {"order": ctx.input["order"]})
    return {"output": {"tracking": shipped.tracking}}


looks = ratchet.Workflow("looks")


@looks.step
async def look(ctx: ratchet.StepContext) -> dict[str, Any]:
    found = await ctx.call(lookup, {"order": 1})
    return {"output": {"tracking": found.tracking}}


app = ratchet.Registry([shipping, looks, three], tools=[ship, lookup])


# -- helpers --------------------------------------------------------------------------------


async def snapshot(node: ratchet.Node, task_id: str) -> tuple[Any, ...]:
    """What a forged message must not change: the task's row, its events, the audit."""
    assert node.store is not None
    rec = await node.store.load_task(task_id)
    return (rec.status, rec.version, rec.current_node, rec.control,
            await node.store.events(task_id), await node.store.audit_log())


def mail(type_: str, body: dict[str, Any]) -> Envelope:
    mid = new_id("msg")
    return Envelope(type=type_, message_id=mid, correlation_id=mid, body=body)


# -- resolutions must name the open wait ---------------------------------------------------


async def test_a_resolution_naming_another_correlation_id_does_not_complete_a_wait(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(graph_app)
    task_id, events = await submit(client, "wait", {"order": 42}, "cid-1", {"wait.started"})
    other, _ = await submit(client, "wait", {"order": 43}, "cid-2", {"wait.started"})
    before, others = await snapshot(node, task_id), await snapshot(node, other)
    for cid in ("order-43", "order-nobody"):  # another task's open wait, and none at all
        ref = await node.tasks.ensure_running(task_id)  # as a router delivers: past the seal
        assert ref is not None
        outcome = await ref.ask(DeliverMail(mail("external.resolved", {
            "correlation_id": cid, "wait_kind": "node:shipped", "outcome": "completed",
            "result": {"tracking": "FORGED"}})), timeout=10)
        assert outcome == "ignored"
    assert await snapshot(node, task_id) == before
    assert await snapshot(node, other) == others
    assert node.store is not None
    assert await node.store.find_wait("acme", "order-43") == (other, "node:shipped")
    await client.publish_signed(external_subject("acme"), encode(mail("external.resolved", {
        "correlation_id": "order-42", "outcome": "completed", "result": {"tracking": "T"}})))
    done = await run_until(client, task_id, DONE, after=events[-1].sequence)
    assert done[-1].payload["output"] == {"tracking": "T"}


async def test_a_confirmation_of_an_accepted_action_must_name_its_wait(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id = await client.submit("shipping", {"order": 7}, key="cid-3")
    await run_until(client, task_id, {"task.waiting_external"})
    before = await snapshot(node, task_id)
    ref = await node.tasks.ensure_running(task_id)
    assert ref is not None
    outcome = await ref.ask(DeliverMail(mail("external.resolved", {
        "correlation_id": "ship-8", "key": "ship:7", "wait_kind": "action:ship:7",
        "outcome": "completed", "result": {"tracking": "FORGED"}})), timeout=10)
    assert outcome == "ignored"
    assert await snapshot(node, task_id) == before
    await client.publish_signed(external_subject("acme"), encode(mail("external.resolved", {
        "correlation_id": "ship-7", "outcome": "completed", "result": {"tracking": "TRK-7"}})))
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"tracking": "TRK-7"}


# -- scoped kill switches -------------------------------------------------------------------


async def queued(client: ratchet.Client, task_id: str) -> None:
    async for event in client.watch(task_id):
        if event.type == "task.queued":
            return


async def test_a_tenants_freeze_holds_only_its_tasks_and_a_system_freeze_holds_all(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node()
    olga = await client_as(node, nats_url, "olga", "acme", ["operator", "producer"])
    gus = await client_as(node, nats_url, "gus", "globex", ["operator", "producer"])
    frozen = await admin(olga, "freeze", command_id="f1")
    assert frozen.result is not None and frozen.result["scope"] == "acme"
    held = await olga.submit("three", {}, key="held")
    await asyncio.wait_for(queued(olga, held), 10)
    free = await gus.submit("three", {}, key="free")
    assert (await wait_terminal(gus, free))[-1].type == "task.succeeded"
    assert (await olga.get(held)).status == "QUEUED" and RUNS[f"{held}:s0"] == 0
    # Only the platform's operators freeze the cluster.
    denied = await admin(gus, "freeze", command_id="f2", tenant="_system")
    assert denied.error is not None and denied.error.code == "PERMISSION_DENIED"
    everywhere = await admin(client, "freeze", command_id="f3", tenant="_system")
    assert everywhere.result is not None and everywhere.result["scope"] == "_system"
    later = await gus.submit("three", {}, key="later")
    await asyncio.wait_for(queued(gus, later), 10)
    thawed = await admin(olga, "thaw", command_id="f4")
    assert thawed.result is not None and thawed.result["frozen"] is True  # the cluster's
    assert node.store is not None
    assert await node.store.switches() == [("_system", "freeze", "dispatch")]
    assert (await gus.get(later)).status == "QUEUED"
    await admin(client, "thaw", command_id="f5", tenant="_system")
    assert (await wait_terminal(olga, held))[-1].type == "task.succeeded"
    assert (await wait_terminal(gus, later))[-1].type == "task.succeeded"
    for c in (olga, gus):
        await c.close()


async def test_a_tenants_disabled_tool_is_refused_to_its_tasks_only(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node(app)
    olga = await client_as(node, nats_url, "olga", "acme", ["operator", "producer"])
    gus = await client_as(node, nats_url, "gus", "globex", ["operator", "producer"])
    off = await admin(olga, "disable-tool", command_id="t1", args={"tool": "lookup"})
    assert off.result == {"disabled": ["lookup"]}
    refused = await wait_terminal(olga, await olga.submit("looks", {}, key="t-acme"))
    assert refused[-1].type == "task.failed"
    assert refused[-1].payload["error"]["code"] == "UNAVAILABLE"
    allowed = await wait_terminal(gus, await gus.submit("looks", {}, key="t-globex"))
    assert allowed[-1].payload["output"] == {"tracking": "TRK-1"}
    await admin(client, "disable-tool", command_id="t2", tenant="_system",
                args={"tool": "lookup"})
    now_refused = await wait_terminal(gus, await gus.submit("looks", {}, key="t-globex-2"))
    assert now_refused[-1].type == "task.failed"
    assert node.store is not None
    assert sorted(await node.store.switches()) == [("_system", "tool", "lookup"),
                                                   ("acme", "tool", "lookup")]
    for c in (olga, gus):
        await c.close()
