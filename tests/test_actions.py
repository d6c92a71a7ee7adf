"""External side effects against the finance simulator (a real separate process): every
outcome path of the action protocol, retries, deadlines, sagas, confirmations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.actors.workflow.tools import Tool
from ratchet.protocol.codec import encode
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from ratchet.testing import FinanceClient
from ratchet.testing.expense import ClaimArgs, ClaimResult, _submit_claim
from ratchet.testing.expense import app as expense_app
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal

REPORT = {"report_id": "r-1", "employee": "e-7", "items": [{"amount": 40.0}, {"amount": 2.5}]}
CLAIM_KEY = "claim:r-1:all:submit"


def types(events: list[ratchet.Event]) -> list[str]:
    return [e.type for e in events]


async def run(client: ratchet.Client, workflow: str, input: dict[str, Any], key: str,
              **submit: Any) -> list[ratchet.Event]:
    task_id = (await client.submit(workflow, input, key=key, **submit)).task_id
    events = await wait_terminal_or_parked(client, task_id)
    assert_contiguous(events)
    return events


PARKED = {"task.unknown", "task.handoff", "task.waiting_external"}


async def wait_terminal_or_parked(client: ratchet.Client, task_id: str,
                                  timeout: float = 30.0) -> list[ratchet.Event]:
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id):
            events.append(event)
            if event.type in PARKED:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def test_a_completed_write_is_recorded_and_effective_once(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    node = await start_node(expense_app)
    events = await run(client, "expense.agent", REPORT, "r-1")
    assert events[-1].type == "task.succeeded"
    assert ["action.started", "action.succeeded"] == [t for t in types(events) if t.startswith("action.")]
    assert finance.effects() == {CLAIM_KEY: 1}
    [action] = await node.store.task_actions(events[0].task_id)  # type: ignore[union-attr]
    assert (action.status, action.key, action.provider_id) == (
        "SUCCEEDED", CLAIM_KEY, events[-1].payload["output"]["claim_id"])


async def test_a_response_dropped_after_commit_is_reconciled_not_resent(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "drop_after_commit"}])
    events = await run(client, "expense.agent", REPORT, "r-1")
    assert events[-1].type == "task.succeeded"
    actions = [e for e in events if e.type.startswith("action.")]
    assert [e.type for e in actions] == ["action.started", "action.unknown", "action.reconciled"]
    assert actions[-1].payload["found"] is True
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_a_request_dropped_before_commit_is_resent_with_the_same_key(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "drop_before_commit"}])
    events = await run(client, "expense.agent", REPORT, "r-1")
    assert events[-1].type == "task.succeeded"
    reconciled = [e for e in events if e.type == "action.reconciled"]
    assert reconciled[0].payload["found"] is False
    assert reconciled[0].payload["then"] == "resend with the same key"
    assert types(events).count("action.succeeded") == 1
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_an_unknown_outcome_that_cannot_be_reconciled_goes_to_a_human(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    node = await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "drop_after_commit"},
                        {"op": "query", "mode": "status_500", "times": 50}])
    events = await run(client, "expense.agent", REPORT, "r-1")
    assert events[-1].type == "task.unknown"
    task_id = events[0].task_id
    assert (await client.get(task_id)).status == "UNKNOWN"
    [handoff] = await node.store.handoffs(task_id)  # type: ignore[union-attr]
    package = handoff["package"]
    assert package["why"] == "query undecidable" and package["key"] == CLAIM_KEY
    assert package["goal"]["workflow"] == "expense.agent"
    assert package["timeline"][-1]["type"] == "action.retry"
    assert package["actions"][0]["status"] == "UNKNOWN"
    assert package["options"]
    assert finance.effects() == {CLAIM_KEY: 1}  # never resent blindly


async def test_a_write_without_query_goes_unknown_on_a_dropped_response(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    blind = Tool("blind_claim", _submit_claim, "write", ClaimArgs, ClaimResult,
                 key=lambda a: f"blind:{a.report_id}", timeout=3.0, session="finance")
    wf = ratchet.Workflow("blind", version=1)

    @wf.step
    async def go(ctx: ratchet.StepContext) -> None:
        await ctx.call(blind, ClaimArgs(report_id="b1", employee="e", amount=1.0))

    registry = ratchet.Registry([wf], tools=[blind], resources=expense_app.resources)
    node = await start_node(registry)
    finance.add_faults([{"op": "claims", "mode": "drop_after_commit"}])
    events = await run(client, "blind", {}, "b1")
    assert events[-1].type == "task.unknown"
    assert (await node.store.handoffs(events[0].task_id))[0]["package"]["why"] == (  # type: ignore[union-attr]
        "no query declared")
    assert finance.effects() == {"blind:b1": 1}


async def test_retry_after_is_honoured_on_the_injected_clock(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    clock = ratchet.FakeClock()
    await start_node(expense_app, clock=clock)
    finance.add_faults([{"op": "claims", "mode": "status_429", "retry_after": 30}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    async for event in client.watch(task_id):
        if event.type == "action.retry":
            assert event.payload["reason"] == "retry_after"
            assert event.payload["delay_s"] == 30
            break
    await asyncio.wait_for(_until(lambda: clock.sleepers > 0), 5)
    assert finance.effects() == {}  # nothing committed, and no second call yet
    clock.advance(29.0)
    assert finance.effects() == {}
    clock.advance(1.0)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_transient_errors_back_off_and_every_retry_is_an_event(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "status_503", "times": 2}])
    events = await run(client, "expense.agent", REPORT, "r-1")
    assert events[-1].type == "task.succeeded"
    retries = [e.payload for e in events if e.type == "action.retry"]
    assert [(r["reason"], r["attempt"]) for r in retries] == [("backoff", 1), ("backoff", 2)]
    assert all(0 <= r["delay_s"] <= 1.0 for r in retries)
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_the_task_deadline_stops_retries(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    clock = ratchet.FakeClock()
    await start_node(expense_app, clock=clock)
    finance.add_faults([{"op": "claims", "mode": "status_429", "retry_after": 30}])
    events = await run(client, "expense.agent", REPORT, "r-1", deadline_s=10.0)
    assert events[-1].type == "task.failed"
    failed = next(e for e in events if e.type == "action.failed")
    assert failed.payload["reason"] == "retries or deadline exhausted"
    assert "action.retry" not in types(events)
    assert finance.effects() == {}


async def test_a_failure_after_side_effects_compensates_in_reverse_order(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    events = await run(client, "expense.split", {"report_id": "s1", "employee": "e",
                                                 "travel": 10, "hotel": 20,
                                                 "fail_after_writes": True}, "s1")
    assert events[-1].type == "task.failed"
    compensated = [e.payload["key"] for e in events if e.type == "action.compensated"]
    assert compensated == ["claim:s1:hotel:submit", "claim:s1:travel:submit"]
    assert events[-1].payload["compensated"] == compensated
    assert finance.effects() == {"claim:s1:travel:submit": 1, "claim:s1:hotel:submit": 1,
                                 "refund:s1:hotel": 1, "refund:s1:travel": 1}


async def test_a_never_retried_error_fails_the_task_and_compensates(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    events = await run(client, "expense.split", {"report_id": "s2", "employee": "e",
                                                 "travel": 10, "hotel": -5}, "s2")
    assert events[-1].type == "task.failed"
    failed = next(e for e in events if e.type == "action.failed")
    assert failed.payload["error"]["code"] == "INVALID_ARGUMENT"
    assert finance.effects() == {"claim:s2:travel:submit": 1, "refund:s2:travel": 1}


async def test_a_compensation_that_keeps_failing_is_handed_to_a_human(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    node = await start_node(expense_app)
    finance.add_faults([{"op": "refunds", "mode": "status_500", "times": 100}])
    events = await run(client, "expense.split", {"report_id": "s3", "employee": "e",
                                                 "travel": 10, "hotel": 20,
                                                 "fail_after_writes": True}, "s3")
    assert events[-1].type == "task.handoff"
    assert (await client.get(events[0].task_id)).status == "WAITING_APPROVAL"
    [handoff] = await node.store.handoffs(events[0].task_id)  # type: ignore[union-attr]
    assert handoff["package"]["action"]["key"] == "claim:s3:hotel:submit"


async def test_the_same_business_key_in_another_task_reuses_the_result_or_conflicts(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    first = await run(client, "expense.agent", REPORT, "task-a")
    again = await run(client, "expense.agent", REPORT, "task-b")  # same report, same claim
    assert first[-1].type == again[-1].type == "task.succeeded"
    assert "action.reused" in types(again)
    assert again[-1].payload == first[-1].payload
    other = {**REPORT, "items": [{"amount": 999.0}]}  # same report id, different request
    conflict = await run(client, "expense.agent", other, "task-c")
    assert conflict[-1].type == "task.failed"
    assert "different request" in conflict[-1].payload["error"]["message"]
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_an_accepted_action_waits_for_its_confirmation(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    node = await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "accept"}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    events = await wait_terminal_or_parked(client, task_id)
    assert events[-1].type == "task.waiting_external"
    assert (await client.get(task_id)).status == "WAITING_EXTERNAL"
    assert node.system.lookup(f"node/tasks/{task_id}/actor") is None  # passivated
    confirmed = finance.confirm(CLAIM_KEY)
    env = Envelope(type="external.resolved", message_id="conf-1", correlation_id="conf-1",
                   body={"correlation_id": CLAIM_KEY, "outcome": "completed",
                         "result": confirmed})
    await client.publish_signed(external_subject("acme"), encode(env))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert "action.confirmed" in types(events)
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_an_unconfirmed_action_is_reconciled_when_its_timer_fires(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(expense_app, clock=clock)
    finance.add_faults([{"op": "claims", "mode": "accept"}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    events = await wait_terminal_or_parked(client, task_id)
    assert events[-1].payload["timeout_s"] == 30.0
    finance.confirm(CLAIM_KEY)  # the provider finished, but nobody told us
    clock.advance(31.0)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    reconciled = next(e for e in events if e.type == "action.reconciled")
    assert reconciled.payload["after"] == "confirmation timeout"
    assert node.store is not None and await node.store.next_timer_due() is None


async def test_tool_sessions_keep_their_state_across_calls(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    node = await start_node(expense_app)
    events = await run(client, "expense.split", {"report_id": "s4", "employee": "e",
                                                 "travel": 1, "hotel": 2}, "s4")
    assert events[-1].type == "task.succeeded"
    state = await node.store.session_state(events[0].task_id, "finance")  # type: ignore[union-attr]
    assert state == {"claims_sent": 2}


async def _until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110 - yields to the loop; bounded by the caller
        await asyncio.sleep(0)


async def test_a_step_timeout_bounds_the_tool_calls_inside_it(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim

    wf = ratchet.Workflow("timed", version=1)

    @wf.step(timeout=0.4)
    async def go(ctx: ratchet.StepContext) -> dict[str, Any]:
        claim = await ctx.call(submit_claim, ClaimArgs(report_id="t1", employee="e",
                                                       amount=5.0))
        return {"output": {"claim": claim.provider_id}}

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 1.0}])
    started = asyncio.get_running_loop().time()
    events = await run(client, "timed", {}, "t1")
    assert events[-1].type == "task.succeeded"
    first_failure = next(e for e in events if e.type in ("step.failed", "action.unknown"))
    # The tool's own timeout is 3 s; the step's 0.4 s budget cut the call short.
    assert first_failure.occurred_at - events[0].occurred_at < 1.0
    assert asyncio.get_running_loop().time() - started < 10
    assert finance.effects() == {"claim:t1:all:submit": 1}


async def test_a_still_pending_action_rearms_its_timer_then_goes_to_a_human(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.actors.task.waits import MAX_PENDING_REARMS

    clock = ratchet.FakeClock()
    await start_node(expense_app, clock=clock)
    finance.add_faults([{"op": "claims", "mode": "accept"}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    events = await wait_terminal_or_parked(client, task_id)
    seen = events[-1].sequence
    for rearm in range(1, MAX_PENDING_REARMS + 1):
        clock.advance(31.0)  # the provider still says "pending"
        async for event in client.watch(task_id, after=seen):
            seen = event.sequence
            if event.type == "action.still_pending":
                assert event.payload["rearms"] == rearm
                break
    clock.advance(31.0)
    async for event in client.watch(task_id, after=seen):
        if event.type == "task.unknown":
            break
    assert (await client.get(task_id)).status == "UNKNOWN"


async def test_a_compensated_action_is_not_reused_as_if_it_still_held(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    report = {"report_id": "s9", "employee": "e", "travel": 10, "hotel": 20}
    undone = await run(client, "expense.split", {**report, "fail_after_writes": True}, "s9-a")
    assert undone[-1].type == "task.failed"
    again = await run(client, "expense.split", report, "s9-b")  # same claims, other task
    assert again[-1].type == "task.failed"
    assert "was compensated" in again[-1].payload["error"]["message"]
    assert finance.effects()["claim:s9:travel:submit"] == 1


async def test_compensation_still_runs_when_the_task_failed_on_its_deadline(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    clock = ratchet.FakeClock()
    await start_node(expense_app, clock=clock)
    finance.add_faults([{"op": "claims", "mode": "status_429", "retry_after": 5,
                         "key": "claim:s8:hotel:submit"}])
    task_id = (await client.submit("expense.split", {"report_id": "s8", "employee": "e",
                                                    "travel": 10, "hotel": 20},
                                  key="s8", deadline_s=10.0)).task_id
    async for event in client.watch(task_id):
        if event.type == "action.retry":
            break
    await asyncio.wait_for(_until(lambda: clock.sleepers > 0), 5)
    clock.advance(20.0)  # past the deadline while the retry waits
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["compensated"] == ["claim:s8:travel:submit"]
    assert finance.effects()["refund:s8:travel"] == 1


@pytest.mark.slow
async def test_a_retry_delay_survives_a_node_killed_during_it(
    nats_url: str, client: ratchet.Client, finance: FinanceClient, simulator: Any,
    node_process: Any,
) -> None:
    node = node_process(nats_url, {"RATCHET_FINANCE_URL": simulator.url},
                        app_spec="ratchet.testing.expense:app")
    await asyncio.to_thread(node.start)
    finance.add_faults([{"op": "claims", "mode": "status_429", "retry_after": 1.5}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    retry = None
    async for event in client.watch(task_id):
        if event.type == "action.retry":
            retry = event
            break
    assert retry is not None
    await asyncio.to_thread(node.kill)  # inside the 1.5 s Retry-After
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    resumed = next(e for e in events if e.type == "action.started" and e.payload.get("resumed"))
    assert resumed.payload["attempt"] == 2
    assert resumed.occurred_at >= retry.occurred_at + 1.5  # the stored delay was honoured
    assert finance.effects() == {CLAIM_KEY: 1}


async def test_the_tool_call_budget_stops_a_step_and_the_undo_still_runs(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    await start_node(expense_app)
    events = await run(client, "expense.split", {"report_id": "b1", "employee": "e",
                                                 "travel": 10, "hotel": 20}, "b1",
                       budget={"tool_calls": 1})
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "budget exhausted"
    assert events[-1].payload["error"]["code"] == "BUDGET_EXHAUSTED"
    assert finance.effects() == {"claim:b1:travel:submit": 1, "refund:b1:travel": 1}


async def test_branches_draw_on_the_tasks_remaining_budget_together(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim

    branch = ratchet.Workflow("claim-branch")

    @branch.step
    async def file(ctx: ratchet.StepContext) -> dict[str, Any]:
        claim = await ctx.call(submit_claim, ClaimArgs(report_id="fb", part=ctx.branch or "",
                                                       employee="e", amount=1.0))
        return {"output": claim.provider_id}

    wf = ratchet.Workflow("claims.fan")
    wf.fanout("spread", {b: branch for b in ("x", "y", "z")}, join="gather")
    wf.join("gather", of="spread", policy=ratchet.JoinPolicy("at_least", k=2))
    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    events = await run(client, "claims.fan", {}, "fb", budget={"tool_calls": 2})
    assert events[-1].type == "task.succeeded"
    failed = [e.payload for e in events if e.type == "branch.failed"]
    assert len(failed) == 1 and failed[0]["error"]["type"] == "BudgetExhausted"
    assert sum(finance.effects().values()) == 2  # three branches, two calls allowed in all


async def test_an_agent_whose_write_is_accepted_parks_and_resumes_without_asking_again(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    import json as _json

    from ratchet.actors.agents.scripted_model import ScriptedModel, reply
    from ratchet.testing.expense import refund_claim, submit_claim

    claim = {"report_id": "ag1", "employee": "e", "amount": 12.0}
    model = ScriptedModel([reply(tool_calls=[("submit_claim", claim)]),
                           reply(_json.dumps({"filed": True}))])

    class Filed(BaseModel):
        filed: bool

    wf = ratchet.Workflow("agent.files")
    wf.agent("clerk", model=model, tools=[submit_claim], output=Filed,
             prompt=lambda s, i: "file the claim", max_visits=1)
    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    finance.add_faults([{"op": "claims", "mode": "accept"}])
    task_id = (await client.submit("agent.files", {}, key="ag1")).task_id
    events = await wait_terminal_or_parked(client, task_id)
    assert events[-1].type == "task.waiting_external"
    confirmed = finance.confirm("claim:ag1:all:submit")
    env = Envelope(type="external.resolved", message_id="c-ag1", correlation_id="c-ag1",
                   body={"correlation_id": "claim:ag1:all:submit", "outcome": "completed",
                         "result": confirmed})
    await client.publish_signed(external_subject("acme"), encode(env))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"  # max_visits=1: three turns are one visit
    assert model.calls == 2  # the parked turn was not asked again
    assert finance.effects() == {"claim:ag1:all:submit": 1}


async def test_a_fork_reuses_the_side_effects_completed_before_its_fork_point(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from tests.test_admin import OPERATOR, admin

    await start_node(expense_app)
    report = {"report_id": "fk", "employee": "e", "travel": 10, "hotel": 20}
    await run(client, "expense.split", report, "fk")
    reply = await admin(client, "fork", command_id="fk1", principal=OPERATOR,
                        task_id=task_id_for("acme", "fk"), args={"checkpoint": 1})
    assert reply.ok and reply.result is not None
    events = await wait_terminal(client, reply.result["task_id"])
    assert events[-1].type == "task.succeeded"
    assert "action.reused" in types(events)  # the hotel claim is found, not made again
    assert finance.effects() == {"claim:fk:travel:submit": 1, "claim:fk:hotel:submit": 1}


async def test_a_task_that_fails_with_a_write_in_flight_goes_to_a_human_not_failed(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim

    wf = ratchet.Workflow("hasty")

    @wf.step(timeout=0.3)
    async def go(ctx: ratchet.StepContext) -> None:
        await ctx.call(submit_claim, ClaimArgs(report_id="h1", employee="e", amount=1.0))

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    node = await start_node(registry, max_step_attempts=1)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 1.0},
                        {"op": "query", "mode": "status_500", "times": 100}])
    events = await run(client, "hasty", {}, "h1")
    assert events[-1].type == "task.unknown"  # not FAILED: the claim may have happened
    [handoff] = await node.store.handoffs(events[0].task_id)  # type: ignore[union-attr]
    assert handoff["package"]["unresolved"][0]["key"] == "claim:h1:all:submit"


async def test_a_task_that_fails_with_a_write_in_flight_settles_it_first(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    """The step gave up on a slow claim (its timeout), the claim went through at the
    provider: before FAILED the task asks the provider (once the call cannot still be
    running), finds it, and refunds it — no human needed."""
    from ratchet.testing.expense import refund_claim, submit_claim

    wf = ratchet.Workflow("hasty2")

    @wf.step(timeout=0.3)
    async def go(ctx: ratchet.StepContext) -> None:
        await ctx.call(submit_claim, ClaimArgs(report_id="h2", employee="e", amount=1.0))

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    node = await start_node(registry, max_step_attempts=1)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 1.0}])
    events = await run(client, "hasty2", {}, "h2")
    assert events[-1].type == "task.failed", [e.type for e in events]
    settled = [e.payload for e in events if e.type == "action.reconciled"]
    assert settled[0]["found"] is True and settled[0]["on"] == "failure"
    assert events[-1].payload["compensated"] == ["claim:h2:all:submit"]
    effects = finance.effects()
    assert (effects["claim:h2:all:submit"], effects["refund:h2:all"]) == (1, 1)
    statuses = {a.key: a.status for a in await node.store.task_actions(  # type: ignore[union-attr]
        events[0].task_id)}
    assert statuses["claim:h2:all:submit"] == "COMPENSATED"


async def test_cancel_during_a_write_waits_for_its_outcome(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    """A cancel never abandons a write in flight: the task records the claim's outcome
    first (``action.cancelling`` then ``action.succeeded``), then ends CANCELLED."""
    from tests.test_admin import OPERATOR, admin

    node = await start_node(expense_app)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 1.0}])
    task_id = (await client.submit("expense.agent", REPORT, key="r-1")).task_id
    async for event in client.watch(task_id):
        if event.type == "action.started":
            break
    await admin(client, "cancel", command_id="cx", principal=OPERATOR, task_id=task_id)
    events = await wait_terminal(client, task_id)
    types = [e.type for e in events]
    assert types[-1] == "task.cancelled"
    # the step is cut short right after its outcome, or ends first if nothing of it is left
    assert types.index("action.cancelling") < types.index("action.succeeded")
    assert events[-1].payload["unknown_actions"] == [] and events[-1].payload["detached"] == []
    [action] = await node.store.task_actions(task_id)  # type: ignore[union-attr]
    assert action.status == "SUCCEEDED"
    assert finance.effects()[CLAIM_KEY] == 1
    assert_contiguous(events)


async def test_a_cancel_compensates_when_the_workflow_declares_it(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim
    from tests.test_admin import OPERATOR, admin

    wf = ratchet.Workflow("undoable", compensate_on_cancel=True)

    @wf.step
    async def claim(ctx: ratchet.StepContext) -> None:
        await ctx.call(submit_claim, ClaimArgs(report_id="u1", employee="e", amount=3.0))

    @wf.step
    async def wait_long(ctx: ratchet.StepContext) -> None:
        await asyncio.Event().wait()  # only a cancel ends it

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    task_id = (await client.submit("undoable", {}, key="u1")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            break
    await admin(client, "cancel", command_id="u1c", principal=OPERATOR, task_id=task_id)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.cancelled"
    assert events[-1].payload["compensated"] == ["claim:u1:all:submit"]
    assert finance.effects() == {"claim:u1:all:submit": 1, "refund:u1:all": 1}


async def test_a_disabled_tool_is_refused_everywhere_and_the_handoff_verb_shows_packages(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from tests.test_admin import OPERATOR, VIEWER, admin

    await start_node(expense_app)
    await admin(client, "disable-tool", command_id="d1", principal=OPERATOR,
                args={"tool": "submit_claim", "reason": "finance incident"})
    events = await run(client, "expense.agent", REPORT, "r-off")
    assert events[-1].type == "task.failed"
    assert events[-1].payload["error"]["code"] == "UNAVAILABLE"
    assert finance.effects() == {}
    await admin(client, "enable-tool", command_id="d2", principal=OPERATOR,
                args={"tool": "submit_claim"})
    finance.add_faults([{"op": "claims", "mode": "drop_after_commit"},
                        {"op": "query", "mode": "status_500", "times": 50}])
    unknown = await run(client, "expense.agent", REPORT, "r-on")
    assert unknown[-1].type == "task.unknown"
    shown = await admin(client, "handoff", command_id="d3", principal=VIEWER,
                        task_id=unknown[0].task_id)
    assert shown.result is not None
    assert shown.result["handoffs"][0]["package"]["key"] == CLAIM_KEY


async def test_a_pause_takes_effect_at_the_next_tool_call_inside_a_step(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim
    from tests.test_admin import OPERATOR, admin

    wf = ratchet.Workflow("two_calls")

    @wf.step
    async def both(ctx: ratchet.StepContext) -> dict[str, Any]:
        first = await ctx.call(submit_claim, ClaimArgs(report_id="pz", part="a", employee="e",
                                                       amount=1.0))
        second = await ctx.call(submit_claim, ClaimArgs(report_id="pz", part="b",
                                                        employee="e", amount=2.0))
        return {"output": {"ids": [first.provider_id, second.provider_id]}}

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 0.5,
                         "key": "claim:pz:a:submit"}])
    task_id = (await client.submit("two_calls", {}, key="pz")).task_id
    async for event in client.watch(task_id):
        if event.type == "action.started":
            break
    await admin(client, "pause", command_id="pz1", principal=OPERATOR, task_id=task_id)
    async for event in client.watch(task_id):
        if event.type == "task.paused":
            assert event.payload["before_tool"] == "submit_claim"
            break
    assert finance.effects() == {"claim:pz:a:submit": 1}  # the second call never started
    resumed = await admin(client, "resume", command_id="pz2", principal=OPERATOR,
                          task_id=task_id)
    assert resumed.ok, resumed.error
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert finance.effects() == {"claim:pz:a:submit": 1, "claim:pz:b:submit": 1}


async def test_a_cancel_whose_undo_fails_goes_to_a_human(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    from ratchet.testing.expense import refund_claim, submit_claim
    from tests.test_admin import OPERATOR, admin

    wf = ratchet.Workflow("undo_fails", compensate_on_cancel=True)

    @wf.step
    async def claim(ctx: ratchet.StepContext) -> None:
        await ctx.call(submit_claim, ClaimArgs(report_id="uf", employee="e", amount=3.0))

    @wf.step
    async def wait_long(ctx: ratchet.StepContext) -> None:
        await asyncio.Event().wait()  # only a cancel ends it

    registry = ratchet.Registry([wf], tools=[submit_claim, refund_claim],
                                resources=expense_app.resources)
    await start_node(registry)
    finance.add_faults([{"op": "refunds", "mode": "status_500", "times": 100}])
    task_id = (await client.submit("undo_fails", {}, key="uf")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            break
    await admin(client, "cancel", command_id="ufc", principal=OPERATOR, task_id=task_id)
    events = await wait_terminal_or_parked(client, task_id)
    assert "task.cancel_incomplete" in types(events) and events[-1].type == "task.handoff"
    assert (await client.get(task_id)).status == "WAITING_APPROVAL"
