"""A fan-out runs at most ``max_concurrency`` of a task's branches at once; the others wait
their turn, each branch's time budget counts from its turn, and a waiting branch the join
no longer needs is stopped like a running one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import ratchet
from ratchet import JoinPolicy
from ratchet.actors.task.fanout import _gates, branch_slot
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal

#: What the branch bodies of the running test report: how many run now, and the peak.
LIVE = {"now": 0, "peak": 0}
#: Events of the running test, by name (created on the test's loop).
SIGNALS: dict[str, asyncio.Event] = {}


def _signal(name: str) -> asyncio.Event:
    return SIGNALS.setdefault(name, asyncio.Event())


@pytest.fixture(autouse=True)
def _reset() -> None:
    LIVE.update(now=0, peak=0)
    SIGNALS.clear()


def _branch(name: str) -> ratchet.Workflow:
    wf = ratchet.Workflow(f"branch-{name}")

    @wf.step
    async def work(ctx: ratchet.StepContext) -> dict[str, Any]:
        LIVE["now"] += 1
        LIVE["peak"] = max(LIVE["peak"], LIVE["now"])
        try:
            _signal(f"{ctx.branch}:started").set()
            mode = ctx.input.get("mode", {}).get(ctx.branch, "work")
            if mode == "hang":
                await asyncio.Event().wait()
            elif mode == "gated":
                await _signal(f"{ctx.branch}:release").wait()
            else:
                await asyncio.sleep(0.02)  # some work, so that branches overlap
        finally:
            LIVE["now"] -= 1
        return {"output": ctx.branch}

    return wf


def _fanout(name: str, branches: list[str], policy: JoinPolicy, *, max_concurrency: int,
            branch_timeout: float | None = None) -> ratchet.Workflow:
    wf = ratchet.Workflow(name)
    wf.fanout("spread", {b: _branch(b) for b in branches}, join="gather",
              max_concurrency=max_concurrency, branch_timeout=branch_timeout)
    wf.join("gather", of="spread", policy=policy)
    return wf


TWENTY = [f"b{i:02d}" for i in range(20)]
app = ratchet.Registry([
    _fanout("fan.twenty", TWENTY, JoinPolicy("all"), max_concurrency=3),
    _fanout("fan.timed", ["first", "second"], JoinPolicy("all"), max_concurrency=1,
            branch_timeout=5.0),
    _fanout("fan.any", ["a", "b", "c"], JoinPolicy("at_least", k=1), max_concurrency=1),
])


async def test_twenty_branches_with_max_concurrency_three_never_run_more_than_three_at_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("fan.twenty", {}, key="twenty")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert sorted(e.payload["branch"] for e in events if e.type == "branch.completed") == TWENTY
    assert LIVE["peak"] == 3  # the limit held, and was used
    assert_contiguous(events)
    assert not _gates  # no gate outlives its fan-out


async def test_a_branch_time_budget_counts_from_its_turn_not_from_the_fanout_start(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(app, clock=clock)
    started = clock.now()
    task_id = (await client.submit("fan.timed", {"mode": {"first": "gated", "second": "hang"}},
                                  key="timed")).task_id
    await asyncio.wait_for(_signal("first:started").wait(), 20)
    asleep = clock.sleepers
    clock.advance(4.0)  # "second" has waited 4 s of its 5 s budget, had it started counting
    _signal("first:release").set()
    await asyncio.wait_for(_signal("second:started").wait(), 20)
    assert store_timers(await node.store.due_timers(started + 100)) == {  # type: ignore[union-attr]
        f"br:{task_id}:spread#0:first": started + 5.0,
        f"br:{task_id}:spread#0:second": started + 4.0 + 5.0,  # armed on its turn
    }
    # The services the first advance woke (the timer service among them) sleep again
    # before the next one: a service between two reads of the clock could miss it.
    await asyncio.wait_for(_until(lambda: clock.sleepers >= asleep), 10)
    clock.advance(6.0)
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    timed_out = [e.payload["branch"] for e in events if e.type == "branch.timed_out"]
    assert timed_out == ["second"]


async def _until(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110 - yields to the loop only; bounded by the caller
        await asyncio.sleep(0)


def store_timers(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {r["timer_id"]: r["due_at"] for r in rows if r["kind"] == "branch_timeout"}


async def test_branches_waiting_for_their_turn_are_stopped_once_the_join_has_decided(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id = (await client.submit("fan.any", {"mode": {"b": "hang", "c": "hang"}}, key="any")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    join = next(e for e in events if e.type == "join.completed")
    assert join.payload["succeeded"] == ["a"] and join.payload["cancelled"] == ["b", "c"]
    for b in "bc":
        assert node.system.lookup(f"node/tasks/{task_id}/branch:spread#0:{b}") is None
    assert LIVE["now"] == 0 and not _gates


def test_max_concurrency_below_one_is_refused_at_registration() -> None:
    for bad in (0, -2):
        with pytest.raises(ratchet.WorkflowDefinitionError,
                           match=r"node 'spread' \(fanout\): max_concurrency must be an int >= 1"):
            ratchet.Registry([_fanout("bad", ["x"], JoinPolicy("all"), max_concurrency=bad)])


async def test_a_cancelled_wait_for_a_branch_slot_takes_no_slot() -> None:
    async def hold(release: asyncio.Event) -> None:
        async with branch_slot("t", "f#0", 1):
            await release.wait()

    done = asyncio.Event()
    holder = asyncio.create_task(hold(done))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(hold(done)) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    for w in waiters[:2]:
        w.cancel()
    done.set()
    await asyncio.wait_for(asyncio.gather(holder, waiters[2]), 1.0)
    assert all(w.cancelled() for w in waiters[:2])
    assert not _gates
