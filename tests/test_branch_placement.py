"""Three real nodes, a 600-branch map of ten-step branches placed over all of them: a pause
and a cancel of the task reach the branches running on the other nodes (``branch.hold``,
``branch.stop`` mail), not only those on the task's own node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from ratchet.protocol.ids import new_id
from tests.branch_apps import STEPS
from tests.conftest import NodeProcess
from tests.test_branch_failover import BRANCHES, NAMES, _ran_on, _three_nodes
from tests.test_nodes import _all_succeeded, _count, _until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real node processes


def _is(tmp_path: Path, task_id: str, status: str) -> bool:
    return _count(tmp_path, "SELECT COUNT(*) FROM tasks WHERE task_id = ? AND status = ?",
                  task_id, status) == 1


def _lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def _settled(log: Path, what: str) -> int:
    """Until the step log stops growing (the same length at 10 polls in a row, 2 s),
    bounded; its length then."""
    seen: list[int] = []

    def still() -> bool:
        seen.append(_lines(log))
        return len(seen) >= 10 and len(set(seen[-10:])) == 1

    await _until(still, 60, what)
    return seen[-1]


async def _mid_way(nats_url: str, client: ratchet.Client,
                   node_process: Callable[..., NodeProcess], tmp_path: Path, step_log: Path,
                   key: str) -> str:
    """Three nodes up, and a map of ``key`` running mid-way with branches on each."""
    await _three_nodes(nats_url, node_process, tmp_path, step_log)
    task_id = (await client.submit("steps.map", {"n": BRANCHES, "sleep": 0.02},
                                   key=key)).task_id
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'branch.step_completed'") >= 800, 120,
                 "branches to be mid-way")
    spread = _ran_on(tmp_path, "branch.step_completed")
    assert all(spread[name] > 0 for name in NAMES), spread
    return task_id


async def test_a_pause_holds_the_branches_on_every_node_and_the_resume_runs_each_step_once(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    task_id = await _mid_way(nats_url, client, node_process, tmp_path, step_log, "held")
    await client.request_admin("pause", {"command_id": new_id("cmd"), "task_id": task_id})
    await _until(lambda: _is(tmp_path, task_id, "PAUSED"), 30, "the task to pause")
    held = await _settled(step_log, "every node's branches to stop at a safe point")
    assert held < BRANCHES * STEPS - 500  # far from the end: none ran on regardless

    await client.request_admin("resume", {"command_id": new_id("cmd"), "task_id": task_id})
    await _until(_all_succeeded(tmp_path, 1), 120, "the map to finish after the resume")
    runs = Counter(tuple(line.split()[1:3]) for line in step_log.read_text().splitlines())
    assert len(runs) == BRANCHES * STEPS and set(runs.values()) == {1}  # none ran twice


async def test_a_cancel_stops_the_branches_on_every_node(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    task_id = await _mid_way(nats_url, client, node_process, tmp_path, step_log, "cancelled")
    await client.request_admin("cancel", {"command_id": new_id("cmd"), "task_id": task_id,
                                          "args": {"reason": "enough"}})
    await _until(lambda: _is(tmp_path, task_id, "CANCELLED"), 30, "the task to be cancelled")
    stopped = await _settled(step_log, "every node's branches to stop")
    assert stopped < BRANCHES * STEPS - 500
    assert _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type = 'join.completed'") == 0
