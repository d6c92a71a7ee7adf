"""Workflows whose fan-out branches take several steps, for the branch tests (in process and
via ``ratchet serve``). Each step appends ``<task> <branch> <step> <pid>`` to the file named
by ``RATCHET_TEST_STEP_LOG``, so a test counts which step ran how often, and where."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ratchet
from ratchet import JoinPolicy
from ratchet.actors.workflow.nodes import StepFn

#: Steps of every branch here.
STEPS = 10


def _step(i: int) -> StepFn:
    async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
        delay = float(ctx.input.get("sleep", 0))
        if delay:
            await asyncio.sleep(delay)
        path = os.environ.get("RATCHET_TEST_STEP_LOG")
        if path:
            with open(path, "a") as fh:  # noqa: ASYNC230 - one short line, test only
                fh.write(f"{ctx.task_id} {ctx.branch} {i} {os.getpid()}\n")
        done = [*ctx.state.get("done", []), i]  # the state a resumed branch goes on from
        if i == STEPS - 1:
            return {"done": done, "output": {"branch": ctx.branch, "done": done}}
        return {"done": done}

    return step


def stepped(name: str) -> ratchet.Workflow:
    """A branch of :data:`STEPS` steps, ``s0`` … ``s9``."""
    wf = ratchet.Workflow(name)
    for i in range(STEPS):
        wf.add_step(f"s{i}", _step(i))
    return wf


fan = ratchet.Workflow("steps.fan")
fan.fanout("spread", {f"b{i}": stepped(f"steps.b{i}") for i in range(4)}, join="gather")
fan.join("gather", of="spread", policy=JoinPolicy("all"), next="report")


@fan.step
async def report(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"joined": ctx.state["gather"]}}


def _items(state: Any) -> list[int]:
    return list(range(int(state["n"])))


wide = ratchet.Workflow("steps.map")
wide.map("each", items=_items, branch=stepped("steps.item"), max_items=5000, next="total")


@wide.step
async def total(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"branches": len(ctx.state["each"])}}


app = ratchet.Registry([fan, wide])
