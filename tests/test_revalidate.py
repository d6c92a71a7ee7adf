"""Plan re-validation on resume (actors/task/revalidate.py): after a pause, an approval, a
sleep or a recovery, a workflow's ``revalidate`` hook is asked before anything runs; its
verdict is recorded (``plan.revalidated``) and a failed check goes to the replan node or to
a human — the task never goes on blindly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ratchet
from ratchet.actors.workflow.revalidate import RevalidateContext, verdict_of
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import APPROVER, OPERATOR, admin


class World:
    """The outside world the plan was made against: a price that may change meanwhile."""

    def __init__(self) -> None:
        self.price = 10
        self.asked: list[tuple[str, str]] = []  # (after, node) per call of the hook

    def check(self, ctx: RevalidateContext) -> bool | str:
        self.asked.append((ctx.after, ctx.node))
        if ctx.state.get("price") in (None, self.price):
            return True
        return f"the price changed from {ctx.state['price']} to {self.price}"


def _quoted(world: World, name: str, on_invalid: str | None) -> ratchet.Workflow:
    """Quote → a person approves → pay; a price change meanwhile invalidates the plan."""
    wf = ratchet.Workflow(name)

    @wf.step
    async def quote(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"price": world.price}

    wf.approval("confirm", on_approve="pay", on_reject=ratchet.END, timeout=3600,
                on_timeout=ratchet.CANCEL)

    @wf.step(next=ratchet.END)
    async def pay(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"paid": ctx.state["price"]}}

    if on_invalid is not None:
        @wf.step(name=on_invalid, next=ratchet.END)
        async def replan(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"output": {"replanned": True, "price": world.price}}

    wf.revalidate(world.check, on_invalid=on_invalid)
    return wf


async def _decide(client: ratchet.Client, verb: str, task_id: str, approval_id: str,
                  command_id: str) -> None:
    reply = await admin(client, verb, command_id=command_id, principal=APPROVER,
                        task_id=task_id, args={"approval_id": approval_id})
    assert reply.ok, reply.error


async def _requested(client: ratchet.Client, task_id: str, node: str,
                     after: int = 0) -> ratchet.Event:
    async for event in client.watch(task_id, after=after):
        if event.type == "approval.requested" and event.payload["node"] == node:
            return event
        assert event.type not in ("task.succeeded", "task.failed"), event
    raise AssertionError("no approval requested")


def _verdicts(events: list[ratchet.Event]) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.type == "plan.revalidated"]


# -- definitions ---------------------------------------------------------------------------


def test_the_replan_node_must_exist_and_counts_as_reachable() -> None:
    wf = _quoted(World(), "ok", on_invalid="replan")
    wf.validate()  # "replan" is reached only through on_invalid: still reachable
    bad = _quoted(World(), "bad", on_invalid=None)
    bad.on_invalid = "nowhere"
    with pytest.raises(ratchet.WorkflowDefinitionError, match="nowhere"):
        bad.validate()
    with pytest.raises(ratchet.WorkflowDefinitionError, match="declared once"):
        wf.revalidate(World().check)


async def test_a_hook_that_raises_or_says_no_is_a_failed_check() -> None:
    ctx = RevalidateContext("t", "acme", "wf", "pay", "approval", 1.0, {}, {}, {})

    async def fine(ctx: RevalidateContext) -> bool:
        return True

    assert await verdict_of(fine, ctx) is None
    assert await verdict_of(lambda c: False, ctx) == \
        "revalidate said the plan no longer holds"
    assert await verdict_of(lambda c: "revoked", ctx) == "revoked"
    assert await verdict_of(lambda c: 1 // 0, ctx) == \
        "revalidate raised ZeroDivisionError: integer division or modulo by zero"


# -- a node --------------------------------------------------------------------------------


async def test_after_an_approval_a_valid_plan_goes_on_and_a_changed_one_is_replanned(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    world = World()
    await start_node(ratchet.Registry([_quoted(world, "quoted", on_invalid="replan")]))
    for key, new_price, output in (("same", 10, {"paid": 10}),
                                   ("moved", 12, {"replanned": True, "price": 12})):
        world.price = 10
        task_id = (await client.submit("quoted", {}, key=key)).task_id
        requested = await _requested(client, task_id, "confirm")
        world.price = new_price  # the world moves while the task waits for a person
        await _decide(client, "approve", task_id, requested.payload["approval_id"], key)
        events = await wait_terminal(client, task_id)
        assert events[-1].payload["output"] == output
        [verdict] = _verdicts(events)
        assert (verdict["after"], verdict["node"]) == ("approval", "pay")
        assert verdict["valid"] is (new_price == 10)
        assert verdict["then"] == ("continue" if new_price == 10 else "replan")
    assert world.asked == [("approval", "pay")] * 2  # never at the first start


async def test_a_failed_check_without_a_replan_node_goes_to_a_human(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    world = World()
    await start_node(ratchet.Registry([_quoted(world, "guarded", on_invalid=None)]))
    outcomes = {}
    for key, verb in (("h-ok", "approve"), ("h-no", "reject")):
        world.price = 10
        task_id = (await client.submit("guarded", {}, key=key)).task_id
        confirm = await _requested(client, task_id, "confirm")
        world.price = 99
        await _decide(client, "approve", task_id, confirm.payload["approval_id"], f"{key}-1")
        human = await _requested(client, task_id, "@revalidate", after=confirm.sequence)
        assert human.payload["request"]["reason"] == "the price changed from 10 to 99"
        assert (await client.get(task_id)).status == "WAITING_APPROVAL"
        await _decide(client, verb, task_id, human.payload["approval_id"], f"{key}-2")
        events = await wait_terminal(client, task_id)
        outcomes[verb] = events[-1]
        [verdict] = _verdicts(events)
        assert (verdict["valid"], verdict["then"]) == (False, "human")
        assert "task.handoff" in [e.type for e in events]
    # Approved: on where it stood, the hook not asked again (the human vouched for it).
    assert outcomes["approve"].payload["output"] == {"paid": 10}
    assert outcomes["reject"].type == "task.failed"
    assert outcomes["reject"].payload["reason"] == \
        "plan no longer valid: a human rejected going on"
    assert world.asked == [("approval", "pay")] * 2


async def test_pause_sleep_and_recovery_each_revalidate_before_the_task_goes_on(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    world, clock, release = World(), ratchet.FakeClock(), asyncio.Event()
    crashes: list[int] = []
    wf = ratchet.Workflow("long")

    @wf.step
    async def wait_for_pause(ctx: ratchet.StepContext) -> None:
        await asyncio.wait_for(release.wait(), 10)  # the test pauses the task meanwhile

    @wf.step
    async def nap(ctx: ratchet.StepContext) -> None:
        await ctx.sleep(3600)

    @wf.step
    async def flaky(ctx: ratchet.StepContext) -> dict[str, Any]:
        if not crashes:
            crashes.append(1)
            raise RuntimeError("crash once")  # the actor restarts from its checkpoint
        return {"output": {"done": True}}

    wf.revalidate(world.check)
    # No backoff before the restart: it would be slept on the fake clock.
    await start_node(ratchet.Registry([wf]), clock=clock, task_backoff_base=0.0)
    task_id = (await client.submit("long", {}, key="long")).task_id
    async for event in client.watch(task_id):
        if event.type == "task.started":
            break
    paused = await admin(client, "pause", command_id="p1", principal=OPERATOR, task_id=task_id)
    assert paused.ok, paused.error
    release.set()
    async for event in client.watch(task_id):
        if event.type == "task.paused":
            break
    resumed = await admin(client, "resume", command_id="r1", principal=OPERATOR,
                          task_id=task_id)
    assert resumed.ok, resumed.error
    async for event in client.watch(task_id):
        if event.type == "sleep.started":
            break
    clock.advance(3600)
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"done": True}
    assert [(v["after"], v["node"], v["valid"]) for v in _verdicts(events)] == [
        ("pause", "nap", True), ("sleep", "nap", True), ("recovery", "flaky", True)]
    revalidated = [e.sequence for e in events if e.type == "plan.revalidated"]
    recovered = next(e.sequence for e in events if e.type == "task.recovered")
    assert recovered < revalidated[-1]  # the recovery is recorded first, then the check
