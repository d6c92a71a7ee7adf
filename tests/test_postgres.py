"""The store on PostgreSQL (persistence/postgres/): the SQL dialect, migrations, what only
several writers on one server can show (real lock contention between two stores), the
ledger's "inserting the key is the check", and `ratchet serve --store` refusing a store it
cannot run on. The contract shared with SQLite runs on both backends in test_store.py and
test_leases.py; a real PostgreSQL 16 comes from the ``pgserver`` wheel (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import ratchet
from ratchet.persistence.ledger import ActionWrite
from ratchet.persistence.postgres import PostgresStore
from ratchet.persistence.postgres.dialect import pg_migrations, translate, translate_ddl
from ratchet.persistence.schema import MIGRATIONS
from ratchet.persistence.store_select import open_store
from ratchet.persistence.txns import NewTask, TaskChange
from ratchet.protocol.errors import ActionKeyTaken, ErrorCode, StartRefused, VersionConflict
from tests.conftest import RATCHET_BIN, ROOT, NodeProcess, assert_contiguous, wait_terminal


def _new_task(task_id: str = "t1", key: str = "k1") -> NewTask:
    return NewTask(task_id=task_id, tenant="acme", workflow="w", workflow_version=1,
                   idempotency_key=key, request_hash="h", input=b"\x80", steps_total=3,
                   deadline_at=None, now=1.0, producer="test", message_id="m",
                   start_mail=("ratchet.mail.0.t1.task", f"start-{task_id}", b"\x80"))


# -- the dialect (no server) ----------------------------------------------------------------


def test_placeholders_and_blob_literals_are_translated_outside_quoted_text() -> None:
    stmt = translate("SELECT '?%', x'' FROM t WHERE a = ? AND b LIKE 'x%'")
    assert stmt.sql == "SELECT '?%%', '\\x'::bytea FROM t WHERE a = %s AND b LIKE 'x%%'"


def test_insert_or_replace_becomes_an_upsert_on_the_tables_primary_key() -> None:
    stmt = translate("INSERT OR REPLACE INTO tool_sessions(task_id, session, state, updated_at)"
                     " VALUES (?,?,?,?)")
    assert stmt.sql.endswith("ON CONFLICT (task_id, session) DO UPDATE SET"
                             " state = EXCLUDED.state, updated_at = EXCLUDED.updated_at")
    assert not stmt.strict_insert


def test_a_plain_insert_refuses_a_taken_key_and_a_rowid_table_returns_its_id() -> None:
    stmt = translate("INSERT INTO outbox(subject, msg_id) VALUES (?,?)")
    assert stmt.strict_insert and stmt.returns_id
    assert stmt.sql.endswith("ON CONFLICT DO NOTHING RETURNING id")
    ignored = translate("INSERT OR IGNORE INTO inbox(message_id) VALUES (?)")
    assert ignored.sql.endswith("ON CONFLICT DO NOTHING") and not ignored.strict_insert


def test_only_writes_lock_the_task_or_lease_row_they_read() -> None:
    sql = "SELECT status, version FROM tasks WHERE task_id = ?"
    assert translate(sql, writing=True).sql.endswith("FOR UPDATE")
    assert not translate(sql).sql.endswith("FOR UPDATE")
    assert translate("SELECT owner FROM leases WHERE partition = ?", True).sql.endswith(
        "FOR UPDATE")
    assert "FOR UPDATE" not in translate("SELECT COUNT(*) FROM leases", True).sql


def test_the_schema_is_the_same_ordered_migrations_in_postgresql_types() -> None:
    assert [(v, n) for v, n, _ in pg_migrations()] == [(v, n) for v, n, _ in MIGRATIONS]
    ddl = translate_ddl("CREATE TABLE x (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER,"
                        " blob TEXT, data BLOB, at REAL) WITHOUT ROWID")
    assert ddl == ("CREATE TABLE x (id BIGSERIAL PRIMARY KEY, n BIGINT,"
                   " blob TEXT, data BYTEA, at DOUBLE PRECISION)")


# -- one server ---------------------------------------------------------------------------


async def test_migrations_run_once_even_when_two_stores_open_one_database_at_once(
        pg_url: str) -> None:
    a, b = await asyncio.gather(open_store(pg_url), open_store(pg_url))
    try:
        rows = await a._rows("SELECT version FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == [v for v, _, _ in MIGRATIONS]
    finally:
        await a.close()
        await b.close()


async def test_a_store_migrated_by_a_newer_release_is_refused(pg_url: str) -> None:
    store = await open_store(pg_url)
    await store.run_txn(lambda c: c.execute(
        "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, 'future', 0)",
        (MIGRATIONS[-1][0] + 1,)))
    await store.close()
    with pytest.raises(StartRefused) as refused:
        await open_store(pg_url)
    assert refused.value.code == ErrorCode.SCHEMA_VERSION_MISMATCH
    assert f"version {MIGRATIONS[-1][0] + 1}" in str(refused.value)


async def test_an_unreachable_server_is_a_refused_start_without_the_password() -> None:
    with pytest.raises(StartRefused) as refused:
        await open_store("postgresql://bob:hunter2@/nowhere?host=/nonexistent-dir")
    assert refused.value.code == ErrorCode.STORE_UNREACHABLE
    assert "hunter2" not in str(refused.value) and "bob:***@" in str(refused.value)


async def test_two_nodes_racing_on_one_task_never_both_commit_a_version(pg_url: str) -> None:
    """Real contention (two writer connections): each version is taken by exactly one
    change, and the event sequence stays contiguous (the task row is locked, not just
    compared)."""
    a, b = await open_store(pg_url), await open_store(pg_url)
    try:
        await a.accept_submission(_new_task())

        async def advance(store: PostgresStore | object, n: int) -> int:
            won = 0
            for _ in range(n):
                rec = await a.load_task("t1")
                change = TaskChange(task_id="t1", expected_version=rec.version,
                                    producer="p", now=2.0, events=[("x", {}), ("y", {})])
                try:
                    await store.apply(change)  # type: ignore[attr-defined]
                    won += 1
                except VersionConflict:
                    pass
            return won

        won = sum(await asyncio.gather(advance(a, 40), advance(b, 40)))
        rec = await a.load_task("t1")
        assert rec.version == 1 + won
        sequences = [e["sequence"] for e in await a.events("t1")]
        assert sequences == list(range(1, 2 + 2 * won))
    finally:
        await a.close()
        await b.close()


async def test_a_taken_action_key_is_refused_and_its_neighbours_still_commit(
        pg_url: str) -> None:
    store = await open_store(pg_url)
    try:
        for i in range(3):
            await store.accept_submission(_new_task(f"t{i}", f"k{i}"))

        def charge(task: str, key: str) -> TaskChange:
            return TaskChange(task_id=task, expected_version=None, producer="p", now=2.0,
                              action=ActionWrite(key=key, status="PENDING", insert=True,
                                                 tool="pay", kind="write",
                                                 request_hash="h", args=b"\x80"))

        await store.apply(charge("t0", "pay-1"))
        results = await asyncio.gather(store.apply(charge("t1", "pay-1")),
                                       store.apply(charge("t2", "pay-2")),
                                       return_exceptions=True)
        assert isinstance(results[0], ActionKeyTaken)
        assert not isinstance(results[1], Exception)
        assert (await store.get_action("acme", "pay-1")).task_id == "t0"  # type: ignore[union-attr]
        assert (await store.get_action("acme", "pay-2")).task_id == "t2"  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_concurrent_changes_share_one_transaction(pg_url: str) -> None:
    store = await open_store(pg_url)
    try:
        await asyncio.gather(*(store.accept_submission(_new_task(f"t{i}", f"k{i}"))
                               for i in range(200)))
        assert store.writer_stats.transactions >= 200
        assert store.writer_stats.batches < 200 and store.writer_stats.largest_batch > 1
    finally:
        await store.close()


@pytest.mark.slow
async def test_reads_go_on_after_a_postgresql_restart_without_an_error() -> None:
    """Every pooled read connection is dropped by the restart and only found out when used:
    each read runs once more on a new connection instead of failing its caller (a tool
    session crashing past its restart limit waited for the 30 s recovery sweep)."""
    from ratchet.testing.pg import PgServer

    with PgServer() as pg:
        store = await open_store(pg.database("restarts"))
        try:
            await store.accept_submission(_new_task())
            assert (await store.load_task("t1")).task_id == "t1"
            await asyncio.to_thread(pg.restart, "immediate")
            reads = await asyncio.gather(*(store.load_task("t1") for _ in range(8)))
            assert [r.task_id for r in reads] == ["t1"] * 8
        finally:
            await store.close()


def test_sums_read_back_as_numbers_not_decimals(pg_url: str) -> None:
    from ratchet.persistence.postgres.connection import PgConnection, connect

    conn = PgConnection(connect(pg_url))
    try:
        row = conn.execute("SELECT SUM(x), SUM(y), ? FROM (VALUES (1, 0.5), (2, 0.25)) v(x, y)",
                           (True,)).fetchone()
        assert row == (3, 0.75, 1) and type(row[0]) is int
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("CREATE TABLE k (a TEXT PRIMARY KEY)")
            conn.execute("INSERT INTO k(a) VALUES (?)", ("x",))
            conn.execute("INSERT INTO k(a) VALUES (?)", ("x",))
    finally:
        conn.close()


# -- ratchet serve --store ------------------------------------------------------------------


def _serve(state: Path, *flags: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [str(RATCHET_BIN), "--state-dir", str(state), "--log-level", "warning", "serve",
         "--app", "tests.apps:app", *flags], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, **(env or {})})


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, stderr
    return lines[-1]


def test_serve_refuses_a_postgresql_store_of_another_partition_count(
        pg_url: str, tmp_path: Path) -> None:
    async def make() -> None:
        store = await open_store(pg_url)
        await store.ensure_partitions(16)
        await store.close()

    asyncio.run(make())
    started = time.monotonic()
    done = _serve(tmp_path / "s", "--partitions", "8", env={"RATCHET_STORE": pg_url})
    assert done.returncode == 11, done.stderr
    assert "the store has 16 partitions" in _last_line(done.stderr)
    assert "PARTITION_COUNT_MISMATCH" in _last_line(done.stderr)
    assert time.monotonic() - started < 30


def test_serve_refuses_a_schema_newer_than_its_own(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY,"
                     " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
        conn.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', 0)")
    done = _serve(tmp_path / "s", "--store", pg_url)
    assert done.returncode == 16, done.stderr
    assert "schema is version 999" in _last_line(done.stderr)
    assert "SCHEMA_VERSION_MISMATCH" in _last_line(done.stderr)


def test_serve_refuses_a_store_that_is_not_a_postgresql_url(tmp_path: Path) -> None:
    done = _serve(tmp_path / "s", env={"RATCHET_STORE": "mysql://x"})
    assert done.returncode == 2
    assert "RATCHET_STORE takes a postgresql:// URL" in done.stderr


# -- a real node on PostgreSQL ----------------------------------------------------------------


@pytest.mark.slow
async def test_a_node_on_postgresql_runs_a_task_to_success_across_a_sigkill(
    nats_url: str, client: ratchet.Client, node_process: Callable[..., NodeProcess],
    pg_url: str, tmp_path: Path,
) -> None:
    """`ratchet serve` with RATCHET_STORE: a ten-step task, the node SIGKILLed after step 4
    and started again; the task resumes from its checkpoint on the database and succeeds,
    its events contiguous, each committed step run once."""
    step_log = tmp_path / "steps.log"
    node = node_process(nats_url, {"RATCHET_TEST_STEP_LOG": str(step_log),
                                   "RATCHET_STORE": pg_url})
    await asyncio.to_thread(node.start)
    task_id = (await client.submit("ten", {"sleep": 0.05}, key="pg-crash")).task_id
    async for event in client.watch(task_id):
        if event.type == "step.completed" and event.payload["index"] == 4:
            break
    await asyncio.to_thread(node.kill)

    await asyncio.to_thread(node.start)
    events = await wait_terminal(client, task_id, timeout=60)
    assert events[-1].type == "task.succeeded"
    assert_contiguous(events)
    runs = Counter(line.split()[1] for line in step_log.read_text().splitlines())
    assert all(runs[f"s{i}"] == 1 for i in range(5)), runs  # committed before the kill
    assert sum(runs[f"s{i}"] == 2 for i in range(5, 10)) <= 1, runs
    with psycopg.connect(pg_url) as conn:  # the task's truth is in PostgreSQL
        row = conn.execute("SELECT status, last_event_seq FROM tasks WHERE task_id = %s",
                           (task_id,)).fetchone()
    assert row == ("SUCCEEDED", len(events))
    assert not (tmp_path / "node" / "ratchet.db").exists()  # and no SQLite file was made
    assert node.interrupt() == 0


async def test_an_opened_postgresql_store_is_each_port(pg_url: str) -> None:
    from tests.test_store_ports import PORTS

    store = await open_store(pg_url)
    try:
        assert isinstance(store, PostgresStore)
        for port in PORTS:
            assert isinstance(store, port), port.__name__
        assert await store.active_tasks() == [] and await store.pending_outbox() == []
        assert await store.switches() == [] and await store.leases() == []
        assert store.path.startswith("postgresql://") and store.wal_stats.wal_bytes == 0
    finally:
        await store.close()


async def test_two_nodes_accepting_one_key_at_once_make_one_task(pg_url: str) -> None:
    a, b = await open_store(pg_url), await open_store(pg_url)
    try:
        for i in range(20):
            first, second = await asyncio.gather(
                a.accept_submission(_new_task(f"x{i}", f"key-{i}")),
                b.accept_submission(_new_task(f"x{i}", f"key-{i}")))
            assert first.task_id == second.task_id == f"x{i}"
            assert [first.created, second.created].count(True) == 1
        assert await a.count("tasks") == 20 and await a.count("requests") == 20
    finally:
        await a.close()
        await b.close()
