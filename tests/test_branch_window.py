"""Three real nodes, one fan-out placed over all of them: its ``max_concurrency`` holds for
the cluster, not per node (actors/task/branch_window.py), and its branches call the task's
tool session on whichever node runs them (actors/task/branch_sessions.py). The branch
bodies count themselves in a file shared by the node processes (tests/branch_apps.py
``live``), so the bound is checked by a count, not by timing. The tasks are followed with
``Client.watch``: their events, published by three relays, come in sequence order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from tests.branch_apps import NARROW
from tests.conftest import NodeProcess, assert_contiguous
from tests.test_branch_failover import NAMES
from tests.test_nodes import LEASE, _balanced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real node processes

ITEMS = 60


async def _three_nodes(nats_url: str, node_process: Callable[..., NodeProcess],
                       tmp_path: Path) -> None:
    for name in NAMES:
        node = node_process(nats_url, {"RATCHET_TEST_LIVE": str(tmp_path / "live")},
                            app_spec="tests.branch_apps:app", args=(*LEASE, "--node-id", name))
        await asyncio.to_thread(node.start)
    await _balanced(tmp_path, NAMES)


async def _followed(client: ratchet.Client, workflow: str, n: int) -> list[ratchet.Event]:
    """The task's events as ``watch`` yields them, to its success, in sequence order."""
    task_id = (await client.submit(workflow, {"n": n, "sleep": 0.05}, key=workflow)).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    assert_contiguous(events)
    return events


async def test_a_fanout_over_three_nodes_never_runs_more_than_max_concurrency_bodies_at_once(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    counter = tmp_path / "live"
    await _three_nodes(nats_url, node_process, tmp_path)
    events = await _followed(client, "steps.narrow", ITEMS)
    done = [e for e in events if e.type == "branch.completed"]
    assert len(done) == ITEMS
    where = {e.payload.get("ran_on") for e in done}
    assert len(where) >= 2, f"the branches ran on {where} only: nothing to bound"
    now, peak = map(int, counter.read_text().split())
    assert now == 0
    assert 2 <= peak <= NARROW, peak  # the window was used, and held across the nodes


async def test_branches_on_every_node_call_the_tasks_tool_session_and_none_of_their_changes_is_lost(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    await _three_nodes(nats_url, node_process, tmp_path)
    events = await _followed(client, "steps.stamped", ITEMS)
    where = {e.payload.get("ran_on") for e in events if e.type == "branch.completed"}
    assert len(where) >= 2, f"the branches ran on {where} only"
    # The task's own node reads the session after the map: every branch's mark is there,
    # made by the session of the node each ran on.
    output = next(e for e in events if e.type == "task.succeeded").payload["output"]
    assert output["stamped"] == ITEMS
    assert output["pids"] == len(where)
