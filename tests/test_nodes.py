"""Many nodes, real processes: three ``ratchet serve`` processes share one NATS and one SQLite
file. One is SIGKILLed, one frozen with SIGSTOP past its lease, one drained; the invariants
are checked on the store afterwards: no task lost, committed steps never run again (only a
step in flight at a kill may), event sequences contiguous, recoveries recorded and named.

Leases here last 3 s (renewed every 0.5 s) so that failover takes seconds, not the
default's ~6 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

import ratchet
from ratchet.persistence.leases import HostLeaseClock
from ratchet.protocol.ids import new_id
from tests.conftest import NodeProcess

pytestmark = pytest.mark.slow  # real node processes, killed

LEASE = ("--lease-ttl", "3", "--lease-interval", "0.5")


def _db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{tmp_path / 'node' / 'ratchet.db'}?mode=ro", uri=True,
                           timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _count(tmp_path: Path, sql: str, *args: Any) -> int:
    conn = _db(tmp_path)
    try:
        return int(conn.execute(sql, args).fetchone()[0])
    finally:
        conn.close()


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll the store (another process's truth) until ``predicate`` holds, bounded."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(predicate):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.2)


def _all_succeeded(tmp_path: Path, n: int) -> Callable[[], bool]:
    return lambda: _count(tmp_path, "SELECT COUNT(*) FROM tasks WHERE status = 'SUCCEEDED'") == n


def _leases(tmp_path: Path) -> dict[int, tuple[str | None, int]]:
    conn = _db(tmp_path)
    try:
        return {p: (o, t) for p, o, t in conn.execute(  # lease times: the host's boot time
            "SELECT partition, owner, token FROM leases WHERE expires_at > ?",
            (HostLeaseClock().now(),))}
    finally:
        conn.close()


def _recoveries(tmp_path: Path) -> list[dict[str, Any]]:
    conn = _db(tmp_path)
    try:
        return [dict(msgpack.unpackb(p, raw=False), task_id=t) for t, p in conn.execute(
            "SELECT task_id, payload FROM events WHERE type = 'task.recovered'")]
    finally:
        conn.close()


def _check_store_invariants(tmp_path: Path, tasks: int) -> None:
    conn = _db(tmp_path)
    try:
        statuses = dict(conn.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status"))
        assert statuses == {"SUCCEEDED": tasks}, statuses  # none lost, none failed
        gaps = conn.execute(
            "SELECT COUNT(*) FROM (SELECT task_id, COUNT(*) n, MIN(sequence) lo,"
            " MAX(sequence) hi FROM events GROUP BY task_id) WHERE lo != 1 OR hi != n"
        ).fetchone()[0]
        assert gaps == 0, "event sequences must be contiguous from 1"
        last = dict(conn.execute(
            "SELECT e.type, COUNT(*) FROM events e JOIN tasks t ON t.task_id = e.task_id"
            " AND e.sequence = t.last_event_seq GROUP BY e.type"))
        assert last == {"task.succeeded": tasks}, last  # a terminal state is never left
    finally:
        conn.close()


def _step_runs(step_log: Path) -> Counter[tuple[str, str]]:
    return Counter(tuple(line.split()) for line in step_log.read_text().splitlines())  # type: ignore[misc]


async def _start(node_process: Callable[..., NodeProcess], nats_url: str, step_log: Path,
                 names: list[str], *extra: str) -> dict[str, NodeProcess]:
    nodes = {}
    for name in names:
        node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log)},
                            args=(*LEASE, "--node-id", name, *extra),
                            log_level=os.environ.get("RATCHET_TEST_NODE_LOG", "warning"))
        await asyncio.to_thread(node.start)
        nodes[name] = node
    return nodes


async def _balanced(tmp_path: Path, names: list[str]) -> None:
    def ok() -> bool:
        owners = Counter(o for o, _ in _leases(tmp_path).values())
        return sorted(owners) == sorted(names) and sum(owners.values()) == 16

    await _until(ok, 30, f"16 partitions shared by {names}")


async def test_three_nodes_500_tasks_one_sigkilled_all_finish_on_the_others(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    nodes = await _start(node_process, nats_url, step_log, ["n1", "n2", "n3"])
    await _balanced(tmp_path, ["n1", "n2", "n3"])
    n_tasks = 500
    for i in range(n_tasks):
        await client.submit("ten", {"sleep": 0.02}, key=f"k{i}")
    # Kill n2 while it runs tasks: some of its steps are committed, some in flight.
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'step.completed'") >= 1000, 60, "tasks to be mid-flight")
    n2_partitions = {p: t for p, (o, t) in _leases(tmp_path).items() if o == "n2"}
    import time
    print("T kill", time.time(), flush=True)
    await asyncio.to_thread(nodes["n2"].kill)

    # n2's partitions go to the survivors, with newer fencing tokens.
    await _until(lambda: all(_leases(tmp_path).get(p, (None, 0))[0] in ("n1", "n3")
                             for p in n2_partitions), 30, "n2's partitions to be reaped")
    assert all(_leases(tmp_path)[p][1] > t for p, t in n2_partitions.items())
    print("T reaped", time.time(), flush=True)
    await _until(_all_succeeded(tmp_path, n_tasks), 120, "every task to succeed")
    _check_store_invariants(tmp_path, n_tasks)

    # Recoveries are recorded and say from which checkpoint and which steps were skipped.
    failovers = [r for r in _recoveries(tmp_path) if r["reason"] == "node_failover"]
    assert failovers and all(r["previous_owner"] == "n2" and r["node"] in ("n1", "n3")
                             for r in failovers)
    assert all("from_checkpoint" in r and isinstance(r["steps_skipped"], list)
               for r in failovers)

    # Committed steps never ran again: only the step in flight at the kill (one per task at
    # most, and only on tasks n2 was running) may have run twice.
    runs = _step_runs(step_log)
    assert max(runs.values()) <= 2
    twice = Counter(task for (task, _), n in runs.items() if n == 2)
    assert all(n == 1 for n in twice.values()), twice
    others = {r["task_id"]: r for r in _recoveries(tmp_path)}
    assert set(twice) <= {r["task_id"] for r in failovers}, [
        (t, others.get(t)) for t in set(twice) - {r["task_id"] for r in failovers}][:3]
    import time
    print("T before interrupt", time.time(), flush=True)
    for name in ("n1", "n3"):
        assert nodes[name].interrupt() == 0
        print("T stopped", name, time.time(), flush=True)


def _freeze_outside_a_write(pid: int, tmp_path: Path) -> None:
    """SIGSTOP the node (a GC pause, a stalled VM) at a moment it holds no SQLite write lock.

    A process frozen inside a write transaction holds the database's lock, and no node can
    write — nor take its lease — until it resumes: SQLite's locks are per file, not per
    lease (docs/operations.md). Fencing still holds then (a takeover is itself a write), but
    the case this test is about is the zombie that wakes after others took over."""
    db = tmp_path / "node" / "ratchet.db"
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        conn = sqlite3.connect(db, timeout=0.5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)  # caught mid-commit: let it finish, try again
        finally:
            conn.close()
    raise AssertionError("could not freeze the node outside a write")


async def test_a_node_frozen_past_its_lease_is_fenced_and_rejoins(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    nodes = await _start(node_process, nats_url, step_log, ["n1", "n2", "n3"])
    await _balanced(tmp_path, ["n1", "n2", "n3"])
    n_tasks = 90
    for i in range(n_tasks):
        await client.submit("twenty", {"sleep": 0.05}, key=f"z{i}")
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'step.completed'") >= 200, 60, "tasks to be mid-flight")
    frozen = nodes["n3"]
    assert frozen.proc is not None
    n3_partitions = {p: t for p, (o, t) in _leases(tmp_path).items() if o == "n3"}
    assert n3_partitions
    await asyncio.to_thread(_freeze_outside_a_write, frozen.proc.pid, tmp_path)
    try:
        # The others reap n3's expired leases, each with a newer token.
        await _until(lambda: all(_leases(tmp_path).get(p, (None, 0))[0] in ("n1", "n2")
                                 for p in n3_partitions), 30, "n3's partitions to be reaped")
        taken = _leases(tmp_path)
        assert all(taken[p][1] > token for p, token in n3_partitions.items())
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)

    # Awake, n3 still believed it held those partitions: every write it then tried was
    # refused (counted in its heartbeat), it isolated them, and it rejoins with a share.
    def rejoined() -> bool:
        conn = _db(tmp_path)
        try:
            info = conn.execute("SELECT info FROM nodes WHERE node_id = 'n3'").fetchone()[0]
        finally:
            conn.close()
        held = msgpack.unpackb(info, raw=False)
        return bool(held["partitions"]) and held["fenced_writes"] > 0

    await _until(rejoined, 30, "n3 to rejoin after counting fenced writes")
    await _until(_all_succeeded(tmp_path, n_tasks), 120, "every task to succeed")
    _check_store_invariants(tmp_path, n_tasks)
    runs = _step_runs(step_log)
    assert max(runs.values()) <= 2  # at most the step in flight when n3 froze ran again
    assert frozen.proc.poll() is None, "the woken node kept running"
    for node in nodes.values():
        assert node.interrupt() == 0


async def test_drain_hands_partitions_over_at_safe_points_with_no_task_lost(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    step_log = tmp_path / "steps.log"
    nodes = await _start(node_process, nats_url, step_log, ["n1", "n2"])
    await _balanced(tmp_path, ["n1", "n2"])
    n_tasks = 60
    for i in range(n_tasks):
        await client.submit("twenty", {"sleep": 0.05}, key=f"d{i}")
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'step.completed'") >= 100, 60, "tasks to be mid-flight")
    admin = ratchet.Client(client.nc, "_system", client.signer)  # the local admin key
    answer = await admin.request_admin("drain", {"command_id": new_id("cmd"),
                                                 "args": {"node": "n1"}})
    assert answer["status"] == "draining"
    await _until(lambda: all(o == "n2" for o, _ in _leases(tmp_path).values())
                 and len(_leases(tmp_path)) == 16, 60, "n2 to own every partition")
    listed = await admin.request_admin("nodes", {"command_id": new_id("cmd")})
    by_id = {n["node_id"]: n for n in listed["nodes"]}
    assert by_id["n1"]["status"] == "draining" and by_id["n1"]["partitions"] == []
    assert len(by_id["n2"]["partitions"]) == 16
    await _until(_all_succeeded(tmp_path, n_tasks), 120, "every task to succeed")
    _check_store_invariants(tmp_path, n_tasks)
    # Handed over at safe points (between steps): no step ran twice.
    runs = _step_runs(step_log)
    assert max(runs.values()) == 1, [k for k, n in runs.items() if n > 1]
    handovers = [r for r in _recoveries(tmp_path) if r["reason"] == "partition_handover"]
    assert handovers and all(r["previous_owner"] == "n1" for r in handovers)
    for node in nodes.values():
        assert node.interrupt() == 0


async def test_a_flooding_tenant_does_not_starve_a_small_one(
        nats_url: str, node_process: Callable[..., NodeProcess], tmp_path: Path) -> None:
    """Tenant A floods 2,000 tasks at a node that runs 8 at a time; tenant B's 10 tasks,
    submitted behind the whole flood, each finish within 5 s (the bound), long before A's
    flood does: B is granted the next free slots (weighted fair admission), it does not
    wait behind A's queue."""
    step_log = tmp_path / "steps.log"
    await _start(node_process, nats_url, step_log, ["n1"], "--max-running", "8")
    flood = await ratchet.Client.connect(nats_url, tenant="a")
    small = await ratchet.Client.connect(nats_url, tenant="b")
    try:
        for i in range(2000):
            await flood.submit("three", {"sleep": 0.01}, key=f"a{i}")
        await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM tasks WHERE tenant = 'a'")
                     == 2000, 60, "the flood to be accepted")

        async def one(i: int) -> float:
            started = asyncio.get_running_loop().time()
            task_id = (await small.submit("three", {"sleep": 0.01}, key=f"b{i}")).task_id
            async for event in small.watch(task_id):
                assert event.type != "task.failed"
            return asyncio.get_running_loop().time() - started

        latencies = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(10))), 60)
        a_unfinished = _count(tmp_path, "SELECT COUNT(*) FROM tasks WHERE tenant = 'a'"
                              " AND status != 'SUCCEEDED'")
        assert max(latencies) < 5.0, latencies
        assert a_unfinished > 500, "the flood should still be running: no contention shown"
    finally:
        await flood.close()
        await small.close()


