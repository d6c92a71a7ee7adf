"""Workflows the benchmarks serve (``ratchet serve --app bench.app:app``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel

import ratchet


def _trivial(name: str, steps: int) -> ratchet.Workflow:
    wf = ratchet.Workflow(name, version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"n": ctx.state.get("n", 0) + 1}

        wf.add_step(f"s{i}", step)
    return wf


def _big_document(steps: int) -> ratchet.Workflow:
    wf = ratchet.Workflow("big_document", version=1)

    async def load(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"document": os.urandom(1024 * 1024), "n": 0}

    wf.add_step("load", load)
    for i in range(1, steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            return {"n": ctx.state["n"] + 1}  # the 1 MB document stays as it is

        wf.add_step(f"s{i}", step)
    return wf


def _sleepy(steps: int, seconds: float) -> ratchet.Workflow:
    wf = ratchet.Workflow("sleepy", version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            await asyncio.sleep(seconds)
            return {"n": ctx.state.get("n", 0) + 1}

        wf.add_step(f"s{i}", step)
    return wf


class Lookup(BaseModel):
    n: int


@ratchet.tool(kind="read", args=Lookup, result=Lookup)
async def lookup(ctx: ratchet.ToolContext, args: Lookup) -> Lookup:
    """A read tool that answers at once: what a step costs around one call."""
    return Lookup(n=args.n + 1)


def _tooled(name: str, steps: int) -> ratchet.Workflow:
    """Steps of one tool call each (bench/tracing.py: a step with a call and its span)."""
    wf = ratchet.Workflow(name, version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
            found = await ctx.call(lookup, {"n": ctx.state.get("n", 0)})
            return {"n": found.n}

        wf.add_step(f"s{i}", step)
    return wf


app = ratchet.Registry([
    _trivial("seq1000", 1000),
    _trivial("five", 5),
    _big_document(100),
    _sleepy(20, 0.05),
    _tooled("tool1000", 1000),
])
