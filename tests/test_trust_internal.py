"""Defence in depth inside the node (docs/security.md, "Inside the node"): against a NATS
that lets anyone publish anywhere — the fixture's server has no authentication at all —
the node's own checks hold.

- A resolution of an external wait must name an open wait of the task it reaches.
- Kill switches are scoped: a tenant's freeze or disabled tool holds only its tasks; the
  ``_system`` ones hold every tenant's.
- Mail must carry the cluster's seal: a forged decision, cancel, timer or confirmation
  published straight onto ``ratchet.mail.…`` is dead-lettered and changes nothing (task
  state, events, audit), while the runtime's own mail goes on working; so must requests
  on a node's own subject (``ratchet.node.<node>.…``).
- The node publishes nowhere a payload or a reply subject names unless it is an inbox of
  the right key (no confused deputy).
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel

import ratchet
from ratchet.actors.task.actor import DeliverMail
from ratchet.protocol.codec import decode_map, encode
from ratchet.protocol.errors import RemoteError
from ratchet.protocol.ids import new_id, task_id_for
from ratchet.protocol.mail_seal import MAC_HEADER
from ratchet.protocol.messages import Envelope, Reply, SubmitTask
from ratchet.protocol.subjects import STREAM_DLQ, external_subject, mail_subject
from tests.apps import RUNS, three
from tests.conftest import NodeFactory, wait_terminal
from tests.graph_apps import app as graph_app
from tests.keys import client_as
from tests.test_admin import OPERATOR, admin
from tests.test_graph_flows import DONE, PARKED, decide, run_until, submit, until_settled

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
    task_id = (await client.submit("shipping", {"order": 7}, key="cid-3")).task_id
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
    held = (await olga.submit("three", {}, key="held")).task_id
    await asyncio.wait_for(queued(olga, held), 10)
    free = (await gus.submit("three", {}, key="free")).task_id
    assert (await wait_terminal(gus, free))[-1].type == "task.succeeded"
    assert (await olga.get(held)).status == "QUEUED" and RUNS[f"{held}:s0"] == 0
    # Only the platform's operators freeze the cluster.
    denied = await admin(gus, "freeze", command_id="f2", tenant="_system")
    assert denied.error is not None and denied.error.code == "PERMISSION_DENIED"
    everywhere = await admin(client, "freeze", command_id="f3", tenant="_system")
    assert everywhere.result is not None and everywhere.result["scope"] == "_system"
    later = (await gus.submit("three", {}, key="later")).task_id
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
    refused = await wait_terminal(olga, (await olga.submit("looks", {}, key="t-acme")).task_id)
    assert refused[-1].type == "task.failed"
    assert refused[-1].payload["error"]["code"] == "UNAVAILABLE"
    allowed = await wait_terminal(gus, (await gus.submit("looks", {}, key="t-globex")).task_id)
    assert allowed[-1].payload["output"] == {"tracking": "TRK-1"}
    await admin(client, "disable-tool", command_id="t2", tenant="_system",
                args={"tool": "lookup"})
    now_refused = await wait_terminal(gus, (await gus.submit("looks", {}, key="t-globex-2")).task_id)
    assert now_refused[-1].type == "task.failed"
    assert node.store is not None
    assert sorted(await node.store.switches()) == [("_system", "tool", "lookup"),
                                                   ("acme", "tool", "lookup")]
    for c in (olga, gus):
        await c.close()


# -- the mail seal ---------------------------------------------------------------------------


async def forge(client: ratchet.Client, task_id: str, *envs: Envelope) -> None:
    """Publish ``envs`` as mail to the task the way an intruder can (JetStream, no seal),
    and wait (bounded) until the mail router has dead-lettered each as UNAUTHENTICATED."""
    dlq = await client.js.pull_subscribe("ratchet.dlq.mail.>", new_id("dlq"),
                                         stream=STREAM_DLQ)
    for env in envs:
        await client.js.publish(mail_subject(task_id, "task"), encode(env))
    letters = []
    while len(letters) < len(envs):
        letters += await dlq.fetch(len(envs) - len(letters), timeout=10)
    for msg in letters:
        assert msg.headers is not None and msg.headers["Ratchet-Error-Code"] == "UNAUTHENTICATED"
    assert sorted(decode_map(m.data)["message_id"] for m in letters) == \
        sorted(e.message_id for e in envs)


async def test_a_forged_approval_decision_in_mail_changes_nothing_and_a_signed_one_decides(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(graph_app)
    task_id, events = await submit(client, "approve", {"amount": 900}, "forge-1", PARKED)
    asked = events[-1].payload
    before = await snapshot(node, task_id)
    await forge(client, task_id, mail("approval.decision", {
        "task_id": task_id, "approval_id": asked["approval_id"], "decision": "approve",
        "decided_by": "mallory", "request_hash": asked["request_hash"]}))
    assert await snapshot(node, task_id) == before
    assert node.seal.refused == 1
    await decide(client, task_id, asked["approval_id"], "approve", asked["request_hash"])
    done = await run_until(client, task_id, DONE, after=events[-1].sequence)
    decided = next(e for e in done if e.type == "approval.decided")
    assert decided.payload["decided_by"] == "local-admin"  # the signer, never "mallory"
    assert done[-1].payload["output"] == {"paid": 900}


async def test_a_forged_cancel_in_mail_changes_nothing_and_an_operators_cancel_is_audited(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(graph_app)
    task_id, events = await submit(client, "approve", {"amount": 5}, "forge-2", PARKED)
    before = await snapshot(node, task_id)
    await forge(client, task_id, mail("task.control", {
        "action": "cancel", "request": {"by": "mallory", "reason": "forged"}}))
    assert await snapshot(node, task_id) == before
    reply = await admin(client, "cancel", command_id="real-cancel", principal=OPERATOR,
                        task_id=task_id)
    assert reply.ok, reply.error
    done = await run_until(client, task_id, DONE, after=events[-1].sequence)
    assert done[-1].type == "task.cancelled" and done[-1].payload["by"] == "local-admin"
    assert node.store is not None
    audited = [(e["command_id"], e["outcome"]) for e in await node.store.audit_log("acme")]
    assert ("real-cancel", "ok") in audited


async def test_a_forged_approval_timeout_does_not_escalate_an_hour_early(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(graph_app, clock=clock)
    task_id, events = await submit(client, "approve", {"amount": 900}, "forge-3", PARKED)
    approval_id = events[-1].payload["approval_id"]
    before = await snapshot(node, task_id)
    timer_id = f"apr:{approval_id}"
    await forge(client, task_id, mail("timer.fired", {
        "kind": "approval_timeout", "timer_id": timer_id,
        "payload": {"approval_id": approval_id, "node": "manager"}}))
    assert await snapshot(node, task_id) == before
    clock.advance(3600.0)  # the real hour: the real timer escalates
    events = await run_until(client, task_id, PARKED, after=events[-1].sequence)
    assert events[0].type == "approval.timed_out"
    assert events[0].payload["escalated_to"] == "director"


async def test_a_forged_branch_timeout_does_not_fail_the_fanout(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(graph_app, clock=clock)
    # a is required and hangs; b (required) and c finish: the join waits for a alone.
    task_id = (await client.submit("fan.budget", {"hang": ["a"]}, key="forge-4")).task_id
    await until_settled(client, task_id, 2)
    before = await snapshot(node, task_id)
    await forge(client, task_id, mail("timer.fired", {
        "kind": "branch_timeout", "timer_id": f"branch:{task_id}:spread#0:a",
        "payload": {"key": "spread#0", "branch": "a", "node": "spread"}}))
    assert await snapshot(node, task_id) == before
    assert (await client.get(task_id)).status == "RUNNING"
    clock.advance(5.0)  # a's real budget runs out: its real timer and branch.done mail
    events = await run_until(client, task_id, DONE)
    assert [e.payload["branch"] for e in events if e.type == "branch.timed_out"] == ["a"]
    assert events[-1].type == "task.failed"


async def test_a_forged_confirmation_in_mail_does_not_complete_a_wait(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(graph_app)
    task_id, events = await submit(client, "wait", {"order": 42}, "forge-5", {"wait.started"})
    before = await snapshot(node, task_id)
    await forge(client, task_id, mail("external.resolved", {
        "correlation_id": "order-42", "wait_kind": "node:shipped", "outcome": "completed",
        "result": {"tracking": "FORGED"}}))
    assert await snapshot(node, task_id) == before
    await client.publish_signed(external_subject("acme"), encode(mail("external.resolved", {
        "correlation_id": "order-42", "outcome": "completed", "result": {"tracking": "TRK-1"}})))
    done = await run_until(client, task_id, DONE, after=events[-1].sequence)
    assert done[-1].payload["output"] == {"tracking": "TRK-1"}


async def test_mail_sealed_for_another_subject_or_payload_is_refused(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(graph_app)
    task_id, _ = await submit(client, "approve", {"amount": 1}, "forge-6", PARKED)
    before = await snapshot(node, task_id)
    env = mail("task.control", {"action": "cancel", "request": {"by": "mallory"}})
    elsewhere = node.seal.headers(mail_subject("tsk_other", "task"), encode(env))
    dlq = await client.js.pull_subscribe("ratchet.dlq.mail.>", "moved", stream=STREAM_DLQ)
    await client.js.publish(mail_subject(task_id, "task"), encode(env), headers=elsewhere)
    [letter] = await dlq.fetch(1, timeout=10)
    assert letter.headers is not None
    assert letter.headers["Ratchet-Error-Code"] == "UNAUTHENTICATED"
    assert await snapshot(node, task_id) == before


async def test_a_request_on_a_nodes_own_subject_must_carry_the_seal(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    first = await start_node(node_id="n1")
    await start_node(node_id="n2")
    body = {"command_id": new_id("cmd"), "args": {"node": "n2"}}
    signed_for = "ratchet.admin._system.clock-ack"

    async def ask(headers: dict[str, str]) -> Reply:
        env = mail("admin.clock-ack", {**body, "command_id": new_id("cmd")})
        data = encode(env)
        direct = "ratchet.node.n1.admin._system.clock-ack"
        msg = await client.nc.request(direct, data, timeout=10, headers={
            **client.sign(signed_for, data),
            **{k: v(direct, data) for k, v in headers.items()}})
        return Reply.model_validate(decode_map(msg.data))

    unsealed = await ask({})
    assert unsealed.error is not None and unsealed.error.code == "UNAUTHENTICATED"
    assert first.seal.refused == 1
    # Sealed as a node's: n1 takes it and passes it on (sealed by itself) to n2.
    sealed = await ask({MAC_HEADER: lambda s, d: first.seal.mac(s, d)})
    assert sealed.ok, sealed.error
    assert sealed.result is not None and sealed.result["node"] == "n2"


# -- no confused deputy ---------------------------------------------------------------------


async def nothing_arrives(sub: Any, bound: float = 0.5) -> None:
    """Nothing was delivered to ``sub``, and nothing comes within ``bound`` seconds (called
    after a later marker message has arrived)."""
    with pytest.raises(NatsTimeout):
        msg = await sub.next_msg(timeout=bound)
        raise AssertionError(f"the node published on {msg.subject}")


async def test_a_get_replying_into_another_tenants_events_is_not_answered_there(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node()
    victim = (await client.submit("three", {}, key="victim")).task_id
    await wait_terminal(client, victim)
    target = f"ratchet.events.acme.{victim}.task.succeeded"
    watcher = await nats.connect(nats_url)
    sub = await watcher.subscribe(target)
    await watcher.flush()
    gus = await client_as(node, nats_url, "gus", "globex", ["producer"])
    subject = "ratchet.api.globex.get"
    data = encode(mail("task.get", {"task_id": victim}))
    await gus.nc.publish(subject, data, reply=target, headers=gus.sign(subject, data))
    with pytest.raises(RemoteError) as marker:  # answered, on gus's own inbox
        await gus.get(victim)
    assert marker.value.wire_code == "NOT_FOUND"  # another tenant's task: no existence leak
    await nothing_arrives(sub)
    await gus.close()
    await watcher.close()


async def test_a_submits_reply_to_is_answered_only_under_an_inbox_of_its_tenants_keys(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node()
    victim = (await client.submit("three", {}, key="victim")).task_id
    await wait_terminal(client, victim)
    gus = await client_as(node, nats_url, "gus", "globex", ["producer"])
    alice = await client_as(node, nats_url, "alice", "acme", ["producer"])
    assert gus.signer is not None and alice.signer is not None
    refused = [f"ratchet.events.acme.{victim}.task.succeeded",  # a Ratchet subject
               f"_INBOX.{alice.signer.public_key}.stolen",  # another tenant's key's inbox
               "_INBOX.nobody.x"]  # not a key of the keyring
    wildcard = f"_INBOX.{gus.signer.public_key}.>"  # gus's own inbox, but a wildcard
    own = f"_INBOX.{gus.signer.public_key}.own"
    watcher = await nats.connect(nats_url)
    subs = [await watcher.subscribe(s) for s in refused]
    answered = await watcher.subscribe(own)
    await watcher.flush()
    keys = []
    for i, reply_to in enumerate([*refused, wildcard, own]):
        key, mid = f"deputy-{i}", new_id("msg")
        env = Envelope(type="task.submit", message_id=mid, correlation_id=mid,
                       reply_to=reply_to, body=SubmitTask(
                           workflow="three", idempotency_key=key, input={}).model_dump())
        await gus.js.publish("ratchet.submit.globex", encode(env),
                             headers={"Nats-Msg-Id": f"globex:{key}"})
        keys.append(key)
    reply = Reply.model_validate(decode_map((await answered.next_msg(timeout=10)).data))
    assert reply.ok and reply.result is not None
    # Every submit was accepted all the same: each task runs to its end (the markers).
    for key in keys:
        task_id = task_id_for("globex", key)
        assert (await wait_terminal(gus, task_id))[-1].type == "task.succeeded"
    for sub in subs:
        await nothing_arrives(sub, bound=0.2)
    assert node.authn.refused["reply_to"] == len(refused) + 1
    for c in (gus, alice):
        await c.close()
    await watcher.close()
