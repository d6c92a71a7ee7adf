"""Risk tiers at the tool gateway (actors/effects/risk.py): an irreversible call, or a write
above its threshold, parks its task for a human's approval with the proposed call in the
package — no approval node in the graph; approved, the call is made once under its key;
rejected, the step (or the agent) gets APPROVAL_REJECTED; a tenant's policy tightens tiers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.models import ModelRequest
from ratchet.actors.agents.scripted_model import Reply, ScriptedModel, reply
from ratchet.actors.effects.risk_policy import ToolRisk, parse_policy, tightening, why_gated
from ratchet.actors.workflow.tools import Tool, ToolContext, tool
from ratchet.protocol.errors import ToolDefinitionError
from ratchet.supervisors.cli.serve import risk_policy
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import APPROVER, VIEWER, admin


class Order(BaseModel):
    order: str
    amount: float = 0.0


class Done(BaseModel):
    provider_id: str


class Provider:
    """The outside world: every call it receives, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def tool(self, name: str, **risk: Any) -> Tool[Order, Done]:
        async def fn(ctx: ToolContext, args: Order) -> Done:
            self.calls.append(f"{name}:{args.order}")
            return Done(provider_id=f"{name}-{args.order}")

        return tool(kind="write", args=Order, result=Done, name=name,
                    key=lambda a: f"{name}:{a.order}", **risk)(fn)


# -- the tiers as data -------------------------------------------------------------------


def test_which_calls_need_approval_is_a_pure_function_of_the_tier_and_the_amount() -> None:
    p = Provider()
    wire, note = p.tool("wire", risk="irreversible"), p.tool("note")
    refund = p.tool("refund", max_amount=100, amount="amount")
    assert why_gated(wire, Order(order="a"), None) == {"why": "irreversible tool",
                                                        "tier": "irreversible"}
    assert why_gated(note, Order(order="a", amount=10**6), None) is None
    assert why_gated(refund, Order(order="a", amount=100), None) is None  # at the limit: fine
    assert why_gated(refund, Order(order="a", amount=100.5), None) == {
        "why": "amount above threshold", "tier": "write", "amount": 100.5, "max_amount": 100}
    # A tenant tightens, never loosens: the lowest limit wins, approval if any asks it.
    assert why_gated(refund, Order(order="a", amount=30), ToolRisk(max_amount=20)) is not None
    assert why_gated(refund, Order(order="a", amount=150), ToolRisk(max_amount=500)) is not None
    gated = why_gated(note, Order(order="a"), ToolRisk(requires_approval=True))
    assert gated is not None and gated["by"] == "tenant policy"
    # A limit on a tool whose amount cannot be read is not taken as met.
    unreadable = why_gated(note, Order(order="a"), ToolRisk(max_amount=5))
    assert unreadable is not None and unreadable["why"] == "amount unreadable"


def test_a_tenant_policy_is_parsed_and_combined_to_the_tightest_rule() -> None:
    policy = parse_policy({"acme": {"pay": {"requires_approval": True}, "*": {"max_amount": 50}},
                           "*": {"pay": {"max_amount": 10}}})
    assert tightening(policy, "acme", "pay") == ToolRisk(True, 10)
    assert tightening(policy, "acme", "note") == ToolRisk(False, 50)
    assert tightening(policy, "other", "note") is None
    for bad in ({"acme": {"pay": {"max_amount": -1}}}, {"acme": {"pay": {"amount": 3}}},
                {"acme": ["pay"]}, ["acme"]):
        with pytest.raises(ToolDefinitionError):
            parse_policy(bad)


def test_bad_tiers_are_refused_when_the_tool_is_built() -> None:
    p = Provider()
    with pytest.raises(ToolDefinitionError, match="max_amount needs amount"):
        p.tool("x", max_amount=10)
    with pytest.raises(ToolDefinitionError, match="not a field"):
        p.tool("x", max_amount=10, amount="total")
    with pytest.raises(ToolDefinitionError, match="risk must be"):
        p.tool("x", risk="dangerous")

    async def look(ctx: ToolContext, args: Order) -> Done:
        return Done(provider_id="r")

    with pytest.raises(ToolDefinitionError, match="a read cannot be gated"):
        tool(kind="read", args=Order, result=Done, risk="irreversible")(look)
    assert tool(kind="read", args=Order, result=Done)(look).tier == "read"


# -- a node ------------------------------------------------------------------------------


