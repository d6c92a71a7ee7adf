"""Degradation (actors/agents/degrade.py): a failing model gives way to the next of the
node's chain, budget pressure goes to the cheaper model first, an identical request can be
answered from the cache, and when nothing answers the node's ``on_exhausted`` edge is
taken — each step down recorded with its reason, and comparable with ``model-stats``."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.degrade import AnswerCache, Degradation, under_pressure
from ratchet.actors.agents.models import ModelRequest, ModelResponse
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from ratchet.protocol.errors import ToolPermissionDenied
from tests.agent_apps import lookup_policy
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import VIEWER, admin

ANSWER = json.dumps({"limit": 500.0})


class Limit(BaseModel):
    limit: float


class Model(ScriptedModel):
    """Answers at once, or refuses every call (a 401: not retried) while ``down``."""

    def __init__(self, name: str, tokens: tuple[int, int] = (10, 5),
                 think_first: bool = False) -> None:
        script = [reply(ANSWER, tokens=tokens)]
        if think_first:  # a first turn calling a tool it does not have: a second turn
            script.insert(0, reply(tool_calls=[("think", {})], tokens=tokens))
        super().__init__(script, name=name)
        self.down = False

    def count_tokens(self, request: ModelRequest) -> int:
        return 10  # what it reports: reservations stay exact

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.down:
            self.calls += 1
            raise ToolPermissionDenied(f"{self.name}: 401 invalid api key")
        return await super().complete(request)


def _app(big: Model, small: Model, **degrade: Any) -> ratchet.Registry:
    wf = ratchet.Workflow("ask")
    wf.agent("agent", model=big, tools=[lookup_policy], output=Limit, prompt=lambda s, i: "the limit?",
             degrade=Degradation(**degrade), next="done")

    @wf.step(next=ratchet.END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": ctx.state["agent"]}

    if degrade.get("on_exhausted"):

        @wf.step
        async def manual(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"output": {"manual": True}}

    return ratchet.Registry([wf])


async def _run(client: ratchet.Client, key: str, **submit: Any) -> list[ratchet.Event]:
    task_id = (await client.submit("ask", {}, key=key, **submit)).task_id
    return await wait_terminal(client, task_id)


def _degraded(events: list[ratchet.Event]) -> dict[str, Any]:
    return next(e.payload for e in events if e.type == "agent.degraded")


async def test_a_failing_model_gives_way_to_the_next_and_says_why(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    big, small = Model("big"), Model("small")
    await start_node(_app(big, small, models=(small,), on_exhausted="manual"))
    big.down = True
    events = await _run(client, "d1")
    assert events[-1].payload["output"] == {"limit": 500.0}
    shown = _degraded(events)
    assert shown["answered_by"] == "small-1"
    step = shown["steps"][0]
    assert (step["model"], step["reason"]) == ("big:1", "failed: PERMISSION_DENIED")
    assert "401 invalid api key" in step["error"]
    assert (big.calls, small.calls) == (1, 1)


async def test_budget_pressure_asks_the_cheaper_model_first(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    big, small = Model("big", tokens=(10, 50), think_first=True), Model("small")
    await start_node(_app(big, small, models=(small,), pressure=0.5))
    roomy = await _run(client, "p1", budget={"tokens": 1000})
    assert "agent.degraded" not in [e.type for e in roomy]  # 60 of 1000: no pressure
    pressed = await _run(client, "p2", budget={"tokens": 100})
    assert pressed[-1].payload["output"] == {"limit": 500.0}
    shown = _degraded(pressed)  # turn 2: 60 of 100 spent, past the 0.5 mark
    assert (shown["turn"], shown["answered_by"]) == (1, "small-1")
    assert shown["steps"] == [{"model": "small:1", "reason": "budget pressure: tokens"}]
    assert under_pressure(0.5, {"money": 1.0}, {"money": 0.4}) is None


async def test_when_every_model_fails_the_cache_answers_an_identical_request(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    big, small = Model("big"), Model("small")
    await start_node(_app(big, small, models=(small,), cached=True, on_exhausted="manual"))
    first = await _run(client, "c1")
    assert "agent.degraded" not in [e.type for e in first]
    big.down = small.down = True
    second = await _run(client, "c2")  # the same conversation, tools and parameters
    assert second[-1].payload["output"] == {"limit": 500.0}
    shown = _degraded(second)
    assert shown["answered_by"] == "cache (big-1)"
    assert [s["model"] for s in shown["steps"]] == ["big:1", "small:1", "cache"]
    stats = await admin(client, "model-stats", command_id="ms1", principal=VIEWER)
    assert stats.result is not None
    groups = {(g["model"], g["calls"], g["cached"]) for g in stats.result["groups"]}
    assert groups == {("big:1", 1, 0), ("cache:big-1", 1, 1)}


async def test_when_nothing_answers_the_node_takes_its_on_exhausted_edge(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    big, small = Model("big"), Model("small")
    await start_node(_app(big, small, models=(small,), on_exhausted="manual"))
    big.down = small.down = True
    events = await _run(client, "n1")
    assert events[-1].payload["output"] == {"manual": True}
    shown = _degraded(events)
    assert shown["answered_by"] is None and shown["to"] == "manual"
    assert [s["reason"] for s in shown["steps"]] == ["failed: PERMISSION_DENIED"] * 2


async def test_without_a_fallback_node_the_task_fails_as_the_model_did(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    big, small = Model("big"), Model("small")
    await start_node(_app(big, small, models=(small,)))
    big.down = small.down = True
    events = await _run(client, "f1")
    assert events[-1].type == "task.failed"
    assert _degraded(events)["answered_by"] is None


def test_the_answer_cache_is_bounded_least_recently_used_out() -> None:
    cache = AnswerCache(entries=2)
    cache.put("t", "n", "a", {"x": 1})
    cache.put("t", "n", "b", {"x": 2})
    assert cache.get("t", "n", "a") == {"x": 1}  # now the most recent
    cache.put("t", "n", "c", {"x": 3})
    assert (cache.get("t", "n", "b"), len(cache)) == (None, 2)
    assert cache.get("u", "n", "a") is None  # per tenant
