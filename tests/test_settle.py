"""Settling what a machine could not, over NATS with signed commands on a real node:
``resolve``, ``retry-action``, ``skip-step`` and ``approvals``, steps that declare
``on_exhausted="human"``, and the handoff package a human gets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ratchet
from ratchet.actors.task.settle import continuation
from ratchet.supervisors.cli.admin import settle_args
from ratchet.supervisors.cli.parser import parser
from tests import settle_apps
from tests.conftest import NodeFactory, wait_terminal
from tests.keys import client_as
from tests.settle_apps import CHARGE, FLAKY, PAY
from tests.test_admin import admin

APPROVER = {"name": "ana", "roles": ["approver"]}
KEY = "pay:o1"


@pytest.fixture(autouse=True)
def _fresh_apps() -> None:
    PAY.update(mode="unknown", calls=0)
    FLAKY.update(fail=True, runs=0)
    CHARGE.update(fail=True, calls=0)


async def parked(client: ratchet.Client, task_id: str, timeout: float = 20.0) -> ratchet.Event:
    """The task's first event that hands it to a human (bounded wait)."""
    async def first() -> ratchet.Event:
        async for event in client.watch(task_id):
            if event.type in ("task.unknown", "task.handoff"):
                return event
        raise AssertionError("the task finished without a handoff")

    return await asyncio.wait_for(first(), timeout)


async def unknown_payment(start_node: NodeFactory, client: ratchet.Client
                          ) -> tuple[ratchet.Node, str, str]:
    """A node and a task UNKNOWN on its payment, with the payment's request hash."""
    node = await start_node(settle_apps.registry)
    task_id = (await client.submit("settle.pay", {}, key="order-1")).task_id
    await parked(client, task_id)
    assert node.store is not None
    row = await node.store.get_action("acme", KEY)
    assert row is not None and row.status == "UNKNOWN"
    return node, task_id, row.request_hash


def resolve_args(digest: str, **extra: Any) -> dict[str, Any]:
    return {"action": KEY, "outcome": "succeeded", "request_hash": digest,
            "evidence": "provider console shows payment p-77 settled", **extra}


async def test_resolve_succeeded_continues_the_task_with_the_humans_result(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node, task_id, digest = await unknown_payment(start_node, client)
    reply = await admin(client, "resolve", command_id="r1", principal=APPROVER,
                        task_id=task_id,
                        args=resolve_args(digest, result={"provider_id": "p-77"}))
    assert reply.ok and reply.result is not None, reply.error
    assert reply.result["then"] == "the task runs its step again from its last checkpoint"
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"paid": "p-77"}
    assert PAY["calls"] == 1  # settled by the human: never re-sent
    settled = next(e for e in events if e.type == "action.human_resolved")
    assert settled.payload["outcome"] == "succeeded" and settled.payload["from"] == "UNKNOWN"
    assert settled.payload["evidence"].startswith("provider console")
    assert "task.human_resolved" in [e.type for e in events]
    assert node.store is not None
    row = await node.store.get_action("acme", KEY)
    assert row is not None and (row.status, row.provider_id) == ("SUCCEEDED", "p-77")
    [handoff] = await node.store.handoffs(task_id)
    assert handoff["resolved_at"] is not None
    audit = [(e["verb"], e["outcome"]) for e in await node.store.audit_log("acme")
             if e["command_id"] == "r1"]
    assert audit == [("resolve", "requested"), ("resolve", "ok")]
    [applied] = [e for e in await node.store.audit_log("acme") if e["outcome"] == "applied"]
    assert applied["verb"] == "resolve" and applied["detail"]["command_id"] == "r1"
    assert applied["detail"]["evidence"].startswith("provider console")
    assert (await node.store.verify_audit()).ok


async def test_resolve_failed_lets_the_workflow_route_the_failure(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id, digest = await unknown_payment(start_node, client)
    reply = await admin(client, "resolve", command_id="r2", principal=APPROVER,
                        task_id=task_id, args=resolve_args(digest, outcome="failed"))
    assert reply.ok, reply.error
    events = await wait_terminal(client, task_id)
    # The step re-ran; the ledger answered ActionFailed and the step caught it.
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"paid": None}
    assert PAY["calls"] == 1