async def test_a_second_node_on_a_state_dir_joins_its_embedded_server(tmp_path: Path) -> None:
    from tests.apps import app

    first = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "s", node_id="e1"), app)
    await first.start()
    try:
        second = ratchet.Node(ratchet.NodeConfig(state_dir=tmp_path / "s", node_id="e2"), app)
        await second.start()
        try:
            assert second.url == first.url and second.embedded is None
            assert first.leases is not None and second.leases is not None
            leases = (first.leases, second.leases)

            async def balanced() -> None:
                while sorted(len(m.held) for m in leases) != [8, 8]:
                    for m in leases:
                        await m.tick()
                    await asyncio.sleep(0.05)  # let the background hand-over run

            await asyncio.wait_for(balanced(), 20)
        finally:
            await second.stop()
    finally:
        await first.stop()


def _libfaketime() -> str | None:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    return str(found[0]) if found else None


@pytest.mark.skipif(_libfaketime() is None,
                    reason="libfaketime is not installed (Debian: apt-get install libfaketime;"
                           " .ci/run installs it)")
async def test_nodes_whose_wall_clocks_disagree_by_two_hours_reap_a_dead_one_in_seconds(
        nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
        tmp_path: Path) -> None:
    """n1's wall clock is an hour ahead, n2's an hour behind (libfaketime). Leases expire
    on the store's time, not on either wall clock: they share the partitions, and when n1
    is SIGKILLed n2 takes its partitions within the TTL and an interval, and every task
    finishes. (Judged on wall clocks, n2 would wait two hours.) (n1 fakes every clock call, monotonic ones too; n2 the wall clock only, as
    an NTP step does.)"""
    step_log = tmp_path / "steps.log"
    preload = _libfaketime()
    assert preload is not None
    nodes = {}
    for name, fake in (("n1", {"FAKETIME": "+1h"}),
                       ("n2", {"FAKETIME": "-1h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})):
        nodes[name] = node = node_process(
            nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log), "LD_PRELOAD": preload, **fake},
            args=(*LEASE, "--node-id", name),
            log_level=os.environ.get("RATCHET_TEST_NODE_LOG", "warning"))
        await asyncio.to_thread(node.start)
    n_tasks = 20
    for i in range(n_tasks):
        await client.submit("ten", {"sleep": 0.2}, key=f"c{i}")
    await _until(lambda: _count(tmp_path, "SELECT COUNT(*) FROM events WHERE type ="
                                " 'step.completed'") >= 30, 60, "tasks to be mid-flight")
    n1_partitions = {p: t for p, (o, t) in _leases(tmp_path).items() if o == "n1"}
    assert n1_partitions
    await asyncio.to_thread(nodes["n1"].kill)
    # ttl (3 s) + interval (0.5 s), and a margin for a loaded machine: not an hour.
    await _until(lambda: all(_leases(tmp_path).get(p, (None, 0))[0] == "n2"
                             for p in n1_partitions), 8, "n1's partitions to be reaped")
    await _until(_all_succeeded(tmp_path, n_tasks), 60, "every task to succeed")
    _check_store_invariants(tmp_path, n_tasks)
    assert nodes["n2"].interrupt() == 0
