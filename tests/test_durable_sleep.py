"""Durable sleep: a sleep node parks its task SLEEPING on a timer row (no actor), and the
task goes on at its wake time — on the fake clock, across a node restart, through a pause,
a cancel or a deadline; ``ctx.sleep`` inside a step parks the task the same way, and the step
then runs again with its completed calls and sleeps answered at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import ratchet
from ratchet.protocol.ids import new_id
from ratchet.supervisors.supervision.tasks import task_actor_name
from tests.apps import RUNS
from tests.conftest import NodeFactory, NodeProcess, wait_terminal

HOUR = 3600.0
DONE = {"task.succeeded", "task.failed", "task.cancelled"}


def _count(ctx: ratchet.StepContext) -> None:
    RUNS[f"{ctx.task_id}:{ctx.step_name}"] += 1


def _nap() -> ratchet.Workflow:
    wf = ratchet.Workflow("nap", version=1)

    @wf.step
    async def before(ctx: ratchet.StepContext) -> dict[str, Any]:
        _count(ctx)
        return {"before_at": ctx.clock.now()}

    wf.sleep("nap", seconds=HOUR)

    @wf.step
    async def after(ctx: ratchet.StepContext) -> dict[str, Any]:
        _count(ctx)
        return {"output": {"slept": ctx.clock.now() - ctx.state["before_at"]}}

    return wf


def _nap_until() -> ratchet.Workflow:
    wf = ratchet.Workflow("nap.until", version=1)

    @wf.step
    async def plan(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"wake": ctx.clock.now() + float(ctx.input["in"])}

    wf.sleep("wait_for_it", until=lambda state: state["wake"])

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"woke_at": ctx.clock.now()}}

    return wf


EFFECTS: Counter[str] = Counter()


class Charge(BaseModel):
    order: str


class Charged(BaseModel):
    provider_id: str


async def _charge(ctx: ratchet.ToolContext, args: Charge) -> Charged:
    """Charge an order (the outside world counts the charges it took)."""
    EFFECTS[args.order] += 1
    return Charged(provider_id=f"ch-{args.order}")


charge = ratchet.tool(kind="write", args=Charge, result=Charged,
                      key=lambda a: f"charge:{a.order}", name="charge")(_charge)


def _sleep_in_step() -> ratchet.Workflow:
    wf = ratchet.Workflow("nap.in_step", version=1)

    @wf.step
    async def naps(ctx: ratchet.StepContext) -> dict[str, Any]:
        _count(ctx)
        first = await ctx.call(charge, Charge(order=f"{ctx.task_id}-a"))
        await ctx.sleep(60)
        await ctx.sleep(30)
        second = await ctx.call(charge, Charge(order=f"{ctx.task_id}-b"))
        return {"output": {"ids": [first.provider_id, second.provider_id]}}

    return wf


def _naps_in_a_loop() -> ratchet.Workflow:
    wf = ratchet.Workflow("nap.loop", version=1)

    @wf.step(max_visits=3)
    async def tick(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"n": ctx.state.get("n", 0) + 1}

    wf.sleep("rest", seconds=60)
    wf.choice("again", guard=lambda s: "tick" if s["n"] < 3 else "done",
              targets=["tick", "done"])

    @wf.step
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"n": ctx.state["n"]}}

    return wf


registry = ratchet.Registry([_nap(), _nap_until(), _sleep_in_step(), _naps_in_a_loop()],
                            tools=[charge])


async def _events(client: ratchet.Client, task_id: str, stop: set[str], after: int = 0,
                  timeout: float = 20.0) -> list[ratchet.Event]:
    events: list[ratchet.Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, after=after, follow_terminal=True):
            events.append(event)
            if event.type in stop:
                return

    await asyncio.wait_for(collect(), timeout)
    return events


async def _asleep(client: ratchet.Client, node: ratchet.Node, task_id: str,
                  after: int = 0) -> ratchet.Event:
    """Wait (bounded) for the task's ``sleep.started`` and for its actor to be gone."""
    event = (await _events(client, task_id, {"sleep.started"}, after))[-1]
    for _ in range(500):  # the actor stops right after its commit: bounded, not timed
        if node.system.lookup(task_actor_name(task_id)) is None:
            break
        await asyncio.sleep(0.01)
    assert node.system.lookup(task_actor_name(task_id)) is None, "a sleeping task holds no actor"
    assert (await client.get(task_id)).status == "SLEEPING"
    return event


