"""The workflows the replay tests record and replay: one read, two writes (the second
dropped after the provider committed it: UNKNOWN, reconciled by query), a choice, an agent
node on an OpenAI-compatible model (the model stub), and a last step.

Version 2 of the same workflow changes one thing of each kind: a tool argument (the first
claim's amount), the route (the choice's guard) and the agent's prompt. Every tool call made
for real is counted in :data:`CALLS` (the replay must add none).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet import END
from ratchet.actors.workflow.tools import Tool, ToolContext
from ratchet.testing.expense import (
    RETRY,
    ClaimArgs,
    ClaimResult,
    LookupArgs,
    LookupResult,
    _lookup,
    _query_claim,
    _submit_claim,
)
from tests.agent_apps import Category, Policy, Verdict

#: Tool functions run for real, by tool name.
CALLS: Counter[str] = Counter()
REPORT = {"report_id": "R-7", "employee": "ada", "amount": 120.0}


def _counted_lookup(ctx: ToolContext, args: LookupArgs) -> LookupResult:
    CALLS["lookup_claim"] += 1
    return _lookup(ctx, args)


def _counted_claim(ctx: ToolContext, args: ClaimArgs) -> Any:
    CALLS["submit_claim"] += 1
    return _submit_claim(ctx, args)


def _counted_query(ctx: ToolContext, args: ClaimArgs) -> Any:
    CALLS["query_claim"] += 1
    return _query_claim(ctx, args)


async def _policy(ctx: ToolContext, args: Category) -> Policy:
    """Look up the expense policy of a category."""
    CALLS["lookup_policy"] += 1
    return Policy(category=args.category, limit={"travel": 500.0}.get(args.category, 100.0))


lookup_claim = Tool("lookup_claim", _counted_lookup, "read", LookupArgs, LookupResult,
                    timeout=3.0, retry=RETRY, session="finance")
submit_claim = Tool("submit_claim", _counted_claim, "write", ClaimArgs, ClaimResult,
                    key=lambda a: f"claim:{a.report_id}:{a.part}:submit", timeout=3.0,
                    retry=RETRY, query=_counted_query, session="finance")
policy = Tool("lookup_policy", _policy, "read", Category, Policy)


class Summary(BaseModel):
    claims: list[str]


def claim_workflow(model: Any, version: int = 1, *, factor: float = 1.0,
                   route: str = "assistant", prompt: str = "What is the travel limit?"
                   ) -> ratchet.Workflow:
    """``replay.claim`` at ``version``: ``factor`` scales the first claim's amount, ``route``
    is where the choice goes, ``prompt`` the agent's question."""
    wf = ratchet.Workflow("replay.claim", version=version)

    @wf.step
    async def lookup(ctx: ratchet.StepContext) -> dict[str, Any]:
        found = await ctx.call(lookup_claim, {"key": f"claim:{ctx.input['report_id']}:a:submit"})
        return {"seen": found.found}

    @wf.step
    async def claim_a(ctx: ratchet.StepContext) -> dict[str, Any]:
        res = await ctx.call(submit_claim, ClaimArgs(
            report_id=ctx.input["report_id"], part="a", employee=ctx.input["employee"],
            amount=ctx.input["amount"] * factor))
        return {"claim_a": res.provider_id}

    @wf.step(next="route")
    async def claim_b(ctx: ratchet.StepContext) -> dict[str, Any]:
        res = await ctx.call(submit_claim, ClaimArgs(
            report_id=ctx.input["report_id"], part="b", employee=ctx.input["employee"],
            amount=10.0))
        return {"claim_b": res.provider_id}

    wf.choice("route", lambda s: route, ["assistant", "done"])
    wf.agent("assistant", model=model, tools=[policy], output=Verdict,
             system="You check expense policies.", prompt=lambda state, inp: prompt,
             next="done")

    @wf.step(next=END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"claims": [ctx.state["claim_a"], ctx.state["claim_b"]],
                           "verdict": ctx.state.get("assistant")}}

    return wf


def registry(model: Any, finance_url: str, *workflows: ratchet.Workflow) -> ratchet.Registry:
    return ratchet.Registry(list(workflows) or [claim_workflow(model)],
                            resources={"finance_url": finance_url})
