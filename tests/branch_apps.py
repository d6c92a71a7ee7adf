"""Workflows whose fan-out branches take several steps, for the branch tests (in process and
via ``ratchet serve``). Each step appends ``<task> <branch> <step> <pid>`` to the file named
by ``RATCHET_TEST_STEP_LOG``, so a test counts which step ran how often, and where; in
process, :data:`RUNS` counts the same.

Input: ``sleep`` (seconds per step), ``gate`` (a :data:`GATES` name: step ``gate_at`` of
every branch waits for it) and ``fail`` (``{branch: [step, times]}``: that step raises its
first ``times`` runs; ``[step, times, "store"]``: raises ``StoreUnavailable``, as a ledger
write of the step's would while the store is down).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections import Counter
from typing import Any

from pydantic import BaseModel

import ratchet
from ratchet import JoinPolicy
from ratchet.actors.workflow.nodes import StepFn
from ratchet.protocol.errors import StoreUnavailable

#: Steps of every branch here.
STEPS = 10
#: Runs per (task, branch, step), in process.
RUNS: Counter[tuple[str, str, int]] = Counter()


class Gate:
    """Where the branches of a test wait until it opens (in process)."""

    def __init__(self, expect: int) -> None:
        self.expect, self.waiting = expect, 0
        self.opened, self.full = asyncio.Event(), asyncio.Event()

    async def wait(self) -> None:
        self.waiting += 1
        if self.waiting >= self.expect:
            self.full.set()
        await self.opened.wait()


GATES: dict[str, Gate] = {}


def _step(i: int) -> StepFn:
    async def step(ctx: ratchet.StepContext) -> dict[str, Any]:
        assert ctx.branch is not None
        RUNS[(ctx.task_id, ctx.branch, i)] += 1
        delay = float(ctx.input.get("sleep", 0))
        if delay:
            await asyncio.sleep(delay)
        gate = ctx.input.get("gate")
        if gate is not None and i == ctx.input.get("gate_at", 1):
            await GATES[gate].wait()
        at, times, *kind = ctx.input.get("fail", {}).get(ctx.branch, (None, 0))
        if i == at and RUNS[(ctx.task_id, ctx.branch, i)] <= times:
            if kind == ["store"]:
                raise StoreUnavailable(f"the store cannot write (step {i} of {ctx.branch})")
            raise RuntimeError(f"step {i} of {ctx.branch} breaks")
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


async def report(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"joined": ctx.state["gather"]}}


def fan(name: str, policy: JoinPolicy, retries: int = 0) -> ratchet.Workflow:
    """Four branches of ten steps, ``b0`` … ``b3``."""
    wf = ratchet.Workflow(name)
    wf.fanout("spread", {f"b{i}": stepped(f"{name}.b{i}") for i in range(4)}, join="gather",
              branch_retries=retries)
    wf.join("gather", of="spread", policy=policy, next="report")
    wf.add_step("report", report)
    return wf


def _items(state: Any) -> list[int]:
    return list(range(int(state["n"])))


async def total(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"branches": len(ctx.state["each"])}}


async def size(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"n": int(ctx.input["n"])}


wide = ratchet.Workflow("steps.map")
wide.add_step("size", size)
wide.map("each", items=_items, branch=stepped("steps.item"), max_items=5000, next="total")
wide.add_step("total", total)

wide_retry = ratchet.Workflow("steps.map_retry")
wide_retry.add_step("size", size)
wide_retry.map("each", items=_items, branch=stepped("steps.item"), item_retries=1,
               next="total")
wide_retry.add_step("total", total)

def live(delta: int) -> None:
    """Count the branch bodies running now, and the peak, in the file named by
    ``RATCHET_TEST_LIVE`` (``"<now> <peak>"``), under a lock: shared by node processes."""
    with open(os.environ["RATCHET_TEST_LIVE"], "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        now, peak = (int(x) for x in (fh.read().split() or ["0", "0"]))
        now += delta
        fh.seek(0)
        fh.truncate()
        fh.write(f"{now} {max(peak, now)}")


async def counted(ctx: ratchet.StepContext) -> dict[str, Any]:
    live(+1)
    try:
        await asyncio.sleep(float(ctx.input.get("sleep", 0)))
    finally:
        live(-1)
    return {"output": {"item": ctx.branch, "pid": os.getpid()}}


#: A map of one-step items, at most ``NARROW`` at once, each counted in ``live``.
NARROW = 4
narrow = ratchet.Workflow("steps.narrow")
narrow.add_step("size", size)
narrow.map("each", items=_items, branch=counted, max_concurrency=NARROW, next="total")
narrow.add_step("total", total)

class Item(BaseModel):
    item: str


class Stamps(BaseModel):
    stamped: int
    pids: int


@ratchet.tool(kind="write", args=Item, result=Item, key=lambda a: f"stamp:{a.item}",
              session="stamps")
def stamp(ctx: ratchet.ToolContext, args: Item) -> Item:
    """Marks the task's ``stamps`` session with the item and the pid of the node serving
    the call (a key per item: calls on several nodes at once change different keys)."""
    ctx.session[f"i{args.item}"] = os.getpid()
    return args


@ratchet.tool(kind="read", args=Item, result=Stamps, session="stamps")
def tally(ctx: ratchet.ToolContext, args: Item) -> Stamps:
    marks = {k: v for k, v in ctx.session.items() if k.startswith("i")}
    return Stamps(stamped=len(marks), pids=len(set(marks.values())))


async def stamp_item(ctx: ratchet.StepContext) -> dict[str, Any]:
    await ctx.call(stamp, Item(item=f"{ctx.task_id}-{ctx.branch}"))
    return {"output": ctx.branch}


async def count_stamps(ctx: ratchet.StepContext) -> dict[str, Any]:
    found = await ctx.call(tally, Item(item="all"))
    return {"output": found.model_dump()}


#: A map whose every item calls a tool of the task's ``stamps`` session, wherever it runs;
#: the task then reads the session on its own node.
stamped = ratchet.Workflow("steps.stamped")
stamped.add_step("size", size)
stamped.map("each", items=_items, branch=stamp_item, next="count")
stamped.add_step("count", count_stamps)

app = ratchet.Registry([
    fan("steps.fan", JoinPolicy("all")),
    fan("steps.retry", JoinPolicy("all"), retries=2),
    fan("steps.optional", JoinPolicy("required", required=frozenset({"b0", "b1", "b2"}))),
    wide,
    wide_retry,
    narrow,
    stamped,
])
