"""Agent workflows the agent tests serve (in-process, and via ``ratchet serve``)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet import END
from ratchet.actors.agents.loop_detect import LoopPolicy
from ratchet.actors.agents.models import ModelRequest
from ratchet.actors.agents.scripted_model import ScriptedModel, reply


class Category(BaseModel):
    category: str


class Policy(BaseModel):
    category: str
    limit: float


async def _lookup_policy(ctx: ratchet.ToolContext, args: Category) -> Policy:
    """Look up the expense policy of a category."""
    delay = float(os.environ.get("RATCHET_TEST_TOOL_DELAY", "0"))
    if delay:
        await asyncio.sleep(delay)
    return Policy(category=args.category, limit={"travel": 500.0}.get(args.category, 100.0))


class Door(BaseModel):
    status: str


async def _toggle(ctx: ratchet.ToolContext, args: Category) -> Door:
    """Flip a door and report its status."""
    flips = int(ctx.session.get("flips", 0)) + 1
    ctx.session["flips"] = flips
    return Door(status="open" if flips % 2 else "closed")


lookup_policy = ratchet.Tool("lookup_policy", _lookup_policy, "read", Category, Policy)
lookup_rate = ratchet.Tool("lookup_rate", _lookup_policy, "read", Category, Policy)
toggle = ratchet.Tool("toggle", _toggle, "read", Category, Door)


class Verdict(BaseModel):
    category: str
    limit: float


def _last_tool_result(request: ModelRequest) -> dict[str, Any]:
    for m in reversed(request.messages):
        if m.role == "tool" and m.content:
            data = json.loads(m.content)
            if "error" not in data:
                return dict(data)
    return {}


def _answer_from_tools(request: ModelRequest) -> dict[str, Any]:
    """Turn 0: look up travel; then answer with what the tool said."""
    turn = sum(1 for m in request.messages if m.role == "assistant")
    if turn == 0:
        return reply(tool_calls=[("lookup_policy", {"category": "travel"})])
    if turn == 1:
        return reply(tool_calls=[("lookup_policy", {"category": "meals"})])
    found = _last_tool_result(request)
    return reply(json.dumps({"category": found.get("category"), "limit": found.get("limit")}))


def agent_workflow(name: str, model: Any, *, loop: LoopPolicy | None = None,
                   on_budget_exhausted: str = "FAIL_", max_turns: int = 20) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)
    wf.agent("assistant", model=model, tools=[lookup_policy, lookup_rate, toggle],
             output=Verdict, system="You check expense policies.",
             prompt=lambda state, inp: f"What is the limit for {inp.get('category', 'meals')}?",
             loop=loop, max_turns=max_turns,
             on_budget_exhausted="fallback" if on_budget_exhausted == "fallback" else "fail",
             next="done")

    @wf.step(next=END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": ctx.state["assistant"]}

    if on_budget_exhausted == "fallback":
        @wf.step(next=END)
        async def fallback(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"output": {"fallback": True}}

    return wf


happy = agent_workflow("agent.happy", ScriptedModel(_answer_from_tools))
sloppy = agent_workflow("agent.sloppy", ScriptedModel([
    reply(tool_calls=[("delete_everything", {})]),
    reply(tool_calls=[("lookup_policy", {"categry": "travel"})]),
    reply(tool_calls=[("lookup_policy", {"category": "travel"})]),
    reply("the limit is 500"),  # not JSON: repaired
    reply(json.dumps({"category": "travel", "limit": 500.0})),
]))
stubborn = agent_workflow("agent.stubborn", ScriptedModel([reply("no JSON, ever")]))
repeat = agent_workflow("agent.repeat", ScriptedModel(
    [reply(tool_calls=[("lookup_policy", {"category": "travel"})])]))
alternate = agent_workflow("agent.alternate", ScriptedModel(
    lambda r: reply(tool_calls=[("lookup_policy" if sum(
        1 for m in r.messages if m.role == "assistant") % 2 == 0 else "lookup_rate",
        {"category": str(sum(1 for m in r.messages if m.role == "assistant"))})])))
oscillate = agent_workflow("agent.oscillate", ScriptedModel(
    lambda r: reply(tool_calls=[("toggle", {"category": str(
        sum(1 for m in r.messages if m.role == "assistant"))})])),
    loop=LoopPolicy(watch_field="status", window=6, flips=4, alternation=50))
spender = agent_workflow("agent.spender", ScriptedModel(
    [reply(tool_calls=[("lookup_policy", {"category": "travel"})], tokens=(10, 5), cost=0.5)]),
    on_budget_exhausted="fallback", loop=LoopPolicy(repeat=50, alternation=50))
slow = agent_workflow("agent.slow", ScriptedModel(
    lambda r: reply(tool_calls=[("lookup_policy", {"category": f"c{n}"})]) if (n := sum(
        1 for m in r.messages if m.role == "assistant")) < 5 else
    reply(json.dumps({"category": "c4", "limit": 100.0}))))

app = ratchet.Registry([happy, sloppy, stubborn, repeat, alternate, oscillate, spender, slow])
