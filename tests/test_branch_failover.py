"""Three real nodes on one NATS and one store, and a 600-branch map of ten-step branches.
Each branch runs on the owner of the partition its id hashes to, so the map's branches are
spread over all three nodes. SIGKILL a node mid-way — the task's own, or another — and the
survivors take its partitions over: its branches go on from their last committed step there
(and the task's, if it was the task's node). The join settles once, and no committed branch
step runs again — at most the one each branch had in flight.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgpack
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
    _db,
    _leases,
    _recoveries,
    _until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real node processes, killed

BRANCHES = 600
NAMES = ["n1", "n2", "n3"]


async def _three_nodes(nats_url: str, node_process: Callable[..., NodeProcess],
                       tmp_path: Path, step_log: Path) -> dict[str, NodeProcess]:
    nodes = {}
    for name in NAMES:
        nodes[name] = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log)},
                                   app_spec="tests.branch_apps:app",
                                   args=(*LEASE, "--node-id", name))
        await asyncio.to_thread(nodes[name].start)
    await _balanced(tmp_path, NAMES)
    return nodes


def _ran_on(tmp_path: Path, event_type: str) -> Counter[str]:
    """Events of ``event_type`` per node that ran the branch (``ran_on``)."""
    conn = _db(tmp_path)
    try:
        return Counter(msgpack.unpackb(p).get("ran_on") for (p,) in conn.execute(
            "SELECT payload FROM events WHERE type = ?", (event_type,)))
    finally:
        conn.close()


async def _kill_mid_way(tmp_path: Path, nodes: dict[str, NodeProcess], victim: str) -> int:
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'branch.step_completed'") >= 1500, 120,
                 "branches to be mid-way")
    # Every node has run some of the map's branches: they are placed by partition.
    spread = _ran_on(tmp_path, "branch.step_completed")
    assert all(spread[name] > 0 for name in NAMES), spread
    pid = nodes[victim].proc.pid  # type: ignore[union-attr]
    await asyncio.to_thread(nodes[victim].kill)
    await _until(_all_succeeded(tmp_path, 1), 180, "the map to finish on the survivors")
    return pid


def _check_steps(tmp_path: Path, step_log: Path, killed_pid: int) -> None:
    """The join settled once; each step ran once but the one a branch had in flight when
    its node died; the dead node's branches went on on a survivor."""
    _check_store_invariants(tmp_path, 1)
    assert _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type = 'join.completed'") == 1
    assert _count(tmp_path, "SELECT COUNT(*) FROM branches WHERE status = 'SUCCEEDED'") \
        == BRANCHES
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
    # Some branches began on the dead node and finished on a survivor.
    by_branch: dict[str, set[int]] = {}
    for (branch, _), pids in where.items():
        by_branch.setdefault(branch, set()).update(pids)
    moved = [b for b, pids in by_branch.items() if killed_pid in pids and len(pids) > 1]
    assert moved
    checkpoints = _count(tmp_path, "SELECT COUNT(*) FROM (SELECT DISTINCT task_id, payload"
                         " FROM events WHERE type = 'branch.step_completed')")
    assert checkpoints == _count(tmp_path, "SELECT COUNT(*) FROM events"
                                 " WHERE type = 'branch.step_completed'")  # none twice


async def _wide_map(nats_url: str, client: ratchet.Client,
                    node_process: Callable[..., NodeProcess], tmp_path: Path,
                    step_log: Path) -> tuple[dict[str, NodeProcess], str]:
    """Three nodes up and a ``BRANCHES``-wide map submitted; the nodes, and which one
    holds the task's partition."""
    nodes = await _three_nodes(nats_url, node_process, tmp_path, step_log)
    task_id = (await client.submit("steps.map", {"n": BRANCHES, "sleep": 0.01},
                                   key="wide")).task_id
    owner = _leases(tmp_path)[partition_of(task_id)][0]
    assert owner in NAMES
    return nodes, owner


async def test_branches_of_a_killed_node_resume_on_a_survivor_from_their_last_step(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    nodes, owner = await _wide_map(nats_url, client, node_process, tmp_path, step_log)
    killed_pid = await _kill_mid_way(tmp_path, nodes, owner)  # the task's own node
    _check_steps(tmp_path, step_log, killed_pid)
    failovers = [r for r in _recoveries(tmp_path) if r["reason"] == "node_failover"]
    assert failovers and all(r["previous_owner"] == owner for r in failovers)
    for name in NAMES:
        if name != owner:
            assert nodes[name].interrupt() == 0


async def test_a_killed_nodes_branches_resume_on_the_survivors_while_the_task_stays(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    nodes, owner = await _wide_map(nats_url, client, node_process, tmp_path, step_log)
    victim = next(n for n in NAMES if n != owner)  # not the task's node: only branches move
    killed_pid = await _kill_mid_way(tmp_path, nodes, victim)
    _check_steps(tmp_path, step_log, killed_pid)
    # The task never moved: the survivors took the dead node's branch partitions over.
    assert not [r for r in _recoveries(tmp_path) if r["reason"] == "node_failover"]
    done = _ran_on(tmp_path, "branch.completed")
    assert sum(done.values()) == BRANCHES and set(done) <= set(NAMES), done
    for name in NAMES:
        if name != victim:
            assert nodes[name].interrupt() == 0
