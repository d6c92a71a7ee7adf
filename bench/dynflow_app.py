"""Workflows for bench/dynflow.py: a 1,000-iteration loop, the same 1,000 steps declared one
by one, and a map over 1,000 items (or as many as the input says, up to 10,000)."""

from __future__ import annotations

from typing import Any

import ratchet
from ratchet import END

ITERATIONS = 1000
ITEMS = 1000

loop = ratchet.Workflow("loop1000")


@loop.loop(max_iterations=ITERATIONS, next=END)
async def tick(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"n": ctx.state.get("n", 0) + 1}


steps = ratchet.Workflow("steps1000")


async def _tick(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"n": ctx.state.get("n", 0) + 1}


for _i in range(ITERATIONS):
    steps.add_step(f"s{_i:04d}", _tick)


async def _one(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": ctx.state["item"] * 2}


mapped = ratchet.Workflow("map1000")


@mapped.step
async def plan(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"items": list(range(int(ctx.input.get("items", ITEMS))))}


mapped.map("double", items=lambda s: s["items"], branch=_one, into="doubled",
           max_items=10 * ITEMS, next=END)

app = ratchet.Registry([loop, steps, mapped])
