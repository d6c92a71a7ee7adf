"""psycopg 3 connections that look, to Ratchet's SQL, like the sqlite3 ones it was written
for: ``execute``/``executemany`` with ``?`` placeholders (persistence/postgres/dialect.py),
cursors with ``fetchone``/``fetchall``/``rowcount``/``lastrowid``, SQLite's value types
back (integers, floats, bytes), and a key already taken as ``sqlite3.IntegrityError``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.adapt import Dumper, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

from ratchet.persistence.postgres.dialect import Statement, translate

__all__ = ["IDLE_IN_TRANSACTION_TIMEOUT_MS", "RECONNECT_WINDOW_S", "PgConnection", "PgCursor", "connect",
           "configure", "connect_kwargs", "session_setup"]

#: A session idle inside a transaction this long is ended by the server, its locks freed.
#: A node frozen mid-transaction (SIGSTOP, a VM paused, a partition the server does not
#: see) holds the row locks of its lease and task rows; without this the survivors' takeover
#: (``SELECT … FOR UPDATE`` on the same lease row) would wait for it for ever — their
#: writer, renewals included, stalled behind it. Below the lease TTL (5 s), so a takeover
#: finds the locks gone (docs/operations.md, "A node frozen holding row locks"). A DSN whose
#: ``options`` sets ``idle_in_transaction_session_timeout`` keeps its own.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 2000

#: libpq's TCP settings when the DSN gives none: a server gone silent (a partition, a host
#: lost) fails the connection within ~10 s instead of TCP's ~15 min of retransmissions.
_TCP = {"keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2",
        "keepalives_count": "3", "tcp_user_timeout": "10000"}

_INT8_OID = 20
_NUMERIC_OID = 1700


class _BoolAsInt(Dumper):
    """SQLite stores True as 1: so do we (the schema's flags are integers)."""

    oid = _INT8_OID

    def dump(self, obj: Any) -> bytes:
        return b"1" if obj else b"0"


class _NumericAsNumber(Loader):
    """``SUM`` of integers is ``numeric`` in PostgreSQL: an int (or a float), as in SQLite,
    never a Decimal."""

    format = Format.TEXT

    def load(self, data: Any) -> Any:
        text = bytes(data).decode()
        value = Decimal(text)
        return int(value) if value == value.to_integral_value() and "." not in text \
            else float(value)


def configure(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """The value types Ratchet's code expects, on one connection."""
    conn.adapters.register_dumper(bool, _BoolAsInt)
    conn.adapters.register_loader(_NUMERIC_OID, _NumericAsNumber)


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """libpq parameters to add to ``dsn``: the TCP timeouts it does not set itself."""
    given = conninfo_to_dict(dsn)
    return {k: v for k, v in _TCP.items() if k not in given}


def session_setup(dsn: str) -> str | None:
    """The statement each session runs first (None: the DSN's ``options`` set it)."""
    if "idle_in_transaction_session_timeout" in str(conninfo_to_dict(dsn).get("options", "")):
        return None
    return f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}"


#: Seconds a (re)connection keeps trying before the error reaches the callers: a server
#: restarting (``the database system is starting up``) is back within it, and the writes
#: and reads queued meanwhile wait instead of failing (and crashing their tasks).
RECONNECT_WINDOW_S = 10.0


def connect(dsn: str, window: float = 0.0) -> psycopg.Connection[Any]:
    """A sync connection in autocommit mode: transactions are the caller's BEGIN/COMMIT.
    ``window``: keep trying that many seconds (backing off up to 0.5 s) before raising."""
    deadline = time.monotonic() + window
    delay = 0.05
    while True:
        try:
            conn = psycopg.connect(dsn, autocommit=True, **connect_kwargs(dsn))
            break
        except psycopg.OperationalError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)  # on the writer's thread: its queue waits, not the loop
            delay = min(0.5, delay * 2)
    setup = session_setup(dsn)
    if setup is not None:
        conn.execute(setup)
    configure(conn)
    return conn


class PgCursor:
    """The result of one statement, read the way sqlite3's cursor is."""

    __slots__ = ("_rows", "lastrowid", "rowcount")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int,
                 lastrowid: int | None = None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


def _integrity(stmt: Statement) -> sqlite3.IntegrityError:
    return sqlite3.IntegrityError(f"UNIQUE constraint failed: {stmt.sql.split('(')[0]}")


class PgConnection:
    """The sqlite3.Connection subset the ``*_txn`` functions use, over a psycopg
    connection (the writer's; ``writing``: single-row reads of a task or lease lock it)."""

    def __init__(self, conn: psycopg.Connection[Any], writing: bool = True) -> None:
        self.raw = conn
        self._writing = writing

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def execute(self, sql: str, args: Sequence[Any] = ()) -> PgCursor:
        stmt = translate(sql, self._writing)
        cur = self.raw.execute(stmt.sql, tuple(args) if args else None)
        rows = cur.fetchall() if cur.description is not None else []
        if stmt.strict_insert and cur.rowcount < 1:
            raise _integrity(stmt)
        lastrowid = rows[0][0] if stmt.returns_id and rows else None
        return PgCursor([] if stmt.returns_id else rows, cur.rowcount, lastrowid)

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> PgCursor:
        stmt = translate(sql, self._writing)
        params = [tuple(p) for p in seq]
        if not params:
            return PgCursor([], 0)
        with self.raw.cursor() as cur:
            cur.executemany(stmt.sql, params)
            if stmt.strict_insert and cur.rowcount < len(params):
                raise _integrity(stmt)
            return PgCursor([], cur.rowcount)

    def close(self) -> None:
        self.raw.close()
