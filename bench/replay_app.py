"""Workflows ``bench/replay.py`` records and replays: ``rb.long`` (1,000 trivial steps) and
``rb.five`` (5 nodes: a read, a write, a choice, two plain steps). Version 2 of ``rb.five``
is the candidate with planted changes: a task whose input says ``plant`` gets one change of
that kind (``arg``: the write's argument, ``route``: the choice, ``state``: a step's result).
:data:`CALLS` counts the tools' real calls (a replay must make none)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet import END

CALLS: Counter[str] = Counter()


class Amount(BaseModel):
    ref: str
    n: int


@ratchet.tool(kind="read", args=Amount, result=Amount)
async def quote(ctx: ratchet.ToolContext, args: Amount) -> Amount:
    """A read answering at once."""
    CALLS["quote"] += 1
    return Amount(ref=args.ref, n=args.n + 1)


@ratchet.tool(kind="write", args=Amount, result=Amount, key=lambda a: f"book:{a.ref}")
async def book(ctx: ratchet.ToolContext, args: Amount) -> Amount:
    """A write answering at once (no provider: the ledger records it all the same)."""
    CALLS["book"] += 1
    return Amount(ref=args.ref, n=args.n * 2)


def _long(steps: int) -> ratchet.Workflow:
    wf = ratchet.Workflow("rb.long", version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"n": ctx.state.get("n", 0) + 1}

        wf.add_step(f"s{i}", step)
    return wf


def five(version: int = 1) -> ratchet.Workflow:
    planted = version > 1
    wf = ratchet.Workflow("rb.five", version=version)

    def plant(ctx: ratchet.StepContext | dict[str, Any], kind: str) -> bool:
        inp = ctx.input if isinstance(ctx, ratchet.StepContext) else ctx
        return planted and inp.get("plant") == kind

    @wf.step
    async def price(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"price": (await ctx.call(quote, {"ref": ctx.input["ref"], "n": 1})).n}

    @wf.step(next="pick")
    async def reserve(ctx: ratchet.StepContext) -> dict[str, Any]:
        n = ctx.state["price"] + (1 if plant(ctx, "arg") else 0)
        return {"booked": (await ctx.call(book, {"ref": ctx.input["ref"], "n": n})).n,
                "plant": ctx.input.get("plant")}

    wf.choice("pick", lambda s: "other" if planted and s.get("plant") == "route" else "note",
              ["note", "other"])

    @wf.step(next="close")
    async def note(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"note": "late" if plant(ctx, "state") else "ok"}

    @wf.step(next="close")
    async def other(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"note": "other"}

    @wf.step(next=END)
    async def close(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"booked": ctx.state["booked"]}}

    return wf


app = ratchet.Registry([_long(1000), five(1)])
candidate = ratchet.Registry([_long(1000), five(1), five(2)])
