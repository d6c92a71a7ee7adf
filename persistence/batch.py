"""One group-commit batch on the writer's connection, and how that connection closes.

A failing disk is not a failing transaction: SQLite's ``SQLITE_FULL`` and ``SQLITE_IOERR``
reach the callers as :class:`StoreUnavailable` (``UNAVAILABLE``, retryable), so a submit is
answered "retry later" rather than "internal error", and the same write succeeds once space
returns. A lost database file (file_watch.py) refuses every batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import structlog

from ratchet.persistence.file_watch import rescue_copy
from ratchet.persistence.wal import WalGuard
from ratchet.protocol.errors import StoreFileLost, StoreUnavailable

__all__ = ["close_connection", "execute_batch", "store_error"]

Txn = Callable[[sqlite3.Connection], Any]
log = structlog.get_logger("ratchet.store.writer")


#: SQLite's primary result codes that mean the disk, not the transaction, failed.
_SQLITE_IOERR, _SQLITE_FULL = 10, 13


def store_error(exc: Exception) -> Exception:
    """A full disk or an I/O error as :class:`StoreUnavailable` (retryable: the node goes
    on once space returns); any other exception as it is."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in (
            _SQLITE_IOERR, _SQLITE_FULL):
        error = StoreUnavailable(f"the store cannot write: {exc}", sqlite_error=str(exc))
        error.__cause__ = exc
        return error
    return exc


def execute_batch(conn: sqlite3.Connection, fns: list[Txn],
                  refuse: str | None = None) -> list[tuple[bool, Any]]:
    """Run ``fns`` in one transaction; each outcome is ``(ok, result or exception)``.

    ``refuse``: the database file was lost (file_watch.py); nothing runs, every caller
    gets :class:`StoreFileLost`."""
    if refuse is not None:
        return [(False, StoreFileLost(f"{refuse}; this node accepts no more writes"))
                for _ in fns]
    try:
        conn.execute("BEGIN IMMEDIATE")
        if len(fns) == 1:
            # Alone in the batch: no neighbours to protect, so no SAVEPOINT statements.
            outcomes = [_run_alone(conn, fns[0])]
        else:
            outcomes = [_run_in_savepoint(conn, fn) for fn in fns]
        if conn.in_transaction:
            conn.execute("COMMIT")
        return outcomes
    except Exception as exc:  # the whole batch failed to commit (disk full, I/O error)
        log.error("group commit failed", error=repr(exc), batch=len(fns))
        _rollback(conn)
        return [(False, store_error(exc)) for _ in fns]


def _rollback(conn: sqlite3.Connection) -> None:
    # A full disk may have rolled the transaction back already (SQLite does on SQLITE_FULL).
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _run_alone(conn: sqlite3.Connection, fn: Txn) -> tuple[bool, Any]:
    try:
        return (True, fn(conn))
    except Exception as exc:  # handed to the caller; nothing of it is committed
        _rollback(conn)
        return (False, store_error(exc))


def _run_in_savepoint(conn: sqlite3.Connection, fn: Txn) -> tuple[bool, Any]:
    conn.execute("SAVEPOINT txn")
    try:
        result = fn(conn)
    except Exception as exc:  # handed to the caller; its neighbours still commit
        if not conn.in_transaction:  # the disk failed and SQLite undid the whole batch
            raise
        conn.execute("ROLLBACK TO txn")
        conn.execute("RELEASE txn")
        return (False, store_error(exc))
    conn.execute("RELEASE txn")
    return (True, result)



def close_connection(conn: sqlite3.Connection, wal: WalGuard, path: str) -> str | None:
    """Close the writer's connection after its last batch: empty the WAL (a full disk may
    refuse that: the WAL then stays, whole, for the next start to replay), or, when the
    database file was lost, first copy its data out; returns that copy's name."""
    rescued: str | None = None
    try:
        if wal.lost is not None:
            rescued = rescue_copy(conn, path)
        else:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except (sqlite3.Error, OSError) as exc:
        log.error("closing checkpoint failed; the WAL is kept for the next start",
                  error=repr(exc), wal_mb=round(wal.wal_size() / 1e6, 1))
    finally:
        conn.close()
    return rescued
