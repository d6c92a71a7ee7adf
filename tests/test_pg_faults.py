"""Nodes on separate (simulated) machines sharing a PostgreSQL store: what SQLite's one
file lock made impossible. Each node has its own state dir and log; they share only the
database and one nats-server. Real processes, real PostgreSQL (pgserver), no mocks.

- A node SIGSTOPped *while it holds row locks* in PostgreSQL (mid-transaction: its lease
  rows locked by its fence checks and renewals): the server ends its session after
  ``idle_in_transaction_session_timeout`` (persistence/postgres/connection.py), the other
  node takes its partitions and finishes every task while it is still frozen, and on
  SIGCONT nothing it writes commits under a lease it lost.
- A node cut from PostgreSQL by a network partition (a TCP proxy between them, cut): it
  stops work when its lease runs out, commits nothing while cut or after its lease was
  taken, and rejoins when the path comes back.

Whether a node held the lease when it committed is judged by the database itself: the
commit log of tests/pg_nodes.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

import ratchet
from bench.steps import NodeProc
from ratchet.testing.tcp_proxy import TcpProxy
from tests.pg_nodes import (
    commits_outside_lease,
    events_by_task,
    machine,
    owners,
    prepare,
    rows,
    start_machines,
    until,
)

APP = "tests.apps:app"
LEASE = ("--lease-ttl", "3", "--lease-interval", "0.5", "--recovery-interval", "1")


async def _submit(client: ratchet.Client, prefix: str, n: int) -> list[str]:
    handles = await asyncio.gather(*(client.submit_sync("ten", {"sleep": 0.02}, f"{prefix}-{i}")
                                     for i in range(n)))
    return [h.task_id for h in handles]


async def _all_succeed(url: str, task_ids: list[str], timeout: float) -> None:
    """Read from the database, not through the API: a request may reach a frozen node
    (its NATS subscription outlives its answers) and wait out its timeout."""
    def done() -> bool:
        return rows(url, "SELECT COUNT(*) FROM tasks WHERE task_id = ANY(%s)"
                    " AND status = 'SUCCEEDED'", (task_ids,))[0][0] == len(task_ids)

    await until(done, timeout, f"{len(task_ids)} tasks SUCCEEDED", poll=0.25)


def _contiguous(url: str, task_ids: list[str]) -> None:
    for task_id, events in events_by_task(url, task_ids).items():
        assert [s for s, _, _ in events] == list(range(1, len(events) + 1)), task_id
        assert events[-1][1] == "task.succeeded", task_id


def _held_by(url: str, node: str) -> set[int]:
    return {p for p, (o, _) in owners(url).items() if o == node}


def _holds_row_locks(url: str, node: str) -> bool:
    """The node's session is inside a transaction that has locked rows of ``leases``."""
    return bool(rows(url, """
        SELECT 1 FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
        WHERE a.application_name = %s AND a.xact_start IS NOT NULL
          AND a.backend_xid IS NOT NULL AND l.relation = 'leases'::regclass
          AND l.mode IN ('RowShareLock', 'RowExclusiveLock')""", (node,)))


def _stop(*nodes: NodeProc) -> None:
    for node in nodes:
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGCONT)
            node.stop()


