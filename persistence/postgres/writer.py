"""The PostgreSQL store's writer: the same group-commit contract as persistence/writer.py.

Callers submit a ``*_txn`` function and await its result. A thread owns one psycopg
connection; it drains whatever has queued (urgent items first: lease renewals), runs each
function inside its own SAVEPOINT when it has neighbours (one failing compare-and-set
does not undo them) and commits the batch once: one WAL flush for many state changes.

Why a thread and psycopg's sync connection (bench/pg_driver.py): a commit waits on the
server's WAL flush; the thread releases the GIL meanwhile, the txn functions stay the
synchronous ones SQLite runs, and a state change costs its statements' round trips on a
Unix socket (~35 µs each), not an event-loop hop each.

Errors: a connection lost, or the server refusing work (shutdown, disk full), reaches the
callers as :class:`StoreUnavailable` (retryable) and the next batch reconnects; a deadlock
or serialization failure between nodes fails only the transaction that met it, also as
retryable.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import structlog

from ratchet.persistence.group_commit import BatchQueue, hand_back
from ratchet.persistence.postgres.connection import (
    RECONNECT_WINDOW_S,
    PgConnection,
    connect,
)
from ratchet.persistence.wal import WalStats
from ratchet.persistence.writer import WriterStats
from ratchet.protocol.errors import StoreUnavailable

__all__ = ["NoWal", "PgWriter"]

T = TypeVar("T")
Txn = Callable[[Any], Any]
log = structlog.get_logger("ratchet.store.writer")



class NoWal:
    """What the Store reads of SQLite's WAL guard, for a store without a WAL file: never
    lost, reads never held, figures all zero."""

    def __init__(self) -> None:
        self.lost: str | None = None
        self.on_lost: list[Callable[[str], None]] = []
        self.reads_open = threading.Event()
        self.reads_open.set()
        self.stats = WalStats()


def _retryable(exc: Exception) -> Exception:
    if isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure
                  | psycopg.OperationalError):
        error = StoreUnavailable(f"the store cannot write: {exc}", postgres_error=str(exc))
        error.__cause__ = exc
        return error
    return exc


class PgWriter:
    """Group commit on a dedicated thread, against PostgreSQL."""

    def __init__(self, dsn: str, max_batch: int = 256,
                 on_batch: Callable[[PgConnection], None] | None = None) -> None:
        self._dsn = dsn
        self._on_batch = on_batch  # run first in each batch's transaction (the lease clock)
        self._queue = BatchQueue(max_batch)
        self._thread = threading.Thread(target=self._run, name="ratchet-pg-writer", daemon=True)
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._conn: PgConnection | None = None
        self.wal = NoWal()
        self.stats = WriterStats()
        self.rescued: str | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise self._open_error

    def submit(self, fn: Callable[[Any], T], urgent: bool = False) -> asyncio.Future[T]:
        return self._queue.submit(fn, urgent)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.stop()
            self._thread.join()

    async def close(self) -> None:
        await asyncio.to_thread(self.stop)

    def _run(self) -> None:
        try:
            self._conn = PgConnection(connect(self._dsn))
        except BaseException as exc:  # reported to start()'s caller
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (batch := self._queue.next_batch()) is not None:
                if not batch:
                    continue
                started = time.perf_counter()
                outcomes = self._execute([fn for fn, _, _ in batch])
                self.stats.record(len(batch), time.perf_counter() - started)
                hand_back(batch, outcomes)
        finally:
            if self._conn is not None:
                self._conn.close()

    def _execute(self, fns: list[Txn]) -> list[tuple[bool, Any]]:
        """Run ``fns`` in one transaction; each outcome is ``(ok, result or exception)``."""
        try:
            conn = self._connection()
            conn.raw.execute("BEGIN")
            if self._on_batch is not None:
                self._on_batch(conn)
            if len(fns) == 1:
                outcomes = [self._alone(conn, fns[0])]
            else:
                outcomes = self._in_savepoints(conn, fns)
            if conn.in_transaction:
                conn.raw.execute("COMMIT")
            return outcomes
        except Exception as exc:  # the batch failed to commit: the connection, the server
            log.error("group commit failed", error=repr(exc), batch=len(fns))
            self._reset()
            return [(False, _retryable(exc)) for _ in fns]

    def _connection(self) -> PgConnection:
        if self._conn is None or self._conn.raw.closed:
            self._conn = PgConnection(connect(self._dsn, RECONNECT_WINDOW_S))
        return self._conn

    def _reset(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            if not conn.raw.closed and conn.in_transaction:
                conn.raw.execute("ROLLBACK")
        except psycopg.Error:  # the connection is gone: the next batch reconnects
            conn.raw.close()

    @staticmethod
    def _alone(conn: PgConnection, fn: Txn) -> tuple[bool, Any]:
        try:
            return (True, fn(conn))
        except Exception as exc:  # handed to the caller; nothing of it is committed
            if conn.raw.broken or conn.raw.closed:
                raise
            conn.raw.execute("ROLLBACK")
            return (False, _retryable(exc))

    @staticmethod
    def _in_savepoints(conn: PgConnection, fns: list[Txn]) -> list[tuple[bool, Any]]:
        """Each function behind one savepoint, so that a failing one is undone alone.

        One round trip per function, not two: a function that succeeded releases the
        savepoint and sets the next one in one message; one that failed rolls back to it,
        which leaves it set where it was (the state after the last success) for the next;
        COMMIT releases the last."""
        outcomes: list[tuple[bool, Any]] = []
        conn.raw.execute("SAVEPOINT txn")
        for i, fn in enumerate(fns):
            try:
                outcomes.append((True, fn(conn)))
            except Exception as exc:  # handed to the caller; its neighbours still commit
                if conn.raw.broken or conn.raw.closed:  # the whole batch is lost
                    raise
                conn.raw.execute("ROLLBACK TO SAVEPOINT txn")
                outcomes.append((False, _retryable(exc)))
                continue
            if i + 1 < len(fns):
                conn.raw.execute("RELEASE SAVEPOINT txn; SAVEPOINT txn")
        return outcomes
