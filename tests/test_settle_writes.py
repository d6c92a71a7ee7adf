"""Settling writes nobody recorded the outcome of (actors/effects/settle.py,
actors/task/settle_task.py, supervisors/services/action_sweeper.py) and a cancel that never
abandons a write in flight (actors/task/open_actions.py). Real node, NATS, SQLite and the
finance simulator; the provider's slowness is its own fault injection."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.testing import FinanceClient
from ratchet.testing.expense import ClaimArgs, refund_claim, submit_claim
from ratchet.testing.expense import app as expense_app
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal
from tests.test_actions import run
from tests.test_admin import OPERATOR, admin


def _registry(*workflows: ratchet.Workflow) -> ratchet.Registry:
    return ratchet.Registry(list(workflows), tools=[submit_claim, refund_claim],
                            resources=expense_app.resources)


async def _ledger(node: ratchet.Node, task_id: str) -> dict[str, str]:
    return {a.key: a.status for a in await node.store.task_actions(task_id)}  # type: ignore[union-attr]


async def test_a_rerun_that_takes_another_path_still_settles_the_first_write(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    """Attempt 1 starts a claim and crashes (its timeout) while the claim is on its way;
    attempt 2, after the restart, does not call the claim again. The claim took effect:
    the ledger says SUCCEEDED (settled by query), not IN_FLIGHT for ever."""
    wf = ratchet.Workflow("detour")

    @wf.step(timeout=0.2)
    async def claim(ctx: ratchet.StepContext) -> dict[str, Any]:
        if ctx.attempt == 1:
            await ctx.call(submit_claim, ClaimArgs(report_id="d1", employee="e", amount=1.0))
        return {"output": {"path": "other" if ctx.attempt > 1 else "claim"}}

    node = await start_node(_registry(wf))
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 0.5}])
    events = await run(client, "detour", {}, "d1")
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"path": "other"}
    settled = [e.payload for e in events if e.type == "action.reconciled"]
    assert [s["found"] for s in settled] == [True]
    assert settled[0]["on"] in ("recovery", "step_end")
    assert await _ledger(node, events[0].task_id) == {"claim:d1:all:submit": "SUCCEEDED"}
    assert finance.effects()["claim:d1:all:submit"] == 1


async def test_a_step_that_swallows_an_unsettled_write_cannot_complete_before_it_is_settled(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    wf = ratchet.Workflow("impatient")

    @wf.step
    async def claim(ctx: ratchet.StepContext) -> dict[str, Any]:
        try:  # gives up waiting, but the claim goes on at the provider
            await asyncio.wait_for(ctx.call(submit_claim, ClaimArgs(
                report_id="i1", employee="e", amount=1.0)), 0.1)
        except TimeoutError:
            return {"output": {"claimed": False}}
        return {"output": {"claimed": True}}

    node = await start_node(_registry(wf))
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 0.4}])
    events = await run(client, "impatient", {}, "i1")
    kinds = [e.type for e in events]
    assert kinds[-1] == "task.succeeded"
    # settled before the step committed, once the call could no longer be running
    assert kinds.index("action.reconciled") < kinds.index("step.completed")
    [settled] = [e.payload for e in events if e.type == "action.reconciled"]
    assert settled["found"] is True and settled["on"] == "step_end"
    assert await _ledger(node, events[0].task_id) == {"claim:i1:all:submit": "SUCCEEDED"}


async def test_a_write_nobody_can_settle_hands_the_step_to_a_human(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    wf = ratchet.Workflow("impatient2")

    @wf.step
    async def claim(ctx: ratchet.StepContext) -> None:
        try:
            await asyncio.wait_for(ctx.call(submit_claim, ClaimArgs(
                report_id="i2", employee="e", amount=1.0)), 0.1)
        except TimeoutError:
            pass

    node = await start_node(_registry(wf))
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 0.3},
                        {"op": "query", "mode": "status_500", "times": 100}])
    events = await run(client, "impatient2", {}, "i2")
    kinds = [e.type for e in events]
    assert kinds[-1] == "task.unknown" and "step.completed" not in kinds
    [handoff] = await node.store.handoffs(events[0].task_id)  # type: ignore[union-attr]
    assert handoff["package"]["key"] == "claim:i2:all:submit"
    assert handoff["package"]["found_by"] == "step_end"


async def test_a_cancel_past_its_timeout_detaches_the_call_and_the_sweeper_settles_it(
    start_node: NodeFactory, client: ratchet.Client, finance: FinanceClient
) -> None:
    """The cancel waits 0.2 s for a claim that takes 1 s, then ends CANCELLED with the call
    detached. The action sweeper later finds the claim done at the provider and, as the
    workflow compensates on cancel, refunds it: effective once, undone once."""
    wf = ratchet.Workflow("undo-late", compensate_on_cancel=True)

    @wf.step
    async def claim(ctx: ratchet.StepContext) -> None:
        await ctx.call(submit_claim, ClaimArgs(report_id="c1", employee="e", amount=2.0))

    node = await start_node(_registry(wf), cancel_timeout=0.2, settle_interval=0.2,
                            settle_after=0.0)
    finance.add_faults([{"op": "claims", "mode": "slow", "delay": 1.0}])
    task_id = (await client.submit("undo-late", {}, key="c1")).task_id
    async for event in client.watch(task_id):
        if event.type == "action.started":
            break
    await admin(client, "cancel", command_id="c1x", principal=OPERATOR, task_id=task_id)
    events: list[ratchet.Event] = []

    async def until_compensated() -> None:
        async for event in client.watch(task_id, follow_terminal=True):
            events.append(event)
            if event.type == "action.compensated":
                return

    await asyncio.wait_for(until_compensated(), 30)
    kinds = [e.type for e in events]
    cancelled = events[kinds.index("task.cancelled")].payload
    assert cancelled["detached"] == ["claim:c1:all:submit"]
    assert kinds.index("action.cancelling") < kinds.index("action.detached") \
        < kinds.index("task.cancelled") < kinds.index("action.reconciled")
    assert events[kinds.index("action.reconciled")].payload["on"] == "sweeper"
    assert await _ledger(node, task_id) == {"claim:c1:all:submit": "COMPENSATED",
                                            "refund:c1:all": "SUCCEEDED"}
    effects = finance.effects()
    assert (effects["claim:c1:all:submit"], effects["refund:c1:all"]) == (1, 1)
    assert (await node.store.load_task(task_id)).status == "CANCELLED"  # type: ignore[union-attr]
    assert_contiguous(events)


async def test_a_cancel_stops_a_model_call_at_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    """An agent's model call is a read: the cancel does not wait for the answer."""
    from ratchet.actors.agents.models import Message, ModelRequest, ModelResponse, Usage

    class Stuck:
        name, version = "stuck", "1"
        started = asyncio.Event()

        async def complete(self, request: ModelRequest) -> ModelResponse:
            self.started.set()
            await asyncio.Event().wait()  # never answers
            return ModelResponse(Message("assistant", ""), Usage(0, 0))  # pragma: no cover

    class Answer(BaseModel):
        text: str

    model = Stuck()
    wf = ratchet.Workflow("chatty")
    wf.agent("think", model=model, prompt=lambda state, input: "hello", tools=[refund_claim],
             output=Answer)
    await start_node(_registry(wf))
    task_id = (await client.submit("chatty", {}, key="m1")).task_id
    await asyncio.wait_for(model.started.wait(), 10)
    await admin(client, "cancel", command_id="m1x", principal=OPERATOR, task_id=task_id)
    events = await wait_terminal(client, task_id, timeout=10)
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["step.interrupted", "task.cancelled"]
