"""Tool sessions pinned to a tool worker (issue 19, item 4; actors/effects/pinned_sessions.py):
a task's calls of a tool with a session all go to the worker that took the session, which
keeps its live resource between them; the state is the node's, stored after each call, so
a worker restarted under the same id (or any worker, once the pin is dropped) builds the
session again from it and goes on where it was."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from pydantic import BaseModel

import ratchet
from tests.conftest import NodeFactory


class Step(BaseModel):
    by: int


class Position(BaseModel):
    position: int
    worker: str


cursor = ratchet.remote_tool("cursor", kind="read", args=Step, result=Position, timeout=2.0,
                             session="db", retry=ratchet.RetryPolicy(max_attempts=5,
                                                                     base_delay=0.1,
                                                                     max_delay=0.2))
release = asyncio.Event()

walk = ratchet.Workflow("pinned.walk", version=1)


@walk.step
async def three_moves(ctx: ratchet.StepContext) -> dict[str, Any]:
    seen = [(await ctx.call(cursor, Step(by=1))).model_dump() for _ in range(3)]
    return {"seen": seen}


@walk.step
async def after_restart(ctx: ratchet.StepContext) -> dict[str, Any]:
    await release.wait()
    last = (await ctx.call(cursor, Step(by=10))).model_dump()
    return {"output": {"seen": [*ctx.state["seen"], last]}}


app = ratchet.Registry([walk], tools=[cursor])


class Connection:
    """The live resource: opened once per session on a worker, closed when it goes."""

    def __init__(self, opened: Counter[str], worker: str) -> None:
        self.closed = False
        opened[worker] += 1

    def close(self) -> None:
        self.closed = True


class Calls:
    """What the workers saw, for the test to wait on."""

    def __init__(self) -> None:
        self.opened: Counter[str] = Counter()
        self.connections: list[Connection] = []
        self.answered: list[Position] = []
        self.three = asyncio.Event()


def worker(url: str, name: str, calls: Calls) -> ratchet.ToolWorker:
    async def move(ctx: ratchet.ToolContext, args: Step) -> Position:
        if "conn" not in ctx.live:  # a session this worker did not hold: build it again
            ctx.live["conn"] = Connection(calls.opened, name)
            calls.connections.append(ctx.live["conn"])
        ctx.session["position"] = ctx.session.get("position", 0) + args.by
        answer = Position(position=ctx.session["position"], worker=name)
        calls.answered.append(answer)
        if len(calls.answered) == 3:
            calls.three.set()
        return answer

    return ratchet.ToolWorker(url, [ratchet.served_by(cursor, move)], "acme",
                              worker_id=name.split("#")[0])


async def _two_workers(url: str, calls: Calls) -> list[ratchet.ToolWorker]:
    release.clear()
    workers = [worker(url, "wa", calls), worker(url, "wb", calls)]
    for w in workers:
        await w.start()
    return workers


async def _walk_three_moves(client: ratchet.Client, calls: Calls,
                            key: str) -> tuple[ratchet.TaskHandle, str]:
    """A walk submitted and its first three moves answered; its handle and the worker that
    holds its session."""
    handle = await client.submit("pinned.walk", {}, key=key)
    await asyncio.wait_for(calls.three.wait(), 30)
    return handle, calls.answered[0].worker


async def test_a_session_stays_on_its_worker_and_survives_the_workers_restart(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    calls = Calls()
    workers = await _two_workers(nats_url, calls)
    try:
        handle, holder = await _walk_three_moves(client, calls, "walk-1")
        # All three on the worker that took the session, one connection opened there.
        assert [(a.position, a.worker) for a in calls.answered] == [
            (1, holder), (2, holder), (3, holder)]
        assert calls.opened == {holder: 1}
        # The holder restarts (same worker id): its connection is closed, the session's
        # next call goes to its pinned subject, and the new process builds the session
        # again from the state the node stored.
        await workers[0 if holder == "wa" else 1].stop()
        assert calls.connections[0].closed
        restarted = worker(nats_url, f"{holder}#2", calls)
        workers.append(restarted)
        await restarted.start()
        release.set()
        output = await handle.result(timeout=30)
        assert output["seen"][-1] == {"position": 13, "worker": f"{holder}#2"}
        assert [s["position"] for s in output["seen"][:3]] == [1, 2, 3]
        assert calls.opened == {holder: 1, f"{holder}#2": 1}
        assert restarted.sessions.started == 1
    finally:
        release.set()
        for w in workers:
            await w.stop()


async def test_a_session_whose_worker_is_gone_moves_to_another_with_its_state(
        nats_url: str, start_node: NodeFactory, client: ratchet.Client) -> None:
    await start_node(app)
    calls = Calls()
    workers = await _two_workers(nats_url, calls)
    try:
        handle, holder = await _walk_three_moves(client, calls, "walk-2")
        # The holder goes for good: the node's liveness probe finds nobody on its ping
        # subject, so the next call is not sent there: it fails at once (ToolWorkerGone),
        # the node drops the pin, the read is retried on the shared subject, and the other
        # worker takes the session from its state.
        await workers[0 if holder == "wa" else 1].stop()
        release.set()
        output = await handle.result(timeout=30)
        other = "wb" if holder == "wa" else "wa"
        assert output["seen"][-1] == {"position": 13, "worker": other}
        assert calls.opened == {holder: 1, other: 1}
    finally:
        release.set()
        for w in workers:
            await w.stop()
