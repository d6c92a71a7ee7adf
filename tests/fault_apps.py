"""The workflows the fault tests serve (`ratchet serve --app tests.fault_apps:app`): plain
step chains (tests/apps.py), an approval that parks its task (tests/graph_apps.py) and a
chain whose every step records a write in the action ledger."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import ratchet
from tests.apps import ten, three
from tests.graph_apps import approve


class Entry(BaseModel):
    key: str
    n: int


def _done(ctx: ratchet.ToolContext, args: Entry) -> Entry:
    """Asked about a write whose outcome was left unknown (its node lost mid-call): it took
    effect — this write takes effect as soon as it is called, and changes nothing."""
    return args


@ratchet.tool(kind="write", args=Entry, result=Entry, key=lambda a: a.key, query=_done)
async def record(ctx: ratchet.ToolContext, args: Entry) -> Entry:
    """A write that takes effect at once (its ledger row is what the tests want)."""
    return args


def _ledgered(name: str, steps: int) -> ratchet.Workflow:
    """Steps of one ledgered write each: on PostgreSQL a change with a ledger row runs as a
    transaction of several statements (persistence/postgres/change_call.py), a plain step's
    as one statement."""
    wf = ratchet.Workflow(name, version=1)
    for i in range(steps):
        async def step(ctx: ratchet.StepContext, i: int = i) -> dict[str, Any]:
            delay = float(ctx.input.get("sleep", 0))
            if delay:
                await asyncio.sleep(delay)
            await ctx.call(record, {"key": f"{ctx.task_id}:{i}", "n": i})
            return {"count": ctx.state.get("count", 0) + 1}

        wf.add_step(f"s{i}", step)
    return wf


ledgered = _ledgered("ledgered", 10)

app = ratchet.Registry([three, ten, approve, ledgered])
