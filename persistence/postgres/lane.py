"""The PostgreSQL writer's thread (persistence/postgres/writer.py) for the ``*_txn``
functions that are not one server-side call (leases, admin, ledger writes, ...): it owns
one connection and drains its queue in batches, each batch one transaction, each function
inside its own SAVEPOINT when it has neighbours (one failing compare-and-set does not
undo them). The hot writes do not come here: postgres/fast_lanes.py.

Its commits do not wait for the WAL flush (``synchronous_commit = off``): it hands a
pipelined result back at once and every other one to the syncer (postgres/syncer.py),
which settles it once a flush begun after the commit returned. A refusal waits too: it
may rest on a commit not yet durable.

Errors: a connection lost, or the server refusing work (shutdown, disk full), reaches the
callers as :class:`StoreUnavailable` (retryable) and the next batch reconnects; a deadlock
or serialization failure between nodes fails only the transaction that met it, also as
retryable.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from ratchet.persistence.group_commit import BatchQueue, Item, hand_back
from ratchet.persistence.postgres.connection import (
    RECONNECT_WINDOW_S,
    PgConnection,
    connect,
)
from ratchet.persistence.postgres.syncer import PgSyncer, Waiter
from ratchet.protocol.errors import StoreUnavailable

__all__ = ["Lane", "LaneItem"]

Txn = Callable[[Any], Any]
log = structlog.get_logger("ratchet.store.writer")


class LaneItem:
    """A submitted function (bound to its caller's context) whose caller goes on at the
    commit: ``durable`` settles once it is durable."""

    __slots__ = ("durable", "fn")

    def __init__(self, fn: Txn, durable: asyncio.Future[None]) -> None:
        self.fn = fn
        self.durable = durable

    def __call__(self, conn: Any) -> Any:
        return self.fn(conn)


def _retryable(exc: Exception) -> Exception:
    if isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure
                  | psycopg.OperationalError):
        error = StoreUnavailable(f"the store cannot write: {exc}", postgres_error=str(exc))
        error.__cause__ = exc
        return error
    return exc


class Lane:
    """A writer thread and its connection; ``on_batch`` runs first in each batch. Its
    commits count in the syncer's figures (a flush covers them)."""

    def __init__(self, name: str, dsn: str, max_batch: int, syncer: PgSyncer,
                 on_batch: Callable[[PgConnection], None] | None = None) -> None:
        self._dsn = dsn
        self._on_batch = on_batch
        self.queue = BatchQueue(max_batch)
        self.syncer = syncer
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._conn: PgConnection | None = None

    def start(self) -> None:
        """Start the thread; raises what its first connection raised."""
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise self._open_error

    def stop(self) -> None:
        """Run what is queued, then end the thread. Idempotent."""
        if self._thread.is_alive():
            self.queue.stop()
            self._thread.join()

    def _run(self) -> None:
        try:
            self._conn = self._open(0.0)
        except BaseException as exc:  # reported to start()'s caller
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (batch := self.queue.next_batch()) is not None:
                if batch:
                    self._one_batch(batch)
        finally:
            if self._conn is not None:
                self._conn.close()

    def _one_batch(self, batch: list[Item]) -> None:
        generation = self.syncer.generation  # read before any commit of the batch
        outcomes = self._execute([fn for fn, _, _ in batch])
        now: list[Item] = []
        now_outcomes: list[tuple[bool, Any]] = []
        later: list[Waiter] = []
        for item, (ok, value) in zip(batch, outcomes, strict=True):
            fn, _, fut = item
            durable = fn.durable if isinstance(fn, LaneItem) else None
            if durable is not None and ok:
                now.append(item)
                now_outcomes.append((True, (value, durable)))
                later.append((durable, (True, None)))
            elif durable is not None:  # not committed: nothing to wait for
                now.append(item)
                now_outcomes.append((False, value))
            else:
                later.append((fut, (ok, value)))
        hand_back(now, now_outcomes)
        self.syncer.after_threadsafe(generation, later, commits=len(batch))

    def _execute(self, fns: list[Txn]) -> list[tuple[bool, Any]]:
        """Run ``fns`` in one transaction, ``on_batch`` first; each outcome is ``(ok,
        result or exception)``."""
        try:
            conn = self._connection()
            if self._on_batch is not None:
                self._on_batch(conn)
        except Exception as exc:  # no connection: the whole batch fails, retryable
            log.error("group commit failed", error=repr(exc), batch=len(fns))
            self._reset()
            return [(False, _retryable(exc)) for _ in fns]
        return self._in_transaction(fns)

    def _in_transaction(self, fns: list[Txn]) -> list[tuple[bool, Any]]:
        """Run ``fns`` in one transaction; each outcome is ``(ok, result or exception)``."""
        try:
            conn = self._connection()
            conn.raw.execute("BEGIN")
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

    def _open(self, window: float) -> PgConnection:
        conn = PgConnection(connect(self._dsn, window))
        # Commits do not wait for the WAL flush: the syncer's flush vouches for them.
        conn.raw.execute("SET synchronous_commit = off")
        return conn

    def _connection(self) -> PgConnection:
        if self._conn is None or self._conn.raw.closed:
            self._conn = self._open(RECONNECT_WINDOW_S)
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
