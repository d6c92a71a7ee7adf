"""Defence in depth inside the node (docs/security.md, "Inside the node"): against a NATS
that lets anyone publish anywhere — the fixture's server has no authentication at all —
the node's own checks hold.

- A resolution of an external wait must name an open wait of the task it reaches.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.task.actor import DeliverMail
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from tests.apps import three
from tests.conftest import NodeFactory, wait_terminal
from tests.graph_apps import app as graph_app
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
