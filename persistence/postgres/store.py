"""The Store on PostgreSQL: the same class; a task change and an acceptance each one call
of a server-side function (postgres/change_call.py, accept_call.py), its other writes
through :class:`PgWriter`'s writer thread, and its reads through a few autocommit
connections on the event loop (each read its own snapshot, as the SQLite store's reads
are), answered once what they saw is durable (postgres/syncer.py).

Isolation: READ COMMITTED, PostgreSQL's default, with the locks the SQL dialect adds
(persistence/postgres/dialect.py) — docs/operations.md, "PostgreSQL", says why no anomaly
of that level breaks an invariant.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from ratchet.persistence.audit_seal import AuditSeal
from ratchet.persistence.leases import LeaseClock, sync_lease_epoch_txn
from ratchet.persistence.pipelined import announce_when_durable
from ratchet.persistence.postgres.accept_call import AcceptCall
from ratchet.persistence.postgres.change_call import (
    ChangeCall,
    Fallback,
    TaskIdentities,
    fast_path,
)
from ratchet.persistence.postgres.connection import (
    RECONNECT_WINDOW_S,
    PgConnection,
    connect,
)
from ratchet.persistence.postgres.dialect import pg_migrations, translate
from ratchet.persistence.postgres.loop_conn import LoopConnection
from ratchet.persistence.postgres.prepared import Prepared
from ratchet.persistence.postgres.writer import PgWriter
from ratchet.persistence.records import Fence, fence_keys
from ratchet.persistence.store import Store
from ratchet.persistence.txns import AcceptResult, ChangeResult, NewTask, TaskChange
from ratchet.protocol.auth import redact_url
from ratchet.protocol.error_codes import ErrorCode
from ratchet.protocol.errors import StartRefused, StoreUnavailable

__all__ = ["PgLeaseClock", "PostgresStore", "migrate_pg", "pg_schema_version"]

#: pg_advisory_xact_lock key: two nodes opening one database migrate it once.
_MIGRATION_LOCK = 0x52415443  # "RATC"


def pg_schema_version(conn: PgConnection) -> int:
    conn.raw.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY,"
        " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
    row = conn.raw.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0) if row else 0


def migrate_pg(conn: PgConnection) -> int:
    """Apply every migration newer than the database's, in one transaction under an
    advisory lock; returns the resulting version.

    Raises:
        StartRefused: SCHEMA_VERSION_MISMATCH, the database was migrated by newer code.
    """
    migrations = pg_migrations()
    conn.raw.execute("BEGIN")
    try:
        conn.raw.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        current = pg_schema_version(conn)
        latest = migrations[-1][0]
        if current > latest:
            raise StartRefused(
                ErrorCode.SCHEMA_VERSION_MISMATCH,
                f"the store's schema is version {current}; this node knows up to {latest}"
                " (run the newer release, or a store of this one)",
                store=current, node=latest)
        for version, name, sql in migrations:
            if version <= current:
                continue
            # One script (no parameters: the simple protocol runs every statement): a
            # function's body holds semicolons.
            conn.raw.execute(sql)
            conn.raw.execute("INSERT INTO schema_migrations(version, name, applied_at)"
                             " VALUES (%s, %s, %s)", (version, name, time.time()))
            current = version
        conn.raw.execute("COMMIT")
    except BaseException:
        conn.raw.execute("ROLLBACK")
        raise
    return current


class PgLeaseClock:
    """The PostgreSQL server's clock (``clock_timestamp()``), the store's time for lease
    expiry: sampled at open, then inside a write batch's transaction at most once a
    second (one statement), and carried between samples by this host's monotonic clock,
    which no step moves. No node's wall
    clock decides whether another node's lease has run out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server = 0.0
        self._local = time.monotonic()

    def epoch(self) -> str:
        return "postgresql"  # the server's wall time: one epoch across its reboots

    #: Seconds between two samples of the server's clock: between them this host's
    #: monotonic clock drifts by parts per million, far below any lease's margin.
    RESAMPLE = 1.0

    def sample(self, conn: PgConnection, force: bool = True) -> None:
        """Read the server's clock (inside the caller's transaction); unless ``force``,
        only when the last reading is older than :attr:`RESAMPLE`."""
        if not force and time.monotonic() - self._local < self.RESAMPLE:
            return
        before = time.monotonic()
        row = conn.raw.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()
        after = time.monotonic()
        assert row is not None
        with self._lock:
            self._server, self._local = float(row[0]), (before + after) / 2

    def now(self) -> float:
        with self._lock:
            return self._server + (time.monotonic() - self._local)


