"""Three real nodes on one NATS and one store: SIGKILL the node running a 600-branch map of
ten-step branches; a survivor takes the task's partition over and every unfinished branch
goes on from its last committed step there. The join settles once, and no committed branch
step runs again — at most the one each branch had in flight.

(The branches run on the task's node: placing them by partition is not built yet,
docs/architecture.md, "Fan-out branches: where they run".)
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import ratchet
from ratchet.protocol.subjects import partition_of
from tests.branch_apps import STEPS
from tests.conftest import NodeProcess
from tests.test_nodes import (
    LEASE,
    _all_succeeded,
    _balanced,
    _check_store_invariants,
    _count,
    _leases,
    _recoveries,
    _until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real node processes, killed

BRANCHES = 600


async def test_branches_of_a_killed_node_resume_on_a_survivor_from_their_last_step(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    names = ["n1", "n2", "n3"]
    nodes = {}
    for name in names:
        nodes[name] = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log)},
                                   app_spec="tests.branch_apps:app",
                                   args=(*LEASE, "--node-id", name))
        await asyncio.to_thread(nodes[name].start)
    await _balanced(tmp_path, names)
    task_id = (await client.submit("steps.map", {"n": BRANCHES, "sleep": 0.01},
                                   key="wide")).task_id
    owner = _leases(tmp_path)[partition_of(task_id)][0]
    assert owner in names
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'branch.step_completed'") >= 1500, 120,
                 "branches to be mid-way")
    killed_pid = nodes[owner].proc.pid  # type: ignore[union-attr]
    await asyncio.to_thread(nodes[owner].kill)
    await _until(_all_succeeded(tmp_path, 1), 180, "the map to finish on a survivor")
    _check_store_invariants(tmp_path, 1)

    assert _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type = 'join.completed'") == 1
    assert _count(tmp_path, "SELECT COUNT(*) FROM branches WHERE status = 'SUCCEEDED'") \
        == BRANCHES
    failovers = [r for r in _recoveries(tmp_path) if r["reason"] == "node_failover"]
    assert failovers and all(r["previous_owner"] == owner for r in failovers)

    runs: Counter[tuple[str, int]] = Counter()
    where: dict[tuple[str, int], set[int]] = {}
    for line in step_log.read_text().splitlines():
        _, branch, step, pid = line.split()
        runs[(branch, int(step))] += 1
        where.setdefault((branch, int(step)), set()).add(int(pid))
    assert len(runs) == BRANCHES * STEPS
    assert max(runs.values()) <= 2, runs.most_common(3)
    twice = Counter(branch for (branch, _), n in runs.items() if n == 2)
    assert all(n == 1 for n in twice.values()), twice  # only the step in flight, per branch
    # The kill came mid-way: some steps ran on the dead node, the rest on a survivor.
    survivors = {p for steps in where.values() for p in steps} - {killed_pid}
    assert survivors and any(killed_pid in pids for pids in where.values())
    checkpoints = _count(tmp_path, "SELECT COUNT(*) FROM (SELECT DISTINCT task_id, payload"
                         " FROM events WHERE type = 'branch.step_completed')")
    assert checkpoints == _count(tmp_path, "SELECT COUNT(*) FROM events"
                                 " WHERE type = 'branch.step_completed'")  # none twice
    for name in names:
        if name != owner:
            assert nodes[name].interrupt() == 0
