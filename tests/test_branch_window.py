"""Three real nodes, one fan-out placed over all of them: its ``max_concurrency`` holds for
the cluster, not per node (actors/task/branch_window.py). The branch bodies count
themselves in a file shared by the node processes (tests/branch_apps.py ``live``), so the
bound is checked by a count, not by timing. The task is followed with ``Client.watch``:
its events, published by three relays, come in sequence order."""

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


async def test_a_fanout_over_three_nodes_never_runs_more_than_max_concurrency_bodies_at_once(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    counter = tmp_path / "live"
    for name in NAMES:
        node = node_process(nats_url, {"RATCHET_TEST_LIVE": str(counter)},
                            app_spec="tests.branch_apps:app", args=(*LEASE, "--node-id", name))
        await asyncio.to_thread(node.start)
    await _balanced(tmp_path, NAMES)
    task_id = (await client.submit("steps.narrow", {"n": ITEMS, "sleep": 0.05},
                                   key="narrow")).task_id
    events = [e async for e in client.watch(task_id, idle_timeout=120)]
    assert events[-1].type == "task.succeeded", events[-1]
    assert_contiguous(events)
    done = [e for e in events if e.type == "branch.completed"]
    assert len(done) == ITEMS
    where = {e.payload.get("ran_on") for e in done}
    assert len(where) >= 2, f"the branches ran on {where} only: nothing to bound"
    now, peak = map(int, counter.read_text().split())
    assert now == 0
    assert 2 <= peak <= NARROW, peak  # the window was used, and held across the nodes