@pytest.mark.slow
async def test_a_node_frozen_holding_row_locks_is_failed_over_and_its_writes_fenced(
        pg_url: str, nats_url: str, tmp_path: Path) -> None:
    await prepare(pg_url)
    # A task change is one statement (persistence/postgres/change_call.py): it holds no lock
    # between the node's round trips. The lease manager's transactions do (a renewal reads
    # and updates the lease rows statement by statement): a's renews 10 times a second, so
    # that a freeze at a random moment often lands inside one.
    a = machine(tmp_path, "a", pg_url, nats_url, APP,
                args=(*LEASE, "--lease-interval", "0.1"))
    b = machine(tmp_path, "b", pg_url, nats_url, APP, args=LEASE)
    await start_machines([a, b])
    client = await ratchet.Client.connect(nats_url, "acme", creds=a.creds)
    try:
        await until(lambda: _held_by(pg_url, "a") and _held_by(pg_url, "b"), 30,
                    "both nodes hold partitions")
        task_ids = await _submit(client, "frozen", 40)
        assert a.proc is not None
        frozen = False
        for _ in range(400):  # SIGSTOP at random moments until one lands mid-transaction
            os.kill(a.proc.pid, signal.SIGSTOP)
            if await asyncio.to_thread(_holds_row_locks, pg_url, "a"):
                frozen = True
                break
            os.kill(a.proc.pid, signal.SIGCONT)
            await asyncio.sleep(random.uniform(0.005, 0.03))  # a random moment, not a wait
        assert frozen, "never caught node a inside a transaction holding lease row locks"
        partitions = _held_by(pg_url, "a")
        assert partitions
        # While a stays frozen: b takes every partition of a's and finishes every task.
        await until(lambda: not _held_by(pg_url, "a") and len(_held_by(pg_url, "b")) == 16,
                    30, "b holds every partition")
        await _all_succeed(pg_url, task_ids, timeout=120)
        # The server ended the frozen session (its transaction rolled back, its locks freed).
        assert not await asyncio.to_thread(_holds_row_locks, pg_url, "a")
        os.kill(a.proc.pid, signal.SIGCONT)
        # a learns it lost its leases (its writes are refused meanwhile), then rejoins.
        await until(lambda: _held_by(pg_url, "a"), 60, "a holds partitions again")
        later = await _submit(client, "after", 10)
        await _all_succeed(pg_url, later, timeout=60)
    finally:
        await client.close()
        await asyncio.to_thread(_stop, a, b)
    logs = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    # Which way a learns it depends on what the freeze caught: a renewal fails and a's
    # leases expire unrenewed, or a later renewal finds them taken.
    assert "leases lost" in logs or "leases expired without renewal" in logs
    assert "tampered" not in logs
    assert commits_outside_lease(pg_url) == []
    _contiguous(pg_url, task_ids + later)


def _socket_of(url: str) -> tuple[str, str]:
    """(the server's Unix socket path, the database name) of a pgserver URL."""
    parsed = urlparse(url)
    host = parse_qs(parsed.query)["host"][0]
    return f"{host}/.s.PGSQL.{parsed.port or 5432}", parsed.path.lstrip("/")


@pytest.mark.slow
async def test_a_node_cut_from_postgresql_stops_at_its_lease_end_and_rejoins(
        pg_url: str, nats_url: str, tmp_path: Path) -> None:
    await prepare(pg_url)
    socket_path, database = _socket_of(pg_url)
    proxy = TcpProxy(socket_path)
    host, port = proxy.start()
    a = machine(tmp_path, "a", f"postgresql://postgres@{host}:{port}/{database}", nats_url,
                APP, args=LEASE)
    b = machine(tmp_path, "b", pg_url, nats_url, APP, args=LEASE)
    await start_machines([a, b])
    client = await ratchet.Client.connect(nats_url, "acme", creds=b.creds)
    try:
        await until(lambda: _held_by(pg_url, "a") and _held_by(pg_url, "b"), 30,
                    "both nodes hold partitions")
        task_ids = await _submit(client, "cut", 40)
        await until(lambda: rows(pg_url, "SELECT 1 FROM commit_log WHERE app = 'a'"
                                 " AND type = 'step.completed'"), 30, "a runs steps")
        cut_at = rows(pg_url, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
        assert proxy.cut() > 0  # a's connections reset; new ones refused
        await until(lambda: not _held_by(pg_url, "a") and len(_held_by(pg_url, "b")) == 16,
                    30, "b holds every partition")
        await _all_succeed(pg_url, task_ids, timeout=120)
        log = tmp_path / "a.log"
        await until(lambda: "leases expired without renewal" in log.read_text(), 30,
                    "a isolates its partitions when its leases run out")
        restored_at = rows(pg_url, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
        proxy.restore()
        await until(lambda: _held_by(pg_url, "a"), 60, "a holds partitions again")
        later = await _submit(client, "healed", 20)
        await _all_succeed(pg_url, later, timeout=60)
    finally:
        await client.close()
        await asyncio.to_thread(_stop, a, b)
        proxy.close()
    assert a.proc is not None and a.proc.returncode == 0  # it rode the partition out
    assert rows(pg_url, "SELECT COUNT(*) FROM commit_log WHERE app = 'a' AND at > %s"
                " AND at < %s", (cut_at + 0.5, restored_at))[0][0] == 0
    assert rows(pg_url, "SELECT COUNT(*) FROM commit_log WHERE app = 'a' AND at > %s",
                (restored_at,))[0][0] > 0  # rejoined: it commits again
    assert commits_outside_lease(pg_url) == []
    _contiguous(pg_url, task_ids + later)