class PostgresStore(Store):
    """A :class:`Store` whose database is PostgreSQL (``postgresql://…``). ``synchronous``,
    ``writer`` and ``wal_limit`` are SQLite's: accepted and ignored (a commit is durable
    once the syncer's flush covers it: postgres/syncer.py)."""

    #: Read connections: reads run side by side up to this many.
    READERS = 4

    def __init__(self, dsn: str, synchronous: str = "NORMAL", writer: str = "auto",
                 wal_limit: int = 0, fence: Fence | None = None,
                 lease_clock: LeaseClock | None = None,
                 audit_seal: AuditSeal | None = None) -> None:
        clock = lease_clock or PgLeaseClock()
        import os
        import sys  # EXPERIMENT
        if os.environ.get("RATCHET_SWITCH"):
            sys.setswitchinterval(float(os.environ["RATCHET_SWITCH"]))
        super().__init__(Path("/nonexistent"), "NORMAL", "thread", fence=fence,
                         lease_clock=clock, audit_seal=audit_seal)
        self.dsn = dsn
        self.path = redact_url(dsn) or dsn  # no password in logs
        sample = (partial(clock.sample, force=False)
                  if isinstance(clock, PgLeaseClock) else None)
        # NoWal stands for the WAL guard: what the Store reads of it, without a WAL file.
        self._pg_writer = PgWriter(dsn, on_batch=sample)
        self._writer = self._pg_writer  # type: ignore[assignment]
        self._syncing = self._pg_writer  # its commits are pipelined (postgres/syncer.py)
        self._identities = TaskIdentities()
        self._resyncs: list[Callable[[], None]] = []
        self._pg_writer.syncer.on_unsure = self._unsure
        self._readers: asyncio.Queue[LoopConnection] = asyncio.Queue()
        self._all_readers = [LoopConnection(dsn) for _ in range(self.READERS)]

    @classmethod
    async def open(cls, path: str | Path, synchronous: str = "NORMAL",
                   writer: str = "auto", wal_limit: int = 0, fence: Fence | None = None,
                   lease_clock: LeaseClock | None = None,
                   audit_seal: AuditSeal | None = None) -> PostgresStore:
        store = cls(str(path), synchronous, writer, wal_limit, fence, lease_clock, audit_seal)
        await store._open()
        return store

    async def _open(self) -> None:
        try:
            await self._connect()
        except psycopg.OperationalError as exc:
            await self.close()
            raise StartRefused(ErrorCode.STORE_UNREACHABLE,
                               f"cannot reach the store {self.path}: {exc}".strip(),
                               store=self.path) from None

    async def _connect(self) -> None:
        def _migrate() -> None:
            conn = PgConnection(connect(self.dsn))
            try:
                migrate_pg(conn)
                if isinstance(self.lease_clock, PgLeaseClock):
                    self.lease_clock.sample(conn)
                conn.raw.execute("BEGIN")
                try:
                    sync_lease_epoch_txn(conn, self.lease_clock.epoch())  # type: ignore[arg-type]
                    conn.raw.execute("COMMIT")
                except BaseException:
                    conn.raw.execute("ROLLBACK")
                    raise
                self._anchor_audit(conn)  # type: ignore[arg-type]
            finally:
                conn.close()

        await asyncio.to_thread(_migrate)
        await self._pg_writer.open()
        for reader in self._all_readers:
            await reader.open()
            self._readers.put_nowait(reader)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._heads.flush()
        for reader in self._all_readers:
            reader.close()
        await self._writer.close()

    async def apply(self, change: TaskChange) -> ChangeResult:
        """One call of ``ratchet_apply_change`` when it writes all ``change`` carries
        (postgres/change_call.py), else the SQLite store's transaction; raises as it does."""
        if not fast_path(change):
            return await super().apply(change)
        # Not held here: Fenced, as the transaction's wrapper says (Store._fenced).
        fence = self.fence.token_for(fence_keys(change.task_id)[0]) if self.fence is not None else None
        identity = self._identities.get(change.task_id) or await self._identity(change.task_id)
        if identity is None:  # no such task: the transaction says so
            return await super().apply(change)
        call = ChangeCall(change, fence, self.lease_clock.now, identity, self._count_fenced)
        fast = self._pg_writer.fast
        durable: asyncio.Future[None] | None = None
        try:
            if change.pipelined:  # the caller goes on at the commit; its events wait
                (result, _), durable = await fast.call_pipelined(call)
            else:
                result, _ = await fast.call(call)
        except Fallback:
            self._identities.forget(change.task_id)
            return await super().apply(change)
        assert isinstance(result, ChangeResult)
        return announce_when_durable(result, durable, self._announce)

    async def _identity(self, task_id: str) -> tuple[str, bool] | None:
        """The task's (tenant, is a sandbox), read once (neither ever changes)."""
        rows = await self._read("SELECT tenant, sandbox IS NOT NULL FROM tasks"
                                " WHERE task_id = ?", (task_id,))
        if not rows:
            return None
        self._identities.note(task_id, rows[0][0], bool(rows[0][1]))
        return rows[0][0], bool(rows[0][1])

    def add_outbox_resync(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the loop when commits may have happened that the syncer could
        not vouch for (the server went down meanwhile): their outbox rows, if they
        survived, were never announced — the relay reads the table back, in id order, so
        no task's events go out of order."""
        self._resyncs.append(callback)

    def _unsure(self) -> None:
        for callback in self._resyncs:
            callback()

    def _count_fenced(self) -> None:
        self.fenced_refused += 1  # a metric (persistence/metric_rows.py)

    async def accept_submission(self, task: NewTask) -> AcceptResult:
        """As the SQLite store's, in one call of ``ratchet_accept`` (postgres/accept_call.py)."""
        result: AcceptResult = await self._pg_writer.fast.call(AcceptCall(task))
        self._announce(result.outbox)
        if result.created:  # a new task is never a sandbox (a fork is made otherwise)
            self._identities.note(task.task_id, task.tenant, False)
        return result

    async def delete_outbox(self, ids: list[int]) -> None:
        await self._pg_writer.fast.call(_DeleteOutbox(ids))

    async def _rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        """Every row of one read, on a free read connection (autocommit: the read is its
        own snapshot, so it sees every commit made before it began), returned once what it
        saw is durable (postgres/syncer.py: a commit is visible before its WAL flush)."""
        for attempt in (1, 2):
            generation = self._pg_writer.syncer.generation
            rows = await self._read(sql, args)
            try:
                await self._pg_writer.synced(generation)
            except StoreUnavailable:
                # The server may have restarted since the read (what it saw may be lost):
                # a read is idempotent, so it runs again once, vouched for anew.
                if attempt == 2:
                    raise
                continue
            return rows
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _read(self, sql: str, args: tuple[Any, ...] | list[Any]) -> list[Any]:
        """Every row of one read on a free read connection (postgres/loop_conn.py)."""
        stmt = translate(sql)
        reader = await self._readers.get()
        try:
            for attempt in (1, 2):
                try:
                    if reader.lost:  # a server restart, a partition
                        await self._reopen(reader)
                    return await reader.fetch(stmt.sql, tuple(args))
                except psycopg.OperationalError as exc:
                    # A connection the server dropped is only found out by using it: a
                    # read is idempotent, so it runs once more on a new connection (within
                    # the reconnect window) before its caller sees the store unavailable.
                    if attempt == 1 and reader.lost:
                        continue
                    raise StoreUnavailable(f"the store cannot read: {exc}",
                                           postgres_error=str(exc)) from exc
            raise AssertionError("unreachable: the second attempt returns or raises")
        finally:
            self._readers.put_nowait(reader)

    @staticmethod
    async def _reopen(reader: LoopConnection) -> None:
        """Connect ``reader`` again, trying for the reconnect window (a server restarting
        is back within it); raises if it is not."""
        deadline = time.monotonic() + RECONNECT_WINDOW_S
        delay = 0.05
        while True:
            try:
                await reader.open()
                return
            except psycopg.OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)  # a server restarting: back within the window
                delay = min(0.5, delay * 2)


class _DeleteOutbox:
    """Published outbox rows deleted: one statement (postgres/fast_lanes.py runs it)."""

    statement = Prepared("ratchet_delete_outbox",
                         "DELETE FROM outbox WHERE id = ANY($1::int8[])", ("int8[]",))
    task_id = None

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def args(self) -> tuple[Any, ...]:
        return (self.ids,)

    def result(self, row: list[Any]) -> int:
        return len(self.ids)

    def refusal(self, exc: Exception) -> Exception:
        return exc