def _registry(p: Provider) -> ratchet.Registry:
    note, wire = p.tool("note"), p.tool("wire", risk="irreversible")
    refund = p.tool("refund", max_amount=100, amount="amount")

    pay = ratchet.Workflow("pay")

    @pay.step
    async def transfer(ctx: ratchet.StepContext) -> dict[str, Any]:
        order = ctx.input["order"]
        await ctx.call(note, Order(order=order))  # made before the park, answered after it
        try:
            done = await ctx.call(wire, Order(order=order, amount=ctx.input["amount"]))
        except ratchet.ActionFailed as refused:
            if refused.code != "APPROVAL_REJECTED":
                raise
            return {"output": {"refused": refused.code, "by": refused.details["decided_by"]}}
        return {"output": {"paid": done.provider_id}}

    pay_back = ratchet.Workflow("refund")

    @pay_back.step
    async def give_back(ctx: ratchet.StepContext) -> dict[str, Any]:
        done = await ctx.call(refund, Order(order=ctx.input["order"],
                                            amount=ctx.input["amount"]))
        return {"output": {"refunded": done.provider_id}}

    noting = ratchet.Workflow("note")

    @noting.step
    async def write_note(ctx: ratchet.StepContext) -> dict[str, Any]:
        done = await ctx.call(note, Order(order=ctx.input["order"]))
        return {"output": {"noted": done.provider_id}}

    shaky = ratchet.Workflow("shaky")

    @shaky.step
    async def wire_then_crash(ctx: ratchet.StepContext) -> dict[str, Any]:
        done = await ctx.call(wire, Order(order=ctx.input["order"]))
        if ctx.attempt == 1:
            raise RuntimeError("crash after the approved call")  # the step runs again
        return {"output": {"paid": done.provider_id, "attempt": ctx.attempt}}

    return ratchet.Registry([pay, pay_back, noting, shaky], tools=[note, wire, refund])


async def _parked(client: ratchet.Client, workflow: str, order: str,
                  amount: float = 0.0) -> tuple[str, dict[str, Any]]:
    """Submit; wait until the gate parks the task (its ``approval.requested``)."""
    task_id = (await client.submit(workflow, {"order": order, "amount": amount}, key=order)).task_id
    async for event in client.watch(task_id):
        assert not event.type.startswith("task.") or event.type in (
            "task.queued", "task.started", "task.handoff"), event
        if event.type == "approval.requested":
            return task_id, event.payload
    raise AssertionError("the task was not parked")


async def _decide(client: ratchet.Client, verb: str, task_id: str,
                  requested: dict[str, Any]) -> None:
    reply_ = await admin(client, verb, command_id=f"{verb}-{task_id}", principal=APPROVER,
                         task_id=task_id, args={"approval_id": requested["approval_id"],
                                                "request_hash": requested["request_hash"],
                                                "reason": "checked the payee"})
    assert reply_.ok, reply_.error


async def test_an_irreversible_call_is_parked_with_the_proposed_call_and_made_once_on_approve(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    node = await start_node(_registry(p))
    task_id, requested = await _parked(client, "pay", "o1", amount=900)
    assert requested["node"] == "@gate"
    assert {k: requested["request"][k] for k in ("kind", "tool", "key", "args", "why")} == {
        "kind": "risk_gate", "tool": "wire", "key": "wire:o1",
        "args": {"order": "o1", "amount": 900}, "why": "irreversible tool"}
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
    assert p.calls == ["note:o1"]  # the gated call was not made, nor recorded
    assert [a.key for a in await node.store.task_actions(task_id)] == ["note:o1"]
    shown = await admin(client, "handoff", command_id="h1", principal=VIEWER, task_id=task_id)
    assert shown.result is not None
    [handoff] = shown.result["handoffs"]
    assert handoff["package"]["approval_id"] == requested["approval_id"]
    assert handoff["package"]["args"] == {"order": "o1", "amount": 900}
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # passivated

    await _decide(client, "approve", task_id, requested)
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"paid": "wire-o1"}
    assert p.calls == ["note:o1", "wire:o1"]  # each once: the re-run step's note was reused
    decided = next(e for e in events if e.type == "approval.decided")
    assert (decided.payload["kind"], decided.payload["tool"]) == ("risk_gate", "wire")
    assert [e.payload["key"] for e in events if e.type == "action.reused"] == ["note:o1"]
    assert [a.status for a in await node.store.task_actions(task_id)] == ["SUCCEEDED"] * 2


async def test_an_approved_call_is_made_once_even_when_its_step_runs_again(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    await start_node(_registry(p))
    task_id, requested = await _parked(client, "shaky", "s1")
    await _decide(client, "approve", task_id, requested)
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"paid": "wire-s1", "attempt": 2}
    assert p.calls == ["wire:s1"]  # the re-run found it in the ledger, not at the gate
    assert [e.type for e in events].count("approval.requested") == 1
    assert [e.payload["key"] for e in events if e.type == "action.reused"] == ["wire:s1"]