async def test_resolve_is_refused_for_a_wrong_hash_an_unknown_action_a_stranger_and_a_role(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node, task_id, digest = await unknown_payment(start_node, client)
    cases = {
        "CONFLICT": dict(args=resolve_args("sha256:" + "0" * 64)),
        "NOT_FOUND": dict(args={**resolve_args(digest), "action": "pay:nope"}),
        "INVALID_ARGUMENT": dict(args=resolve_args(digest, result={"wrong": 1})),
    }
    for i, (code, kw) in enumerate(cases.items()):
        reply = await admin(client, "resolve", command_id=f"x{i}", principal=APPROVER,
                            task_id=task_id, **kw)
        assert reply.error is not None and reply.error.code == code, (code, reply)
    stranger = await admin(client, "resolve", command_id="x9", principal=APPROVER,
                           task_id=task_id, tenant="other", args=resolve_args(digest))
    assert stranger.error is not None and stranger.error.code == "NOT_FOUND"
    olga = await client_as(node, nats_url, "olga", "acme", roles=["operator", "viewer"])
    try:
        refused = await admin(olga, "resolve", command_id="x10", task_id=task_id,
                              principal={"name": "olga", "roles": ["approver"]},
                              args=resolve_args(digest))
        assert refused.error is not None and refused.error.code == "PERMISSION_DENIED"
    finally:
        await olga.close()
    assert (await client.get(task_id)).status == "UNKNOWN"  # nothing of it took effect
    assert PAY["calls"] == 1


async def test_retry_action_resends_under_the_same_key_and_the_task_goes_on(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id, digest = await unknown_payment(start_node, client)
    PAY["mode"] = "ok"  # the provider had no record of it; it works now
    reply = await admin(client, "retry-action", command_id="t1", principal=APPROVER,
                        task_id=task_id, args={"action": KEY, "request_hash": digest,
                                               "evidence": "not in the provider's log"})
    assert reply.ok, reply.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"paid": f"p-{KEY}"}
    assert PAY["calls"] == 2
    started = [e.payload for e in events if e.type == "action.started"]
    assert started[-1]["key"] == KEY and started[-1].get("resumed") is True


async def test_retry_action_of_a_settled_action_is_refused(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id, digest = await unknown_payment(start_node, client)
    await admin(client, "resolve", command_id="s1", principal=APPROVER, task_id=task_id,
                args=resolve_args(digest, result={"provider_id": "p-1"}))
    await wait_terminal(client, task_id)
    again = await admin(client, "retry-action", command_id="s2", principal=APPROVER,
                        task_id=task_id, args={"action": KEY, "request_hash": digest})
    assert again.error is not None and again.error.code == "ILLEGAL_TRANSITION"


async def test_the_handoff_package_holds_what_a_human_needs(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id, digest = await unknown_payment(start_node, client)
    reply = await admin(client, "handoff", command_id="h1", task_id=task_id)
    assert reply.result is not None
    package = reply.result["handoffs"][-1]["package"]
    assert (package["tenant"], package["task_id"], package["workflow"],
            package["workflow_version"], package["node"]) == (
        "acme", task_id, "settle.pay", 2, "charge")
    assert package["reason"] == "outcome unknown and the tool has no query"
    [action] = package["actions"]
    assert (action["key"], action["status"], action["request_hash"]) == (KEY, "UNKNOWN", digest)
    assert action["request"] == {"order": "o1", "amount": 5.0}
    assert action["error"]["message"]
    assert package["effective"] == [] and package["compensable"] == []
    assert isinstance(package["spent"], dict) and isinstance(package["budget"], dict)
    assert package["last_errors"][-1]["type"] == "action.unknown"
    assert package["recommended"]["verb"] == "resolve"
    assert package["recommended"]["action"] == KEY
    assert digest in package["recommended"]["command"]


async def exhausted(start_node: NodeFactory, client: ratchet.Client, workflow: str
                    ) -> tuple[ratchet.Node, str]:
    node = await start_node(settle_apps.registry, max_step_attempts=2)
    task_id = (await client.submit(workflow, {}, key=f"{workflow}-1")).task_id
    event = await parked(client, task_id)
    assert event.type == "task.handoff"
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    return node, task_id


async def test_a_step_out_of_attempts_goes_to_a_human_and_approve_runs_it_again(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id = await exhausted(start_node, client, "settle.flaky")
    assert FLAKY["runs"] == 2
    got = await admin(client, "get", command_id="g1", task_id=task_id)
    assert got.result is not None
    waiting = got.result["waiting_for"]
    assert waiting["approval_id"].startswith("apr") and waiting["node"] == "@exhausted"
    assert waiting["deadline"] is None and waiting["escalation"] is None
    assert waiting["reason"] == "step fetch failed 2 times"
    assert waiting["recommended"]["verb"] == "approve"
    listed = await admin(client, "approvals", command_id="l1")
    assert listed.result is not None
    kinds = {(w["kind"], w["task_id"]) for w in listed.result["waiting"]}
    assert kinds == {("approval", task_id), ("handoff", task_id)}
    assert all(w["age_s"] >= 0 for w in listed.result["waiting"])
    FLAKY["fail"] = False  # the upstream is fixed
    approved = await admin(client, "approve", command_id="a1", principal=APPROVER,
                           task_id=task_id, args={"approval_id": waiting["approval_id"],
                                                  "request_hash": waiting["request_hash"]})
    assert approved.ok, approved.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"fetched": True}
    after = await admin(client, "approvals", command_id="l2")
    assert after.result is not None and after.result["waiting"] == []


async def test_a_call_out_of_retries_goes_to_a_human_and_approve_makes_it_once_more(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """The provider answered 503 to both tries: the step's ``on_exhausted="human"`` holds
    for the call's exhausted retries too; approved, the call goes once more under its key
    and, the provider back, takes effect once."""
    node, task_id = await exhausted(start_node, client, "settle.card")
    assert CHARGE["calls"] == 2
    got = await admin(client, "get", command_id="g1", task_id=task_id)
    assert got.result is not None
    waiting = got.result["waiting_for"]
    assert waiting["node"] == "@exhausted"
    assert node.store is not None
    approval = await node.store.approval(waiting["approval_id"])
    assert approval is not None and approval["request"]["action"] == "charge:o9"
    CHARGE["fail"] = False  # the provider is back
    approved = await admin(client, "approve", command_id="a1", principal=APPROVER,
                           task_id=task_id, args={"approval_id": waiting["approval_id"],
                                                  "request_hash": waiting["request_hash"]})
    assert approved.ok, approved.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"paid": "c-charge:o9"}
    assert CHARGE["calls"] == 3
    row = await node.store.get_action("acme", "charge:o9")
    assert row is not None and row.status == "SUCCEEDED"


async def test_a_call_refused_for_good_still_fails_a_human_step(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """Not every failed call is exhausted: a 403 is never retried, so the step fails at
    once even though it would go to a human when out of attempts."""
    node = await start_node(settle_apps.registry, max_step_attempts=2)
    CHARGE["fail"] = "forbidden"
    task_id = (await client.submit("settle.card", {}, key="card-403")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert CHARGE["calls"] == 1 and (await client.get(task_id)).status == "FAILED"
    assert node.store is not None and await node.store.task_approvals(task_id) == []


async def test_reject_at_an_exhausted_step_fails_the_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id = await exhausted(start_node, client, "settle.flaky")
    got = await admin(client, "get", command_id="g2", task_id=task_id)
    assert got.result is not None
    rejected = await admin(client, "reject", command_id="j1", principal=APPROVER,
                           task_id=task_id,
                           args={"approval_id": got.result["waiting_for"]["approval_id"]})
    assert rejected.ok, rejected.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"


async def test_skip_step_moves_past_a_skippable_step_and_only_that(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    _, task_id = await exhausted(start_node, client, "settle.flaky")
    skipped = await admin(client, "skip-step", command_id="k1", principal=APPROVER,
                          task_id=task_id, args={"reason": "data fetched by hand"})
    assert skipped.ok, skipped.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"fetched": False}
    step = next(e for e in events if e.type == "step.skipped")
    assert (step.payload["step"], step.payload["next"]) == ("fetch", "finish")
    assert FLAKY["runs"] == 2
    rigid = (await client.submit("settle.rigid", {}, key="rigid-1")).task_id
    await parked(client, rigid)
    refused = await admin(client, "skip-step", command_id="k2", principal=APPROVER,
                          task_id=rigid)
    assert refused.error is not None and refused.error.code == "ILLEGAL_TRANSITION"
    assert "skippable" in refused.error.message


async def test_settling_a_task_that_waits_for_no_one_is_refused(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(settle_apps.registry)
    FLAKY["fail"] = False
    task_id = (await client.submit("settle.flaky", {}, key="fine-1")).task_id
    await wait_terminal(client, task_id)
    reply = await admin(client, "skip-step", command_id="n1", principal=APPROVER,
                        task_id=task_id)
    assert reply.error is not None and reply.error.code == "ILLEGAL_TRANSITION"


def test_on_exhausted_takes_fail_or_human_only() -> None:
    wf = ratchet.Workflow("bad", version=1)

    async def step(ctx: ratchet.StepContext) -> None:
        return None

    with pytest.raises(ratchet.WorkflowDefinitionError, match="on_exhausted"):
        wf.add_step("s", step, on_exhausted="retry-forever")


async def test_a_failed_undo_settled_by_hand_lets_the_task_finish_failing(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(settle_apps.registry)
    task_id = (await client.submit("settle.undo", {}, key="undo-1")).task_id
    event = await parked(client, task_id)
    assert event.type == "task.handoff"
    reply = await admin(client, "handoff", command_id="u0", task_id=task_id)
    assert reply.result is not None
    package = reply.result["handoffs"][-1]["package"]
    assert package["why"] == "compensation failed for good"
    assert package["effective"] == ["book:o2"] and package["compensable"] == ["book:o2"]
    recommended = package["recommended"]
    assert (recommended["verb"], recommended["action"]) == ("resolve", "book:o2")
    listed = await admin(client, "approvals", command_id="u1")
    assert listed.result is not None
    assert [(w["kind"], w["why"]) for w in listed.result["waiting"]] == [
        ("handoff", "compensation failed for good")]
    settled = await admin(client, "resolve", command_id="u2", principal=APPROVER,
                          task_id=task_id, args={
                              "action": "book:o2", "outcome": "compensated",
                              "request_hash": recommended["request_hash"],
                              "evidence": "cancelled b-o2 by phone, ticket 4411"})
    assert settled.ok, settled.error
    assert settled.result is not None and settled.result["status"] == "FAILED"
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert node.store is not None
    row = await node.store.get_action("acme", "book:o2")
    assert row is not None and row.status == "COMPENSATED"


async def test_an_agent_answer_still_invalid_after_its_repairs_goes_to_a_human(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(settle_apps.registry)
    task_id = (await client.submit("settle.agent", {}, key="agent-1")).task_id
    event = await parked(client, task_id)
    assert event.type == "task.handoff" and event.payload["node"] == "assistant"
    got = await admin(client, "get", command_id="ag1", task_id=task_id)
    assert got.result is not None and got.result["status"] == "WAITING_APPROVAL"
    waiting = got.result["waiting_for"]
    assert waiting["reason"] == "agent answer invalid"
    approved = await admin(client, "approve", command_id="ag2", principal=APPROVER,
                           task_id=task_id, args={"approval_id": waiting["approval_id"]})
    assert approved.ok, approved.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"limit": 5.0}


async def test_a_viewer_lists_approvals_but_cannot_settle(
    start_node: NodeFactory, client: ratchet.Client, nats_url: str
) -> None:
    node = await start_node(settle_apps.registry)
    vic = await client_as(node, nats_url, "vic", "acme", roles=["viewer"])
    try:
        listed = await admin(vic, "approvals", command_id="v1")
        assert listed.ok and listed.result is not None and listed.result["waiting"] == []
        for i, verb in enumerate(("resolve", "retry-action", "skip-step")):
            refused = await admin(vic, verb, command_id=f"v{i + 2}", task_id="tsk_x",
                                  principal=APPROVER)
            assert refused.error is not None and refused.error.code == "PERMISSION_DENIED"
    finally:
        await vic.close()


@pytest.mark.parametrize(("package", "doubts", "pending", "then"), [
    ({"why": "no query declared"}, [], False, "run"),
    ({"why": "no query declared"}, ["pay:o2"], False, "wait"),
    ({"why": "exhausted"}, [], True, "wait"),
    ({"why": "unresolved actions at failure", "failure": {}}, [], False, "fail"),
    ({"why": "compensation failed for good"}, [], False, "fail"),
    ({"why": "compensation failed for good", "cancel": {"by": "olga"}}, [], False, "cancel"),
    ({"why": "restart intensity exceeded", "pending_compensations": ["k"]}, [], False,
     "fail"),
])
def test_what_a_task_does_once_a_human_settled_an_action(
    package: dict[str, Any], doubts: list[str], pending: bool, then: str
) -> None:
    assert continuation(package, doubts, pending) == then


async def test_get_shows_an_approval_nodes_id_deadline_and_escalation_target(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    from tests.graph_apps import app as graph_app

    clock = ratchet.FakeClock()
    await start_node(graph_app, clock=clock)
    task_id = (await client.submit("approve", {"amount": 70}, key="g-1")).task_id
    async for event in client.watch(task_id):
        if event.type == "approval.requested":
            requested = event.payload
            break
    clock.advance(120.0)
    got = await admin(client, "get", command_id="w1", task_id=task_id)
    assert got.result is not None
    waiting = got.result["waiting_for"]
    assert waiting["approval_id"] == requested["approval_id"]
    assert waiting["deadline"] == requested["expires_at"]
    assert (waiting["escalation"], waiting["approvers"], waiting["node"]) == (
        "director", "managers", "manager")
    listed = await admin(client, "approvals", command_id="w2")
    assert listed.result is not None
    [row] = listed.result["waiting"]  # an approval node is no handoff
    assert (row["kind"], row["approval_id"]) == ("approval", requested["approval_id"])
    assert row["age_s"] == pytest.approx(120.0, abs=1.0)
    stranger = await admin(client, "approvals", command_id="w3", tenant="other")
    assert stranger.result is not None and stranger.result["waiting"] == []


def test_the_cli_sends_the_settling_flags_as_the_verbs_arguments() -> None:
    args = parser().parse_args([
        "admin", "resolve", "tsk_1", "--action", "0042", "--outcome", "succeeded",
        "--request-hash", "sha256:ab", "--evidence", "seen at the bank",
        "--result", '{"provider_id": "p-9"}'])
    assert (args.verb, args.task_id) == ("resolve", "tsk_1")
    assert settle_args(args) == {"action": "0042", "outcome": "succeeded",
                                 "request_hash": "sha256:ab", "evidence": "seen at the bank",
                                 "result": {"provider_id": "p-9"}}
    assert settle_args(parser().parse_args(["admin", "approvals"])) == {}


async def test_a_cancel_whose_undo_failed_goes_on_cancelling_once_settled(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(settle_apps.registry)
    task_id = (await client.submit("settle.cancel", {}, key="cancel-1")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            break
    cancel = await admin(client, "cancel", command_id="c1", principal={"name": "olga"},
                         task_id=task_id, args={"reason": "customer withdrew"})
    assert cancel.ok, cancel.error
    await parked(client, task_id)  # the undo of the booking failed: a human
    got = await admin(client, "get", command_id="c2", task_id=task_id)
    assert got.result is not None and got.result["status"] == "WAITING_APPROVAL"
    recommended = got.result["waiting_for"]["recommended"]
    settled = await admin(client, "resolve", command_id="c3", principal=APPROVER,
                          task_id=task_id, args={
                              "action": "book:o3", "outcome": "compensated",
                              "request_hash": recommended["request_hash"],
                              "evidence": "booking b-o3 released by hand"})
    assert settled.ok, settled.error
    assert settled.result is not None and settled.result["status"] == "CANCELLED"
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.cancelled"
    assert events[-1].payload["by"] == "local-admin"


async def test_a_task_its_supervisor_gave_up_on_gets_a_full_package_and_can_be_settled(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(settle_apps.registry, max_step_attempts=10, task_max_restarts=2,
                     task_backoff_base=0.001, task_backoff_cap=0.01)
    task_id = (await client.submit("settle.giveup", {}, key="giveup-1")).task_id
    event = await parked(client, task_id)
    assert event.payload["reason"] == "restart intensity exceeded"
    reply = await admin(client, "handoff", command_id="gv1", task_id=task_id)
    assert reply.result is not None
    package = reply.result["handoffs"][-1]["package"]
    assert package["pending_compensations"] == ["book:o4"]
    assert (package["tenant"], package["node"], package["compensable"]) == (
        "acme", "crash", ["book:o4"])
    assert package["last_errors"][-1]["type"] == "step.failed"
    recommended = package["recommended"]
    assert (recommended["verb"], recommended["action"]) == ("resolve", "book:o4")
    settled = await admin(client, "resolve", command_id="gv2", principal=APPROVER,
                          task_id=task_id, args={
                              "action": "book:o4", "outcome": "compensated",
                              "request_hash": recommended["request_hash"],
                              "evidence": "booking b-o4 released by hand"})
    assert settled.ok, settled.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
