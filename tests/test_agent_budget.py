"""A model call is admitted only if its worst case fits what the task has left of its
budget (actors/task/agent_budget.py): one answer can no longer overshoot a budget that
the start-of-turn check alone let through."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.loop_detect import LoopPolicy
from ratchet.actors.agents.models import (
    Message,
    ModelRequest,
    ModelResponse,
    Prices,
    ToolSpec,
    Usage,
)
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from ratchet.actors.task.agent_budget import Reservation, prompt_bound, reserve
from tests.agent_apps import lookup_policy
from tests.conftest import NodeFactory, wait_terminal

PRICES = Prices(prompt_per_1k=1.0, completion_per_1k=2.0)


class Verbose(ScriptedModel):
    """Answers with 1,000 tokens unless capped; knows its prompt's size and its prices."""

    prices = PRICES

    def __init__(self) -> None:
        super().__init__([reply(tool_calls=[("lookup_policy", {"category": "travel"})],
                                tokens=(50, 1000))], name="verbose")

    def count_tokens(self, request: ModelRequest) -> int:
        return 50  # exact: what it will report as prompt tokens

    async def complete(self, request: ModelRequest) -> ModelResponse:
        answer = await super().complete(request)
        return ModelResponse(answer.message, answer.usage, answer.model, answer.response_id,
                             cost=PRICES.cost(answer.usage))


class Verdict(BaseModel):
    category: str
    limit: float


def _app(model: Any) -> ratchet.Registry:
    wf = ratchet.Workflow("spend")
    wf.agent("agent", model=model, tools=[lookup_policy], output=Verdict, max_turns=50,
             prompt=lambda s, i: "find the travel limit", on_budget_exhausted="fallback",
             loop=LoopPolicy(repeat=50, alternation=50))

    @wf.step
    async def fallback(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"fallback": True}}

    return ratchet.Registry([wf])


def _request(*texts: str, params: dict[str, Any] | None = None) -> ModelRequest:
    return ModelRequest([Message("user", t) for t in texts],
                        [ToolSpec("lookup", "Look up.", {"type": "object"})], params or {})


# -- the reservation, computed ------------------------------------------------------------


def test_no_token_or_money_budget_needs_no_reservation() -> None:
    assert reserve({"model_calls": 3}, {}, ScriptedModel([reply("x")]), _request("hi")) is None
    # money without prices cannot be bounded before the call: the turn-start check only
    assert reserve({"money": 1.0}, {}, ScriptedModel([reply("x")]), _request("hi")) is None


def test_the_output_is_capped_to_what_the_token_budget_has_left() -> None:
    model = ScriptedModel([reply("x")])
    request = _request("héllo " * 20)
    bound = prompt_bound(model, request)
    assert bound >= len(("héllo " * 20).encode())  # a token is at least a byte
    got = reserve({"tokens": bound + 100}, {}, model, request)
    assert got == Reservation(bound + 100, None, 100)
    capped = reserve({"tokens": bound + 100}, {}, model, _request("héllo " * 20,
                                                                  params={"max_tokens": 30}))
    assert capped == Reservation(bound + 30, None, 30)  # the node's own cap is smaller
    assert reserve({"tokens": bound + 100}, {"tokens": 100}, model, request) == "tokens"


def test_money_buys_output_at_the_models_prices() -> None:
    model = Verbose()
    got = reserve({"money": 1.0}, {"money": 0.25}, model, _request("x"))
    # 0.75 left; the 50-token prompt costs 0.05; 0.70 buys 350 output tokens at 2.0 / 1k
    assert isinstance(got, Reservation)
    assert (got.tokens, got.max_tokens) == (400, 350)
    assert got.money is not None and abs(got.money - 0.75) < 1e-9
    assert reserve({"money": 1.0}, {"money": 0.96}, model, _request("x")) == "money"
    assert got.overrun(400, 0.75) is None
    assert got.overrun(401, 0.80) == {"tokens": 1, "money": 0.050000000000000044}


# -- a node whose model would answer past the budget ------------------------------------


async def test_a_turn_cannot_spend_past_the_token_budget(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    model = Verbose()
    node = await start_node(_app(model))
    events = await _run(client, "t400", {"tokens": 400})
    snapshot = await node.store.load_task(events[0].task_id)
    # One call was sent with max_tokens 350 (50 of prompt): 400 spent, not 1,050.
    assert snapshot.spent["tokens"] == 400
    assert model.calls == 1
    exhausted = next(e for e in events if e.type == "agent.budget_exhausted")
    assert exhausted.payload["dimension"] == "tokens"
    assert events[-1].payload["output"] == {"fallback": True}


async def test_a_turn_cannot_spend_past_the_money_budget(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    model = Verbose()
    node = await start_node(_app(model))
    events = await _run(client, "m1", {"money": 1.0})
    snapshot = await node.store.load_task(events[0].task_id)
    assert snapshot.spent["money"] <= 1.0 + 1e-9
    assert snapshot.spent["tokens"] == 50 + 475  # 0.95 bought 475 tokens at 2.0 / 1k


async def test_a_call_that_cannot_afford_one_token_is_not_made(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    model = Verbose()
    await start_node(_app(model))
    events = await _run(client, "t40", {"tokens": 40})  # the prompt alone is 50
    assert model.calls == 0
    exhausted = next(e for e in events if e.type == "agent.budget_exhausted")
    assert (exhausted.payload["dimension"], exhausted.payload["to"]) == ("tokens", "fallback")


async def _run(client: ratchet.Client, key: str, budget: dict[str, float]) -> list[ratchet.Event]:
    task_id = (await client.submit("spend", {}, key=key, budget=budget)).task_id
    return await wait_terminal(client, task_id)


def test_usage_costs_at_the_prices() -> None:
    assert PRICES.cost(Usage(500, 250)) == 1.0
