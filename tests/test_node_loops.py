"""Loop detection for every node: a node on a cycle that leaves the state as it found it,
visit after visit, is told once (``node.loop_suspected``) and then stopped
(``node.loop_detected``: routed along the workflow's ``on_loop``, else LOOP_DETECTED); a
cycle that changes the state is progress, not a loop."""

from __future__ import annotations

from typing import Any

import pytest

import ratchet
from ratchet.persistence.checkpoints import StateTracker
from ratchet.protocol.errors import WorkflowDefinitionError
from tests.conftest import NodeFactory, wait_terminal


def polling(name: str, *, progress: bool, loops: ratchet.NodeLoops | None = None,
            max_visits: int = 12) -> ratchet.Workflow:
    """``check`` asks a provider whose answer never changes, then goes round again; with
    ``progress`` it also counts its rounds in the state."""
    wf = ratchet.Workflow(name, loops=loops)

    @wf.step(next="decide", max_visits=max_visits)
    async def check(ctx: ratchet.StepContext) -> dict[str, Any]:
        update: dict[str, Any] = {"status": "pending"}
        if progress:
            update["rounds"] = ctx.state.get("rounds", 0) + 1
        return update

    wf.choice("decide", lambda s: "check" if s.get("rounds", 0) < 8 else "done",
              ["check", "done"])

    @wf.step(next=ratchet.END)
    async def done(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"rounds": ctx.state.get("rounds", 0)}}

    @wf.step(next=ratchet.END)
    async def give_up(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"output": {"gave_up": True}}

    wf.choice("entry", lambda s: "check", ["check", "give_up"])  # give_up: reachable
    # Start at entry: a graph's first declared node is its start.
    wf.nodes = {"entry": wf.nodes.pop("entry"), **wf.nodes}
    return wf


def of_type(events: list[ratchet.Event], kind: str) -> list[ratchet.Event]:
    return [e for e in events if e.type == kind]


def checks(events: list[ratchet.Event]) -> int:
    return sum(1 for e in events if e.type == "step.completed" and e.payload["step"] == "check")


async def test_a_step_that_spins_on_a_cycle_is_warned_once_then_fails_with_loop_detected(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(ratchet.Registry([polling("spin", progress=False)]))
    task_id = (await client.submit("spin", {}, key="spin")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["error"]["code"] == "LOOP_DETECTED"
    # The third identical (node, state seen, change) warns; the fourth is the loop, long
    # before max_visits (12) would have stopped it. ``decide`` sees the same state from
    # its first visit; ``check`` from its second (its first wrote ``status``).
    assert checks(events) == 4
    suspected = {e.payload["node"]: e.payload for e in of_type(events, "node.loop_suspected")}
    detected = of_type(events, "node.loop_detected")
    assert set(suspected) == {"check", "decide"}
    assert suspected["decide"]["times"] == 3 and suspected["decide"]["next"] == "check"
    assert suspected["check"]["changed"] is False  # it wrote the value already there
    assert len(detected) == 1 and detected[0].payload["node"] == "decide"
    assert detected[0].payload["to"] == "fail" and detected[0].payload["times"] == 4
    assert detected[0].payload["input_digest"] == suspected["decide"]["input_digest"]


async def test_a_cycle_that_changes_the_state_each_round_is_not_a_loop(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(ratchet.Registry([polling("progress", progress=True)]))
    task_id = (await client.submit("progress", {}, key="progress")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"rounds": 8}
    assert checks(events) == 8
    assert not of_type(events, "node.loop_suspected") and not of_type(events, "node.loop_detected")


async def test_a_loop_routed_by_the_workflow_goes_to_its_on_loop_node(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    loops = ratchet.NodeLoops(repeat=2, on_loop={"check": "give_up", "decide": "give_up"})
    await start_node(ratchet.Registry([polling("routed", progress=False, loops=loops)]))
    task_id = (await client.submit("routed", {}, key="routed")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"gave_up": True}
    # repeat=2: decide sees the same state each visit: warned at its second, routed at
    # its third.
    assert checks(events) == 3
    detected = of_type(events, "node.loop_detected")
    assert [(e.payload["node"], e.payload["to"]) for e in detected] == [("decide", "give_up")]


async def test_a_loop_node_whose_until_sees_nothing_change_is_a_loop(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    wf = ratchet.Workflow("until.spin")

    @wf.loop(until=lambda s: s["answer"] == "ready", max_iterations=50)
    async def ask(ctx: ratchet.StepContext) -> dict[str, Any]:
        return {"answer": "not yet"}

    await start_node(ratchet.Registry([wf]))
    task_id = (await client.submit("until.spin", {}, key="until")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["error"]["code"] == "LOOP_DETECTED"
    # The first iteration writes the answer; the next three repeat; the fifth is the loop.
    assert len([e for e in events if e.type == "step.completed"]) == 5


def test_loop_thresholds_and_routes_are_checked_at_registration() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"loops\.repeat must be"):
        polling("bad", progress=False, loops=ratchet.NodeLoops(repeat=1)).validate()
    with pytest.raises(WorkflowDefinitionError, match="names an unknown node"):
        polling("bad", progress=False,
                loops=ratchet.NodeLoops(on_loop={"check": "nowhere"})).validate()
    wf = polling("watched", progress=False)
    wf.validate()
    assert wf.looping_nodes == {"check", "decide"}  # entry, done, give_up: off every cycle
    off = polling("off", progress=False, loops=ratchet.NodeLoops(repeat=None))
    off.validate()
    assert off.looping_nodes == frozenset()


def test_the_state_digest_follows_what_each_checkpoint_writes() -> None:
    tracker = StateTracker()
    tracker.diff({"a": 1, "big": "x" * 5000})
    after_first = tracker.digest
    tracker.diff({"a": 1, "big": "x" * 5000})
    assert tracker.seen == after_first and tracker.digest == after_first  # nothing changed
    tracker.diff({"a": 2, "big": "x" * 5000})
    assert tracker.digest != after_first
    tracker.diff({"a": 1, "big": "x" * 5000})
    assert tracker.digest == after_first  # the same state, the same digest
    # A tracker rebuilt from a checkpoint agrees with the one that wrote it.
    rebuilt = StateTracker({"a": b"\x01"}, blobs={})
    rebuilt_big = StateTracker()
    rebuilt_big.diff({"a": 1})
    assert rebuilt.digest == rebuilt_big.digest
