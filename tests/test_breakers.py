"""Circuit breakers (actors/effects/breakers.py): a provider that keeps failing is not
called by every task that needs it; new calls fail fast with CIRCUIT_OPEN, an action under
way waits for the half-open probe, and admins see the breakers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.actors.effects.breakers import CircuitBreakers, through_breaker
from ratchet.actors.workflow.tools import BreakerPolicy, Tool, ToolContext, tool
from ratchet.protocol.errors import (
    ToolCircuitOpen,
    ToolDefinitionError,
    ToolInvalidArgument,
    ToolTransient,
)
from tests.conftest import NodeFactory, wait_terminal
from tests.test_actions import _until
from tests.test_admin import VIEWER, admin

POLICY = BreakerPolicy(failures=2, window=60.0, cooldown=30.0)


# -- the state machine, on plain numbers for time ------------------------------------------


def test_failures_within_the_window_open_it_and_old_ones_are_forgotten() -> None:
    b = CircuitBreakers()
    b.failed("t", "pay", POLICY, now=0.0)
    b.failed("t", "pay", POLICY, now=61.0)  # the first is out of the window by now
    assert b.check("t", "pay", now=61.0, probe_timeout=5.0) is None
    b.failed("t", "pay", POLICY, now=62.0)
    refusal = b.check("t", "pay", now=70.0, probe_timeout=5.0)
    assert isinstance(refusal, ToolCircuitOpen)
    assert refusal.retry_after == pytest.approx(22.0)
    assert b.check("u", "pay", now=70.0, probe_timeout=5.0) is None  # per tenant


def test_half_open_lets_one_probe_through_and_its_outcome_decides() -> None:
    b = CircuitBreakers()
    for now in (0.0, 1.0):
        b.failed("t", "pay", POLICY, now=now)
    b.admit("t", "pay", now=31.0, probe_timeout=5.0)  # the probe
    with pytest.raises(ToolCircuitOpen) as second:
        b.admit("t", "pay", now=31.5, probe_timeout=5.0)
    assert second.value.retry_after == 5.0  # wait for the probe, not a whole cooldown
    b.failed("t", "pay", POLICY, now=32.0)  # the probe failed: open for another cooldown
    [row] = b.snapshot("t", now=40.0)
    assert (row["state"], row["trips"], row["probe_in_s"]) == ("open", 2, 22.0)
    b.admit("t", "pay", now=62.5, probe_timeout=5.0)
    b.released("t", "pay")  # cancelled: tells nothing, the next call may probe
    b.admit("t", "pay", now=63.0, probe_timeout=5.0)
    b.succeeded("t", "pay")
    assert b.snapshot(None, now=63.0) == []  # closed and forgotten: the table stays small


async def test_a_4xx_shows_the_provider_working_and_closes_it() -> None:
    b = CircuitBreakers()
    flaky = _tool("flaky", POLICY)
    for _ in range(2):
        ok, _value = await through_breaker(b, "t", flaky, lambda: 0.0,
                                           _answer(False, ToolTransient("503")))
        assert not ok
    ok, value = await through_breaker(b, "t", flaky, lambda: 1.0, _answer(True, "never"))
    assert isinstance(value, ToolCircuitOpen)  # refused: the call was not made
    ok, value = await through_breaker(b, "t", flaky, lambda: 40.0,
                                      _answer(False, ToolInvalidArgument("bad amount")))
    assert isinstance(value, ToolInvalidArgument)
    assert b.snapshot("t", now=40.0) == []


def test_an_invalid_policy_is_refused_at_definition() -> None:
    with pytest.raises(ToolDefinitionError):
        BreakerPolicy(failures=0)


# -- a node with a provider that fails -------------------------------------------------


class Pay(BaseModel):
    order: str


class Paid(BaseModel):
    provider_id: str


class Provider:
    """The outside world: a payment API that is down until healed."""

    def __init__(self) -> None:
        self.down = True
        self.calls: list[str] = []

    async def pay(self, ctx: ToolContext, args: Pay) -> Paid:
        self.calls.append(args.order)
        if self.down:
            raise ToolTransient("503 service unavailable")
        return Paid(provider_id=f"p-{args.order}")


def _registry(provider: Provider, attempts: int) -> ratchet.Registry:
    pay = tool(kind="write", args=Pay, result=Paid, key=lambda a: f"pay:{a.order}",
               retry=ratchet.RetryPolicy(max_attempts=attempts, base_delay=0.0, max_delay=0.0),
               breaker=POLICY, name="pay")(provider.pay)

    plain = ratchet.Workflow("plain")

    @plain.step
    async def charge(ctx: ratchet.StepContext) -> dict[str, Any]:
        paid = await ctx.call(pay, Pay(order=ctx.input["order"]))
        return {"output": {"paid": paid.provider_id}}

    routed = ratchet.Workflow("routed")

    @routed.step(next="done")
    async def try_charge(ctx: ratchet.StepContext) -> dict[str, Any]:
        try:
            paid = await ctx.call(pay, Pay(order=ctx.input["order"]))
        except ratchet.ActionFailed as failed:
            if failed.code != "CIRCUIT_OPEN":
                raise
            return {"output": {"queued": True, "retry_after": failed.details["retry_after"]}}
        return {"output": {"paid": paid.provider_id}}

    @routed.step
    async def done(ctx: ratchet.StepContext) -> None:
        return None

    return ratchet.Registry([plain, routed], tools=[pay])


async def test_an_open_breaker_fails_new_calls_fast_and_a_probe_closes_it(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    provider, clock = Provider(), ratchet.FakeClock()
    await start_node(_registry(provider, attempts=1), clock=clock)
    for order in ("o1", "o2"):  # two failures within the window: the breaker opens
        events = await _run(client, "plain", order)
        assert events[-1].payload["error"]["code"] == "UNAVAILABLE"
    shown = await admin(client, "breakers", command_id="b1", principal=VIEWER)
    assert shown.result is not None
    [row] = shown.result["breakers"]
    assert (row["provider"], row["state"], row["recent_failures"]) == ("pay", "open", 2)

    fast = await _run(client, "plain", "o3")
    assert fast[-1].type == "task.failed"
    assert fast[-1].payload["error"]["code"] == "CIRCUIT_OPEN"
    assert not [e for e in fast if e.type.startswith("action.")]  # nothing recorded
    routed = await _run(client, "routed", "o4")
    assert routed[-1].type == "task.succeeded"
    assert routed[-1].payload["output"]["queued"] is True
    assert provider.calls == ["o1", "o2"]  # neither o3 nor o4 reached the provider

    provider.down = False
    clock.advance(30.0)  # half-open: the next call is the probe
    probe = await _run(client, "plain", "o5")
    assert probe[-1].payload["output"] == {"paid": "p-o5"}
    shown = await admin(client, "breakers", command_id="b2", principal=VIEWER)
    assert shown.result is not None and shown.result["breakers"] == []


async def test_an_action_under_way_waits_for_the_probe_and_its_retries_tell_their_cost(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    provider, clock = Provider(), ratchet.FakeClock()
    node = await start_node(_registry(provider, attempts=4), clock=clock)
    task_id = (await client.submit("plain", {"order": "w1"}, key="w1")).task_id
    retries: list[dict[str, Any]] = []
    async for event in client.watch(task_id):
        if event.type == "action.retry":
            retries.append(event.payload)
            if event.payload["reason"] == "retry_after":
                break
    # Attempts 1 and 2 failed and opened the breaker; attempt 3 was refused, not made.
    assert [r["reason"] for r in retries] == ["backoff", "backoff", "retry_after"]
    assert retries[-1]["error"]["code"] == "CIRCUIT_OPEN"
    assert retries[-1]["delay_s"] == pytest.approx(30.0)
    assert provider.calls == ["w1", "w1"]
    [action] = await node.store.task_actions(task_id)
    assert {r["request_digest"] for r in retries} == {action.request_hash}
    assert [r["cost_so_far"]["attempts"] for r in retries] == [1, 2, 3]
    assert all("task_spent" in r["cost_so_far"] for r in retries)

    provider.down = False
    await asyncio.wait_for(_until(lambda: clock.sleepers > 0), 5)
    clock.advance(30.0)
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"paid": "p-w1"}
    assert provider.calls == ["w1", "w1", "w1"]  # the probe: one call, effective once


# -- helpers ----------------------------------------------------------------------------


def _tool(name: str, policy: BreakerPolicy) -> Tool[Any, Any]:
    async def fn(ctx: ToolContext, args: Pay) -> Paid:
        raise AssertionError("not called in these tests")

    return tool(kind="read", args=Pay, result=Paid, breaker=policy, name=name)(fn)


def _answer(ok: bool, value: Any) -> Any:
    async def call() -> tuple[bool, Any]:
        return (ok, value)

    return call


async def _run(client: ratchet.Client, workflow: str, order: str) -> list[ratchet.Event]:
    task_id = (await client.submit(workflow, {"order": order}, key=order)).task_id
    return await wait_terminal(client, task_id)