async def test_a_rejected_call_is_never_made_and_the_step_routes_on_the_typed_refusal(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    node = await start_node(_registry(p))
    task_id, requested = await _parked(client, "pay", "o2")
    await _decide(client, "reject", task_id, requested)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"refused": "APPROVAL_REJECTED", "by": "local-admin"}
    assert p.calls == ["note:o2"]
    assert [a.key for a in await node.store.task_actions(task_id)] == ["note:o2"]


async def test_a_write_above_its_threshold_waits_for_approval_and_one_below_does_not(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    await start_node(_registry(p))
    small = (await client.submit("refund", {"order": "r1", "amount": 40}, key="r1")).task_id
    events = await wait_terminal(client, small)
    assert events[-1].payload["output"] == {"refunded": "refund-r1"}
    assert "approval.requested" not in [e.type for e in events]
    task_id, requested = await _parked(client, "refund", "r2", amount=250)
    assert (requested["request"]["why"], requested["request"]["amount"],
            requested["request"]["max_amount"]) == ("amount above threshold", 250, 100)
    assert p.calls == ["refund:r1"]
    await _decide(client, "approve", task_id, requested)
    assert (await wait_terminal(client, task_id))[-1].payload["output"] == {
        "refunded": "refund-r2"}


async def test_a_tenant_policy_tightens_a_plain_write_and_a_threshold(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    await start_node(_registry(p), risk_policy={
        "acme": {"note": ToolRisk(requires_approval=True), "refund": ToolRisk(max_amount=20)}})
    _, noted = await _parked(client, "note", "n1")
    assert (noted["request"]["why"], noted["request"]["by"]) == ("approval required",
                                                                 "tenant policy")
    _, refunded = await _parked(client, "refund", "r3", amount=30)  # under the tool's 100
    assert refunded["request"]["max_amount"] == 20
    assert p.calls == []


def _agent_script(request: ModelRequest) -> Reply:
    """Propose the wire transfer; then answer with what the tool said."""
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        return reply(tool_calls=[("wire", {"order": "a1", "amount": 5000})])
    said = json.loads(results[-1].content or "{}")
    return reply(json.dumps({"outcome": said.get("code") or said.get("provider_id")}))


class Outcome(BaseModel):
    outcome: str


async def test_an_agent_calling_an_irreversible_tool_parks_and_gets_a_rejection_as_its_result(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    wire = p.tool("wire", risk="irreversible")
    model = ScriptedModel(_agent_script)
    wf = ratchet.Workflow("agent.pay")
    wf.agent("assistant", model=model, tools=[wire], output=Outcome,
             prompt=lambda state, input: "Pay order a1.")

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": ctx.state["assistant"]}

    await start_node(ratchet.Registry([wf], tools=[wire]))
    task_id, requested = await _parked(client, "agent.pay", "a1")
    assert requested["request"]["args"] == {"order": "a1", "amount": 5000}
    asked = model.calls
    await _decide(client, "reject", task_id, requested)
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"outcome": "APPROVAL_REJECTED"}
    assert p.calls == []
    assert model.calls == asked + 1  # the parked turn was not asked again, only the next


def test_serve_reads_a_risk_policy_file_and_refuses_a_bad_one(tmp_path: Any) -> None:
    good = tmp_path / "risk.json"
    good.write_text(json.dumps({"acme": {"*": {"requires_approval": True}}}))
    assert risk_policy(str(good)) == {"acme": {"*": ToolRisk(requires_approval=True)}}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"acme": {"pay": {"max_amount": "lots"}}}))
    with pytest.raises(ratchet.RatchetError, match="max_amount must be a number"):
        risk_policy(str(bad))
    assert risk_policy(None) == {}


async def test_a_gated_call_in_a_fan_out_branch_fails_the_branch_and_is_not_made(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    p = Provider()
    wire = p.tool("wire", risk="irreversible")
    branch = ratchet.Workflow("branch-wire")

    @branch.step
    async def send(ctx: ratchet.StepContext) -> dict[str, Any]:
        await ctx.call(wire, Order(order=f"b-{ctx.branch}"))
        return {"output": {}}

    wf = ratchet.Workflow("spread.pay")
    wf.fanout("spread", {"one": branch}, join="gather")
    wf.join("gather", of="spread", policy=ratchet.JoinPolicy(mode="all"), next=ratchet.END)
    await start_node(ratchet.Registry([wf], tools=[wire]))
    task_id = (await client.submit("spread.pay", {}, key="spread")).task_id
    events = await wait_terminal(client, task_id)
    [failed] = [e.payload for e in events if e.type == "branch.failed"]
    assert failed["error"]["type"] == "ApprovalRequired"  # a branch cannot park its task
    assert events[-1].type == "task.failed" and p.calls == []
