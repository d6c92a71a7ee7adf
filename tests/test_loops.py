"""Loop nodes: a step run once per iteration, one commit per iteration, resumed after a
crash at the iteration after the last committed one; validated at registration and drawn
by ``ratchet graph``."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet.protocol.errors import WorkflowDefinitionError
from tests.conftest import (
    RATCHET_BIN,
    ROOT,
    NodeFactory,
    NodeProcess,
    assert_contiguous,
    wait_terminal,
)
from tests.dynflow_apps import app


async def body(ctx: ratchet.StepContext) -> dict[str, Any]:
    return {}


def iterations(events: list[ratchet.Event], node: str) -> list[ratchet.Event]:
    return [e for e in events if e.type == "step.completed" and e.payload["step"] == node]


# -- definitions ----------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "message"), [
    ({"max_iterations": 0}, "max_iterations must be an int >= 1, got 0"),
    ({"max_iterations": True}, "max_iterations must be an int >= 1, got True"),
    ({"max_iterations": 3, "on_exhausted": "elsewhere"}, "on_exhausted needs an until"),
])
def test_a_loop_without_a_sound_bound_is_refused_at_registration(
    options: dict[str, Any], message: str
) -> None:
    wf = ratchet.Workflow("bad")
    wf.add_loop("spin", body, **options)
    wf.add_step("elsewhere", body)
    with pytest.raises(WorkflowDefinitionError, match=message):
        wf.validate()


def test_a_loop_body_must_be_async_and_its_exhausted_target_must_exist() -> None:
    wf = ratchet.Workflow("bad")

    def sync_body(ctx: ratchet.StepContext) -> None:
        return None

    with pytest.raises(WorkflowDefinitionError, match="loop 'spin' must run an async function"):
        wf.add_loop("spin", sync_body, max_iterations=3)  # type: ignore[arg-type]
    wf.add_loop("spin", body, until=lambda s: True, max_iterations=3, on_exhausted="ghost")
    with pytest.raises(WorkflowDefinitionError, match="unknown target 'ghost'"):
        wf.validate()


def test_a_loop_needs_no_max_visits_for_its_own_edge_and_refuses_one() -> None:
    wf = ratchet.Workflow("fine")
    wf.add_loop("spin", body, max_iterations=3)
    wf.validate()  # its edge back to itself is bounded by max_iterations
    bounded = ratchet.Workflow("bad")
    bounded._add(dataclasses.replace(wf.nodes["spin"], max_visits=2))
    with pytest.raises(WorkflowDefinitionError, match="bounded by max_iterations"):
        bounded.validate()


def test_the_transition_table_and_mermaid_show_the_loop_and_its_exits() -> None:
    flows = {name: app.get(name) for name in ("loop.counted", "loop.escalating")}
    assert flows["loop.counted"].transition_table()[:2] == [
        ("tick", "loop", "next iteration (200 in all)", "tick"),
        ("tick", "loop", "200 iterations done", "report")]
    assert flows["loop.escalating"].transition_table()[:3] == [
        ("again", "loop", "until false (at most 3 iterations)", "again"),
        ("again", "loop", "until true", "won"),
        ("again", "loop", "3 iterations without until", "give_up")]
    mermaid = flows["loop.counted"].mermaid()
    assert "n0[tick · loop]" in mermaid
    assert 'n0 -->|"next iteration (200 in all)"| n0' in mermaid
    assert flows["loop.counted"].step_count == 201  # the iterations count as steps


def test_ratchet_graph_prints_the_loop_as_a_table_and_a_mermaid_self_edge() -> None:
    out = subprocess.run([str(RATCHET_BIN), "graph", "loop.until", "--app",
                          "tests.dynflow_apps:app"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "add    loop  until false (at most 500 iterations)  add" in out
    assert "add    loop  until true                            total" in out
    assert 'n0 -->|"until false (at most 500 iterations)"| n0' in out


# -- running ---------------------------------------------------------------------------------

async def test_a_200_iteration_loop_commits_once_per_iteration(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    node = await start_node(app)
    task_id = (await client.submit("loop.counted", {}, key="counted")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.succeeded"
    assert events[-1].payload["output"] == {"ticks": 200, "last": 199}
    ticks = iterations(events, "tick")
    assert [e.payload["iteration"] for e in ticks] == list(range(200))
    # One commit per iteration: each iteration's event has a version of its own, one more
    # than the previous iteration's; nothing else was committed between them.
    first = ticks[0].aggregate_version
    assert [e.aggregate_version for e in ticks] == list(range(first, first + 200))
    assert [e.payload["next"] for e in ticks] == ["tick"] * 199 + ["report"]
    record = await node.store.load_task(task_id)  # type: ignore[union-attr]
    # accept, dispatch, 200 iterations, the report step, success: 204 commits in all
    assert record.version == 204 and record.last_checkpoint == 201
    assert record.visits == {}  # the loop's count is cleared when the task leaves it
    assert_contiguous(events)


async def test_a_loop_runs_until_its_predicate_holds(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.until", {"goal": 5}, key="until")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"total": 5}
    assert [e.payload["iteration"] for e in iterations(events, "add")] == [0, 1, 2, 3, 4]


async def test_a_loop_whose_until_never_holds_fails_after_max_iterations(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.stubborn", {}, key="stubborn")).task_id
    events = await wait_terminal(client, task_id)
    assert len(iterations(events, "never")) == 3
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "loop bound exceeded"
    assert events[-1].payload["error"]["message"] == (
        "loop never ran 3 iterations and until never held")


async def test_an_exhausted_loop_goes_to_its_on_exhausted_node(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.escalating", {}, key="escalating")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"gave_up_after": 3}
    assert iterations(events, "again")[-1].payload["next"] == "give_up"


async def test_a_loop_entered_again_counts_its_iterations_from_zero(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.reentered", {}, key="reentered")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"seen": [0, 1, 0, 1, 0, 1]}


async def test_an_iteration_that_crashes_its_actor_runs_again_as_the_same_iteration(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.flaky", {}, key="flaky")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].payload["output"] == {"seen": [[0, 1], [1, 1], [2, 2], [3, 1]]}
    failed = next(e for e in events if e.type == "step.failed")
    assert failed.payload["step"] == "wobble" and failed.payload["attempt"] == 1
    recovered = next(e for e in events if e.type == "task.recovered")
    assert recovered.payload["reason"] == "actor_restart"


async def test_an_until_that_raises_fails_the_task_once(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node(app)
    task_id = (await client.submit("loop.unsure", {}, key="unsure")).task_id
    events = await wait_terminal(client, task_id)
    assert events[-1].type == "task.failed"
    assert events[-1].payload["reason"] == "until of guess raised"
    assert "step.completed" not in [e.type for e in events]  # the iteration was not committed


@pytest.mark.slow  # a real node process, killed
async def test_a_loop_interrupted_by_sigkill_resumes_at_the_iteration_after_the_last_commit(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    log = tmp_path / "iterations.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(log)},
                        app_spec="tests.dynflow_apps:app")
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("loop.until", {"goal": 30, "sleep": 0.05}, key="until-kill")).task_id
    committed: list[int] = []
    async for event in client.watch(task_id):
        if event.type == "step.completed":
            committed.append(event.payload["iteration"])
            if len(committed) >= 10:
                break
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert_contiguous(events)
    assert events[-1].payload["output"] == {"total": 30}
    runs = Counter(int(line.split(":")[1]) for line in log.read_text().splitlines())
    assert sorted(runs) == list(range(30))  # none lost
    assert all(runs[i] == 1 for i in committed), runs  # none committed ran again
    assert sum(runs.values()) - 30 <= 1  # at most the one in flight ran twice
    done = [e.payload["iteration"] for e in iterations(events, "add")]
    assert done == list(range(30))  # each iteration committed once, in order
    recovered = next(e for e in events if e.type == "task.recovered")
    assert recovered.payload["next_node"] == "add"
