"""Maps (fan-outs over a list) and loops the dynamic-flow tests serve (in-process, and via
``ratchet serve --app tests.dynflow_apps:app`` for the SIGKILL tests).

Bodies append ``<task_id> <what>`` to ``$RATCHET_TEST_STEP_LOG`` when it is set: what ran,
and how often, read back by the crash tests.
"""

from __future__ import annotations

import asyncio
import os
from decimal import Decimal
from typing import Any

import ratchet
from ratchet import END, JoinPolicy

#: Items running now, and the most at once (in-process tests reset it).
LIVE = {"now": 0, "peak": 0}


def _note(ctx: ratchet.StepContext, what: str) -> None:
    path = os.environ.get("RATCHET_TEST_STEP_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{ctx.task_id} {what}\n")


async def fetch(ctx: ratchet.StepContext) -> dict[str, Any]:
    """One item of a map: fails, hangs or sleeps as the task input says."""
    item = ctx.state["item"]
    if item in ctx.input.get("fail", []):
        raise RuntimeError(f"item {item} breaks")
    LIVE["now"] += 1
    LIVE["peak"] = max(LIVE["peak"], LIVE["now"])
    try:
        if item in ctx.input.get("hang", []):
            await asyncio.Event().wait()
        await asyncio.sleep(float(ctx.input.get("sleep", 0)))
    finally:
        LIVE["now"] -= 1
    _note(ctx, f"item:{ctx.state['index']}")
    return {"output": {"item": item, "index": ctx.state["index"], "branch": ctx.branch}}


def _mapped(name: str, policy: JoinPolicy | None = None, **options: Any) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)

    @wf.step
    async def plan(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"urls": list(ctx.input.get("urls", [])), "suffix": "!"}

    wf.map("fetch_all", items=lambda s: s["urls"], branch=fetch, into="pages", policy=policy,
           **options)

    @wf.step(next=END)
    async def summarize(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"pages": ctx.state["pages"]}}

    return wf


# A Workflow as a map's branch: a step, then a choice on the item.
shout = ratchet.Workflow("shout")


@shout.step
async def upper(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"word": str(ctx.state["item"]).upper()}


shout.choice("long", guard=lambda s: "mark" if len(s["word"]) > 3 else "keep",
             targets=["mark", "keep"])


@shout.step(next=END)
async def mark(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": ctx.state["word"] + "!"}


@shout.step(next=END)
async def keep(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": ctx.state["word"]}


words = ratchet.Workflow("map.words")


@words.step
async def seed(ctx: ratchet.StepContext) -> None:
    ctx.state["words"] = ctx.input["words"]


words.map("each", items=lambda s: s["words"], branch=shout, into="shouted")


@words.step
async def show(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"shouted": ctx.state["shouted"]}}


# Items the store cannot hold (Decimal is not msgpack data).
unstorable = ratchet.Workflow("map.unstorable")
unstorable.map("each", items=lambda s: [1, Decimal("2.5")], branch=fetch)


# ``items`` that is no list (None here): the task fails before any item runs.
listless = ratchet.Workflow("map.listless")
listless.map("each", items=lambda s: s.get("nothing"), branch=fetch)  # type: ignore[arg-type,return-value]


# -- loops ------------------------------------------------------------------------------

counted = ratchet.Workflow("loop.counted")


@counted.loop(max_iterations=200)
async def tick(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"ticks": ctx.state.get("ticks", 0) + 1, "last": ctx.iteration}


@counted.step
async def report(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"ticks": ctx.state["ticks"], "last": ctx.state["last"]}}


until = ratchet.Workflow("loop.until")


@until.loop(until=lambda s: s["total"] >= s["goal"], max_iterations=500)
async def add(ctx: ratchet.StepContext) -> dict[str, Any]:
    """Adds one per iteration, slowly if asked; notes each iteration that ran."""
    await asyncio.sleep(float(ctx.input.get("sleep", 0)))
    _note(ctx, f"iteration:{ctx.iteration}")
    return {"goal": int(ctx.input["goal"]), "total": ctx.state.get("total", 0) + 1}


@until.step
async def total(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"total": ctx.state["total"]}}


stubborn = ratchet.Workflow("loop.stubborn")


@stubborn.loop(until=lambda s: False, max_iterations=3)
async def never(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"tries": ctx.state.get("tries", 0) + 1}


escalating = ratchet.Workflow("loop.escalating")


@escalating.loop(until=lambda s: False, max_iterations=3, on_exhausted="give_up", next="won")
async def again(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"tries": ctx.state.get("tries", 0) + 1}


@escalating.step(next=END)
async def won(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"won": True}}


@escalating.step(next=END)
async def give_up(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"gave_up_after": ctx.state["tries"]}}


reentered = ratchet.Workflow("loop.reentered")


@reentered.loop(max_iterations=2)
async def inner(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"seen": [*ctx.state.get("seen", []), ctx.iteration]}


reentered.choice("again", guard=lambda s: "inner" if len(s["seen"]) < 6 else "finish",
                 targets=["inner", "finish"], max_visits=3)


@reentered.step
async def finish(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"seen": ctx.state["seen"]}}


flaky = ratchet.Workflow("loop.flaky")


@flaky.loop(max_iterations=4)
async def wobble(ctx: ratchet.StepContext) -> dict[str, Any]:
    """Iteration 2 raises on its first attempt: the actor crashes and runs it again."""
    if ctx.iteration == 2 and ctx.attempt == 1:
        raise RuntimeError("iteration 2 wobbles")
    return {"seen": [*ctx.state.get("seen", []), [ctx.iteration, ctx.attempt]]}


@flaky.step
async def settle(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"output": {"seen": ctx.state["seen"]}}


unsure = ratchet.Workflow("loop.unsure")


@unsure.loop(until=lambda s: s["missing"], max_iterations=3)
async def guess(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {"guessed": True}


app = ratchet.Registry([
    _mapped("map.all", max_concurrency=4),
    _mapped("map.k", JoinPolicy("at_least", k=2)),
    _mapped("map.bounded", max_items=5),
    _mapped("map.timed", item_timeout=0.5),
    words, unstorable, listless, counted, until, stubborn, escalating, reentered, flaky,
    unsure,
])