async def _admin(client: ratchet.Client, verb: str, task_id: str) -> dict[str, Any]:
    """The verb, asked again (same command id) while the node answers a retryable error —
    e.g. "between restarts" while the paused task's actor is being replaced — as a client
    does; bounded."""
    body = {"command_id": new_id("cmd"), "task_id": task_id, "args": {"reason": "test"}}
    async with asyncio.timeout(20):
        while True:
            try:
                return await client.request_admin(verb, body)
            except ratchet.RemoteError as exc:
                if not exc.retryable:
                    raise
            await asyncio.sleep(0.05)  # pacing between attempts; the timeout bounds them


async def test_a_sleeping_task_holds_no_actor_and_goes_on_at_its_wake_time_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-1")).task_id
    started = await _asleep(client, node, task_id)
    assert started.payload["wake_at"] == pytest.approx(clock.now() + HOUR)
    clock.advance(HOUR)  # an hour, in milliseconds
    events = await _events(client, task_id, DONE, after=started.sequence)
    assert [e.type for e in events][:2] == ["sleep.completed", "step.completed"]
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"]["slept"] >= HOUR
    assert RUNS[f"{task_id}:before"] == 1 and RUNS[f"{task_id}:after"] == 1


async def test_a_sleep_survives_a_node_restart_and_the_step_before_it_never_runs_again(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-restart")).task_id
    started = await _asleep(client, node, task_id)
    await node.stop()
    clock.advance(HOUR / 2)  # half of it passes while no node runs
    node = await start_node(registry, clock=clock)
    assert (await client.get(task_id)).status == "SLEEPING"  # not recovered: still parked
    clock.advance(HOUR / 2)
    events = await _events(client, task_id, DONE, after=started.sequence)
    assert events[-1].type == "task.succeeded"
    assert RUNS[f"{task_id}:before"] == 1 and RUNS[f"{task_id}:after"] == 1
    assert "task.recovered" not in [e.type for e in events]


@pytest.mark.slow
async def test_a_node_killed_during_a_sleep_wakes_the_task_after_it_starts_again(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    step_log = tmp_path / "steps.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log)},
                        app_spec="tests.sleep_apps:app")
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("nap.short", {}, key="nap-kill")).task_id
    started = (await _events(client, task_id, {"sleep.started"}))[-1]
    await asyncio.to_thread(node.kill)  # SIGKILL while the task sleeps (3 s, real clock)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert events[-1].type == "task.succeeded"
    woke = next(e for e in events if e.type == "sleep.completed")
    assert woke.occurred_at >= started.payload["wake_at"]
    assert Counter(line.split()[1] for line in step_log.read_text().splitlines()) \
        == {"before": 1, "after": 1}
    assert "task.recovered" not in [e.type for e in events]
    assert node.interrupt() == 0


