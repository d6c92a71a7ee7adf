"""Workflows for the settling verbs (tests/test_settle.py): a write whose outcome goes
unknown (no query: straight to a human), and steps that declare ``on_exhausted="human"``.
The tool runs in process; ``PAY`` says how its next calls end and counts them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet.actors.agents.models import ModelRequest
from ratchet.actors.agents.scripted_model import Reply, ScriptedModel, reply
from ratchet.protocol.tool_errors import ToolOutcomeUnknown, ToolPermissionDenied, ToolTransient

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


class BookArgs(BaseModel):
    order: str


class Booking(BaseModel):
    booking: str


def _book(ctx: ratchet.ToolContext, args: BookArgs) -> Booking:
    return Booking(booking=f"b-{args.order}")


def _unbook(ctx: ratchet.ToolContext, args: Booking) -> Booking:
    raise ToolPermissionDenied("the booking system refuses cancellations today")


unbook_tool = ratchet.Tool("unbook", _unbook, "write", Booking, Booking,
                           key=lambda a: f"unbook:{a.booking}", timeout=5.0)
book_tool = ratchet.Tool("book", _book, "write", BookArgs, Booking,
                         key=lambda a: f"book:{a.order}", timeout=5.0,
                         compensate=ratchet.Compensation(unbook_tool, lambda a, r: r))
undo = ratchet.Workflow("settle.undo", version=1)


@undo.step
async def reserve(ctx: ratchet.StepContext) -> None:
    await ctx.call(book_tool, BookArgs(order="o2"))


@undo.step
async def refuse(ctx: ratchet.StepContext) -> None:
    raise ratchet.ActionFailed("the order was refused downstream")


#: Set by a test to let ``settle.cancel``'s lingering step end (it is interrupted first).
LINGER = asyncio.Event()
cancelled = ratchet.Workflow("settle.cancel", version=1, compensate_on_cancel=True)


@cancelled.step
async def hold(ctx: ratchet.StepContext) -> None:
    await ctx.call(book_tool, BookArgs(order="o3"))


@cancelled.step
async def linger(ctx: ratchet.StepContext) -> None:
    await LINGER.wait()  # until cancelled


giveup = ratchet.Workflow("settle.giveup", version=1)


@giveup.step
async def take(ctx: ratchet.StepContext) -> None:
    await ctx.call(book_tool, BookArgs(order="o4"))


@giveup.step
async def crash(ctx: ratchet.StepContext) -> None:
    raise RuntimeError("a bug that crashes the step every time")


class Answer(BaseModel):
    limit: float


def _stubborn_then_right(request: ModelRequest) -> Reply:
    """Three answers that are not JSON (its two repairs used up), then a valid one."""
    turn = sum(1 for m in request.messages if m.role == "assistant")
    return reply("no JSON") if turn < 3 else reply(json.dumps({"limit": 5.0}))


def _lookup(ctx: ratchet.ToolContext, args: BookArgs) -> Booking:
    return Booking(booking=args.order)


lookup_tool = ratchet.Tool("lookup", _lookup, "read", BookArgs, Booking)
agent = ratchet.Workflow("settle.agent", version=1)
agent.agent("assistant", model=ScriptedModel(_stubborn_then_right), tools=[lookup_tool],
            output=Answer,
            prompt=lambda state, inp: "What is the limit?", repair_attempts=2,
            on_exhausted="human", next="done")


@agent.step
async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": ctx.state["assistant"]}


#: ``fail``: the charge answers 503 while it is True; ``calls``: calls that reached it.
CHARGE: dict[str, Any] = {"fail": True, "calls": 0}


def _charge(ctx: ratchet.ToolContext, args: PayArgs) -> PayResult:
    CHARGE["calls"] += 1
    if CHARGE["fail"] == "forbidden":
        raise ToolPermissionDenied("the provider refused this merchant")
    if CHARGE["fail"]:
        raise ToolTransient("the provider answered 503")
    return PayResult(provider_id=f"c-{ctx.key}")


charge_tool = ratchet.Tool("charge", _charge, "write", PayArgs, PayResult,
                           key=lambda a: f"charge:{a.order}", timeout=5.0,
                           retry=ratchet.RetryPolicy(max_attempts=2, base_delay=0.0,
                                                     max_delay=0.0))
card = ratchet.Workflow("settle.card", version=1)


@card.step(on_exhausted="human")
async def bill(ctx: ratchet.StepContext) -> dict[str, Any]:
    paid = await ctx.call(charge_tool, PayArgs(order="o9", amount=9.0))
    return {"output": {"paid": paid.provider_id}}


registry = ratchet.Registry([pay, _flaky_workflow("settle.flaky", True),
                             _flaky_workflow("settle.rigid", False), undo, agent,
                             cancelled, giveup, card],
                            tools=[pay_tool, book_tool, unbook_tool, charge_tool])
