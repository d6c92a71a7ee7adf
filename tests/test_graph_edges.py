"""Edges of the graph runtime: loop bounds on joins, user callables that raise, waits told
of a failure, branch step timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import ratchet
from ratchet import END, JoinPolicy
from ratchet.protocol.codec import encode
from ratchet.protocol.messages import Envelope
from ratchet.protocol.subjects import external_subject
from tests.conftest import NodeFactory, wait_terminal


async def _work(ctx: ratchet.StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.input.get("sleep", 0)))
    return {"output": 1}


def _branch(timeout: float | None = None) -> ratchet.Workflow:
    wf = ratchet.Workflow("b")
    wf.add_step("work", _work, timeout=timeout)
    return wf


def _registry() -> ratchet.Registry:
    looping = ratchet.Workflow("looping")
    looping.fanout("f", {"x": _branch()}, join="j")
    looping.join("j", of="f", next="again", max_visits=2)
    looping.choice("again", guard=lambda s: "f", targets=["f"])

    broken = ratchet.Workflow("broken")
    broken.route("r", key=lambda s: 1 / 0, table={1: END}, default=END)

    waiting = ratchet.Workflow("waiting")
    waiting.wait("w", correlation=lambda s: "c-1", timeout=60, on_timeout="fail")

    timed = ratchet.Workflow("timed")
    timed.fanout("f", {"slow": _branch(timeout=0.1)}, join="j")
    timed.join("j", of="f", policy=JoinPolicy("all"))

    unhashable = ratchet.Workflow("unhashable")
    unhashable.route("r", key=lambda s: ["eu"], table={"eu": END}, default=END)

    bad_input = ratchet.Workflow("bad_input")
    bad_input.fanout("f", {"x": _branch()}, join="j", branch_input=lambda s, b: None)  # type: ignore[arg-type,return-value]
    bad_input.join("j", of="f")
    return ratchet.Registry([looping, broken, waiting, timed, unhashable, bad_input])


async def test_a_loop_bounded_on_its_join_stops_at_the_bound(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(_registry())
    task_id = (await client.submit("looping", {}, key="loop")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["reason"] == "loop bound exceeded"
    assert [e.type for e in events].count("join.completed") == 2


async def test_a_routing_key_that_raises_fails_the_task_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(_registry())
    events = await wait_terminal(client, (await client.submit("broken", {}, key="broken")).task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "routing key of r raised"
    assert "task.recovered" not in [e.type for e in events]  # no crash loop


async def test_a_wait_told_of_a_failure_fails_the_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(_registry())
    task_id = (await client.submit("waiting", {}, key="wait")).task_id
    async for event in client.watch(task_id):
        if event.type == "wait.started":
            break
    env = Envelope(type="external.resolved", message_id="m1", correlation_id="m1",
                   body={"correlation_id": "c-1", "outcome": "failed", "error": "refused"})
    await client.publish_signed(external_subject("acme"), encode(env))
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "external party reported failure"


async def test_a_branch_step_past_its_timeout_fails_the_branch(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(_registry())
    events = await wait_terminal(client, (await client.submit("timed", {"sleep": 2}, key="t")).task_id)
    failed = next(e for e in events if e.type == "branch.failed")
    assert failed.payload["error"]["type"] == "TimeoutError"
    assert events[-1].type == "task.failed"


async def test_an_unhashable_routing_key_or_a_bad_branch_input_fails_the_task_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(_registry())
    for workflow, reason in (("unhashable", "routing key of r raised"),
                             ("bad_input", "branch_input of f raised")):
        events = await wait_terminal(client, (await client.submit(workflow, {}, key=workflow)).task_id)
        assert events[-1].type == "task.failed" and events[-1].payload["reason"] == reason
        assert "task.recovered" not in [e.type for e in events]


async def test_an_agent_node_visited_twice_starts_a_fresh_conversation(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    import json

    from ratchet.actors.agents.scripted_model import ScriptedModel, reply
    from tests.agent_apps import Verdict, lookup_policy

    model = ScriptedModel([reply(json.dumps({"category": "x", "limit": 1.0}))])
    wf = ratchet.Workflow("twice")
    wf.agent("a", model=model, tools=[lookup_policy], output=Verdict, max_turns=1,
             prompt=lambda s, i: f"round {s.get('round', 0) + 1}", max_visits=2, next="count")

    @wf.step
    async def count(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"round": ctx.state.get("round", 0) + 1}

    wf.choice("again", guard=lambda s: "a" if s["round"] < 2 else "end", targets=["a", "end"])

    @wf.step(next=END)
    async def end(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"rounds": ctx.state["round"]}}

    await start_node(ratchet.Registry([wf]))
    events = await wait_terminal(client, (await client.submit("twice", {}, key="twice")).task_id)
    assert events[-1].type == "task.succeeded", events[-1]
    assert [e.payload["turn"] for e in events if e.type == "agent.answered"] == [0, 0]
    assert model.calls == 2
