"""Workflows for the settling verbs (tests/test_settle.py): a write whose outcome goes
unknown (no query: straight to a human), and steps that declare ``on_exhausted="human"``.
The tool runs in process; ``PAY`` says how its next calls end and counts them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.protocol.tool_errors import ToolOutcomeUnknown

#: ``mode``: ``unknown`` (the call's outcome is lost) or ``ok``; ``calls``: calls made.
PAY: dict[str, Any] = {"mode": "unknown", "calls": 0}
#: ``fail``: the flaky steps raise while it is True; ``runs``: how often they ran.
FLAKY: dict[str, Any] = {"fail": True, "runs": 0}


class PayArgs(BaseModel):
    order: str
    amount: float


class PayResult(BaseModel):
    provider_id: str


def _pay(ctx: ratchet.ToolContext, args: PayArgs) -> PayResult:
    PAY["calls"] += 1
    if PAY["mode"] == "unknown":
        raise ToolOutcomeUnknown("connection dropped after the request was sent")
    return PayResult(provider_id=f"p-{ctx.key}")


pay_tool = ratchet.Tool("pay", _pay, "write", PayArgs, PayResult,
                        key=lambda a: f"pay:{a.order}", timeout=5.0)

pay = ratchet.Workflow("settle.pay", version=2)


@pay.step
async def charge(ctx: ratchet.StepContext) -> dict[str, Any]:
    try:
        paid = await ctx.call(pay_tool, PayArgs(order="o1", amount=5.0))
    except ratchet.ActionFailed:
        return {"provider_id": None}  # the workflow's own route for a failed payment
    return {"provider_id": paid.provider_id}


@pay.step
async def receipt(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"paid": ctx.state["provider_id"]}}


def _flaky_workflow(name: str, skippable: bool) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)

    @wf.step(on_exhausted="human", skippable=skippable)
    async def fetch(ctx: ratchet.StepContext) -> dict[str, Any]:
        FLAKY["runs"] += 1
        if FLAKY["fail"]:
            raise RuntimeError("upstream answered 502")
        return {"fetched": True}

    @wf.step
    async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"fetched": ctx.state.get("fetched", False)}}

    return wf


registry = ratchet.Registry([pay, _flaky_workflow("settle.flaky", True),
                             _flaky_workflow("settle.rigid", False)], tools=[pay_tool])
