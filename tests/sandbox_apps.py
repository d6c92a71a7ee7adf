"""The workflows and tools of tests/test_sandbox_fork.py: tools declared as a deployment
would declare them for sandbox forks (``sandbox=``), over the finance simulator."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.scripted_model import ScriptedModel, reply
from ratchet.actors.workflow.tools import Tool, ToolContext
from ratchet.testing.expense import (
    ClaimArgs,
    ClaimResult,
    LookupArgs,
    LookupResult,
    lookup_claim,
    refund_claim,
    submit_claim,
)


def stub_claim(ctx: ToolContext, args: ClaimArgs) -> ClaimResult:
    return ClaimResult(provider_id=f"sim-{ctx.key}", status="simulated", amount=args.amount)


def as_sandboxed(tool: Tool[Any, Any], name: str, sandbox: Any) -> Tool[Any, Any]:
    return dataclasses.replace(tool, name=name, sandbox=sandbox, compensate=None)


claim_recorded = as_sandboxed(submit_claim, "claim_recorded", "recorded")
claim_stubbed = as_sandboxed(submit_claim, "claim_stubbed", stub_claim)
lookup_blocked = as_sandboxed(lookup_claim, "lookup_blocked", "blocked")


def claim_of(ctx: ratchet.StepContext, part: str) -> ClaimArgs:
    return ClaimArgs(report_id=ctx.input["report_id"], part=part, employee="e",
                     amount=float(ctx.input.get(part, 10)))


pay = ratchet.Workflow("sbx.pay")


@pay.step
async def travel(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"travel": (await ctx.call(claim_recorded, claim_of(ctx, "travel"))).provider_id}


@pay.step
async def hotel(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"hotel": (await ctx.call(claim_stubbed, claim_of(ctx, "hotel"))).provider_id}


@pay.step
async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"travel": ctx.state["travel"], "hotel": ctx.state["hotel"]}}


plain = ratchet.Workflow("sbx.plain")  # a write declared nothing


@plain.step
async def claim(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": (await ctx.call(submit_claim, claim_of(ctx, "all"))).model_dump()}


reads = ratchet.Workflow("sbx.reads")


@reads.step
async def look(ctx: ratchet.StepContext) -> dict[str, Any]:
    tool = lookup_blocked if ctx.input.get("blocked") else lookup_claim
    seen: LookupResult = await ctx.call(tool, LookupArgs(key=ctx.input["key"]))
    return {"output": {"found": seen.found}}


class Filed(BaseModel):
    filed: bool


MODEL = ScriptedModel([reply(tool_calls=[("claim_recorded", {
    "report_id": "ag", "employee": "e", "amount": 12.0})]), reply(json.dumps({"filed": True}))])
agent = ratchet.Workflow("sbx.agent")
agent.agent("clerk", model=MODEL, tools=[claim_recorded], output=Filed,
            prompt=lambda s, i: f"file the claim of {i['report_id']}", max_visits=1)

PLAIN_MODEL = ScriptedModel([reply(tool_calls=[("submit_claim", {
    "report_id": "ap", "employee": "e", "amount": 3.0})]), reply(json.dumps({"filed": True}))])
plain_agent = ratchet.Workflow("sbx.plain_agent")  # its agent's write declared nothing
plain_agent.agent("clerk", model=PLAIN_MODEL, tools=[submit_claim], output=Filed,
                  prompt=lambda s, i: "file the claim", max_visits=1)

parked = ratchet.Workflow("sbx.parked")


@parked.step
async def first(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"travel": (await ctx.call(claim_recorded, claim_of(ctx, "travel"))).provider_id}


parked.approval("check", on_approve="second", on_reject=ratchet.END, timeout=3600,
                on_timeout="cancel")


@parked.step(next=ratchet.END)
async def second(ctx: ratchet.StepContext) -> dict[str, Any]:
    hotel_id = (await ctx.call(claim_stubbed, claim_of(ctx, "hotel"))).provider_id
    ctx.log.info("second claim filed", hotel=hotel_id)
    return {"output": {"travel": ctx.state["travel"], "hotel": hotel_id}}


fanned_branch = ratchet.Workflow("sbx.branch")


@fanned_branch.step
async def file(ctx: ratchet.StepContext) -> dict[str, Any]:
    args = ClaimArgs(report_id=ctx.input["report_id"], part=ctx.branch or "", employee="e",
                     amount=1.0)
    tool = claim_stubbed if ctx.branch == "x" else claim_recorded
    return {"output": (await ctx.call(tool, args)).provider_id}


fanned = ratchet.Workflow("sbx.fanned")
fanned.fanout("spread", {b: fanned_branch for b in ("x", "y")}, join="gather")
fanned.join("gather", of="spread", policy=ratchet.JoinPolicy("all"))

TOOLS = [claim_recorded, claim_stubbed, submit_claim, refund_claim, lookup_claim, lookup_blocked]
registry = ratchet.Registry([pay, plain, reads, agent, plain_agent, parked, fanned],
                            tools=TOOLS)

