"""SIGKILL a node in the middle of a 50-branch fan-out: after a restart the finished
branches are not run again and the join completes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from tests.conftest import NodeProcess, assert_contiguous, wait_terminal

pytestmark = pytest.mark.slow  # real node processes, killed


async def test_a_fanout_interrupted_by_sigkill_resumes_without_rerunning_finished_branches(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    tmp_path: Path,
) -> None:
    log = tmp_path / "branches.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(log)},
                        app_spec="tests.graph_apps:app")
    await asyncio.to_thread(node.start)
    # Branches that finish together are settled together: the last 20 take longer, so the
    # kill certainly comes with some branches settled and some still running.
    slow = {f"b{i:02d}": 1.0 for i in range(30, 50)}
    task_id = (await client.submit("fan.50", {"sleep": 0.05, "slow": slow}, key="fan50")).task_id
    finished_before: set[str] = set()
    async for event in client.watch(task_id):
        if event.type == "branch.completed":
            finished_before.add(event.payload["branch"])
            if len(finished_before) >= 15:
                break
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert_contiguous(events)
    assert events[-1].type == "task.succeeded"
    assert len(events[-1].payload["output"]["joined"]) == 50
    runs = Counter(line.split()[1] for line in log.read_text().splitlines())
    assert all(runs[f"branch:{b}"] == 1 for b in finished_before), runs
    assert len(runs) == 50 and max(runs.values()) <= 2
    completed = [e.payload["branch"] for e in events if e.type == "branch.completed"]
    assert sorted(completed) == sorted(set(completed))  # each branch recorded once
    recovered = [e for e in events if e.type == "task.recovered"]
    assert recovered and recovered[0].payload["next_node"] == "spread"