async def test_until_sleeps_to_a_time_taken_from_the_state(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    planned = clock.now() + 120.0
    task_id = (await client.submit("nap.until", {"in": 120}, key="until-1")).task_id
    started = await _asleep(client, node, task_id)
    assert started.payload["wake_at"] == pytest.approx(planned)
    clock.advance(120.0)
    events = await _events(client, task_id, DONE, after=started.sequence)
    assert events[-1].payload["output"]["woke_at"] >= planned


async def test_a_sleep_inside_a_loop_sleeps_again_at_each_visit(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap.loop", {}, key="loop-1")).task_id
    wakes, after = [], 0
    for _ in range(3):
        started = await _asleep(client, node, task_id, after=after)
        wakes.append(started.payload["wake_at"])
        after = started.sequence
        clock.advance(60.0)
    events = await _events(client, task_id, DONE, after=after)
    assert events[-1].payload["output"] == {"n": 3}
    assert wakes == [wakes[0], wakes[0] + 60, wakes[0] + 120]


async def test_a_cancel_ends_a_sleeping_task(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-cancel")).task_id
    started = await _asleep(client, node, task_id)
    await _admin(client, "cancel", task_id)
    events = await _events(client, task_id, DONE, after=started.sequence)
    assert events[-1].type == "task.cancelled"
    clock.advance(HOUR)  # its timer finds it finished: nothing runs
    assert (await client.get(task_id)).status == "CANCELLED"
    assert RUNS[f"{task_id}:after"] == 0


async def test_a_pause_keeps_the_wake_time_and_a_resume_sleeps_only_the_rest(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-pause")).task_id
    first = await _asleep(client, node, task_id)
    await _admin(client, "pause", task_id)
    paused = (await _events(client, task_id, {"task.paused"}, after=first.sequence))[-1]
    clock.advance(HOUR / 4)
    await _admin(client, "resume", task_id)
    again = await _asleep(client, node, task_id, after=paused.sequence)
    assert again.payload["wake_at"] == first.payload["wake_at"]  # not pushed back by the pause
    assert again.payload["seconds"] == pytest.approx(HOUR * 3 / 4)
    clock.advance(HOUR * 3 / 4)
    events = await _events(client, task_id, DONE, after=again.sequence)
    assert events[-1].type == "task.succeeded"
    assert RUNS[f"{task_id}:before"] == 1


async def test_a_task_resumed_after_its_wake_time_goes_on_at_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-late")).task_id
    first = await _asleep(client, node, task_id)
    await _admin(client, "pause", task_id)
    paused = (await _events(client, task_id, {"task.paused"}, after=first.sequence))[-1]
    clock.advance(2 * HOUR)  # its timer fires while it is paused: late, nothing moves
    await _admin(client, "resume", task_id)
    events = await _events(client, task_id, DONE, after=paused.sequence)
    assert "sleep.started" not in [e.type for e in events]
    assert events[-1].type == "task.succeeded"


async def test_a_deadline_before_the_wake_time_fails_the_sleeping_task_at_the_deadline(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap", {}, key="nap-deadline", deadline_s=600.0)).task_id
    started = await _asleep(client, node, task_id)
    assert started.payload["due_at"] == pytest.approx(started.payload["wake_at"] - HOUR + 600.0,
                                                      abs=1.0)
    clock.advance(600.0)
    events = await _events(client, task_id, DONE, after=started.sequence)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "deadline passed"
    assert RUNS[f"{task_id}:after"] == 0


async def test_ctx_sleep_parks_the_task_and_the_step_goes_on_after_its_last_sleep(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap.in_step", {}, key="in-step")).task_id
    first = await _asleep(client, node, task_id)
    assert (first.payload["step"], first.payload["n"], first.payload["seconds"]) == \
        ("naps", 0, 60)
    clock.advance(60.0)
    second = await _asleep(client, node, task_id, after=first.sequence)
    assert (second.payload["n"], second.payload["seconds"]) == (1, 30)
    clock.advance(30.0)
    events = await _events(client, task_id, DONE, after=second.sequence)
    assert events[-1].payload["output"] == {"ids": [f"ch-{task_id}-a", f"ch-{task_id}-b"]}
    # the step ran three times; each charge was taken once, the first answered by the ledger
    assert RUNS[f"{task_id}:naps"] == 3
    assert (EFFECTS[f"{task_id}-a"], EFFECTS[f"{task_id}-b"]) == (1, 1)


async def test_a_sleep_in_a_step_survives_a_node_restart_and_sleeps_only_the_rest(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    node = await start_node(registry, clock=clock)
    task_id = (await client.submit("nap.in_step", {}, key="in-step-restart")).task_id
    first = await _asleep(client, node, task_id)
    await node.stop()
    clock.advance(40.0)  # two thirds of the first sleep pass while no node runs
    node = await start_node(registry, clock=clock)
    assert (await client.get(task_id)).status == "SLEEPING"
    clock.advance(20.0)
    second = await _asleep(client, node, task_id, after=first.sequence)
    assert second.payload["n"] == 1
    clock.advance(30.0)
    events = await _events(client, task_id, DONE, after=second.sequence)
    assert events[-1].type == "task.succeeded"
    assert EFFECTS[f"{task_id}-a"] == 1


async def test_ctx_sleep_inside_a_fan_out_branch_is_refused_with_a_typed_error() -> None:
    ctx = ratchet.StepContext("t", "acme", "wf", "s", 0, 1, {}, {}, ratchet.FakeClock(), None,
                              branch="b1")
    with pytest.raises(ratchet.WorkflowDefinitionError, match="fan-out branch"):
        await ctx.sleep(5)


@pytest.mark.parametrize("kwargs", [{}, {"seconds": 1, "until": lambda s: 0.0},
                                    {"seconds": 0}, {"seconds": -5}, {"seconds": True},
                                    {"seconds": float("inf")}, {"until": 12.0}])
def test_a_sleep_node_needs_exactly_one_valid_duration(kwargs: dict[str, Any]) -> None:
    wf = ratchet.Workflow("bad.sleep")
    with pytest.raises(ratchet.WorkflowDefinitionError, match="sleep node"):
        wf.sleep("z", **kwargs)


def test_a_sleep_node_is_listed_drawn_and_refused_inside_a_branch() -> None:
    wf = _nap()
    wf.validate()
    assert ("nap", "sleep", "3600s elapsed", "after") in wf.transition_table()
    assert "nap · sleep" in wf.mermaid()
    branch = ratchet.Workflow("branch.sleeps")
    branch.sleep("z", seconds=5)
    parent = ratchet.Workflow("fans")
    parent.fanout("f", {"a": branch}, join="j")
    parent.join("j", of="f")
    with pytest.raises(ratchet.WorkflowDefinitionError, match="a branch may hold only"):
        parent.validate()
