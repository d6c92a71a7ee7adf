"""Progress heartbeats: computed by the runtime from committed work, at a bounded rate."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

import ratchet
from ratchet.actors.task.progress import ProgressMeter, percent, progress_payload
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal

# -- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize(("completed", "total", "expected"), [
    (0, 10, 0), (1, 3, 33), (2, 3, 66), (9, 10, 90), (99, 100, 99),
    (10, 10, 99), (25, 10, 99),  # not finished: never 100, even past the step count (loops)
    (5, None, 0), (5, 0, 0),  # total unknown
])
def test_percent_is_the_floor_of_completed_work_capped_below_100_until_finished(
    completed: int, total: int | None, expected: int
) -> None:
    assert percent(completed, total) == expected


def test_percent_is_100_only_once_finished() -> None:
    assert percent(3, 10, finished=True) == 100
    assert percent(0, None, finished=True) == 100


def test_the_payload_names_the_node_the_counts_the_checkpoint_and_the_owner() -> None:
    payload = progress_payload(node="s4", steps_completed=4, steps_total=8, last_checkpoint=4,
                               owner="node-a")
    assert payload == {"node": "s4", "steps_completed": 4, "steps_total": 8, "percent": 50,
                       "last_checkpoint": 4, "owner": "node-a"}
    assert "actions" not in payload  # omitted when not known cheaply
    assert progress_payload(node="x", steps_completed=1, steps_total=None, last_checkpoint=1,
                            owner="n", actions=2)["actions"] == 2


def test_a_meter_is_due_at_once_when_fresh_then_once_per_interval() -> None:
    meter = ProgressMeter(5.0)
    assert meter.due(100.0)
    meter.mark(100.0)
    assert not meter.due(104.9)
    assert meter.due(105.0)
    meter.mark(105.0)
    assert not meter.due(106.0)


def test_a_zero_interval_makes_every_boundary_due() -> None:
    meter = ProgressMeter(0.0, last=7.0)
    assert meter.due(7.0)


def test_task_deps_refuse_a_negative_progress_interval() -> None:
    from ratchet.actors.task.actor import TaskDeps

    with pytest.raises(ValueError, match="progress_interval"):
        TaskDeps(None, None, None, "n", progress_interval=-1)  # type: ignore[arg-type]


# -- on a real node --------------------------------------------------------------------------

STEPS = 12
STEP_SECONDS = 2.0  # of the fake clock: a heartbeat (every 5 s) lands every third step


def _slow_workflow(clock: ratchet.FakeClock) -> ratchet.Workflow:
    wf = ratchet.Workflow("slow", version=1)
    for i in range(STEPS):
        async def step(ctx: ratchet.StepContext, i: int = i) -> dict[str, Any]:
            clock.advance(STEP_SECONDS)  # the step "takes" two seconds
            return {f"s{i}": i}

        wf.add_step(f"s{i}", step)
    return wf


async def test_progress_events_come_at_most_once_per_interval_with_rising_percentages(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    clock = ratchet.FakeClock()
    await start_node(ratchet.Registry([_slow_workflow(clock)]), clock=clock,
                            node_id="node-p")
    task_id = (await client.submit("slow", {}, key="progress")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert_contiguous(events)

    beats = [e for e in events if e.type == "task.progress"]
    assert [b.payload["steps_completed"] for b in beats] == [3, 6, 9, 12]
    assert [b.payload["percent"] for b in beats] == [25, 50, 75, 99]  # 100 is for finished
    gaps = [later.occurred_at - earlier.occurred_at for earlier, later in pairwise(beats)]
    assert all(gap >= 5.0 for gap in gaps), gaps  # the default progress_interval
    for beat in beats:
        assert beat.payload["steps_total"] == STEPS and beat.payload["owner"] == "node-p"
        assert beat.payload["last_checkpoint"] == beat.payload["steps_completed"]
        # In the step boundary's own transaction: the step.completed just before it shares
        # its aggregate version.
        before = events[beat.sequence - 2]
        assert before.type == "step.completed"
        assert before.aggregate_version == beat.aggregate_version
        assert beat.payload["node"] == before.payload["next"]
