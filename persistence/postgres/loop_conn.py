"""A libpq connection driven by the event loop: the store's hot statements (a task change,
an acceptance, the WAL flush) sent with libpq's non-blocking API and their results read
when the socket says so, on the loop itself.

Why not a thread: a change handed to a writer thread and its result handed back costs two
thread wake-ups and a GIL hand-off each way — ~150 µs of CPU per call measured here, more
than the call's own work — and a busy loop delays the thread's result by up to the GIL's
switch interval. SQLite's writer runs its commits on the loop for the same reason
(persistence/writer.py). Why not psycopg's ``AsyncConnection.execute``: its cursor, query
conversion and per-wait reader registration cost ~200 µs of CPU per statement; this is
``send_query_prepared``, one reader registered for the connection's life, and the row's
bytes (postgres/prepared.py encodes the arguments).

One statement at a time per connection (:meth:`run` is not re-entrant: the caller, a lane
of postgres/fast_lanes.py, awaits each before the next). Every statement is its own
transaction (autocommit): no transaction is ever left open between two round trips.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

from ratchet.persistence.postgres.connection import configure, connect_kwargs, session_setup
from ratchet.persistence.postgres.prepared import Prepared, error_of

__all__ = ["LoopConnection"]


class LoopConnection:
    """Open with :meth:`open`; :meth:`close` when done. ``setup``: statements run once
    connected (e.g. ``SET synchronous_commit = off``); ``reopen``: a statement on a lost
    connection connects again first (False: it raises, the owner reconnects)."""

    def __init__(self, dsn: str, setup: Sequence[str] = (), reopen: bool = True) -> None:
        self._dsn = dsn
        self._setup = setup
        self._reopen = reopen
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._prepared: set[bytes] = set()
        #: The reads prepared on this connection: (query, argument types) -> name.
        self._statements: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A duplicate of libpq's socket, registered with the loop: libpq closes its own when
        #: the connection breaks, and its number, reused by the next socket opened, would
        #: then be registered under this connection's callback — the new one never woken.
        self._fd = -1
        self._broken = False  # input failed: no reader is registered any more

    @property
    def lost(self) -> bool:
        """Never opened, closed, or broken: the next :meth:`run` opens it again."""
        return (self._pgconn is None or self._broken
                or self._pgconn.status == pq.ConnStatus.BAD)

    async def open(self) -> None:
        """Connect (raises ``psycopg.OperationalError`` if the server cannot be reached)."""
        self.close()
        conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True,
                                                     **connect_kwargs(self._dsn))
        configure(conn)
        for statement in [s for s in (session_setup(self._dsn), *self._setup) if s]:
            await conn.execute(statement)
        self._conn, self._pgconn = conn, conn.pgconn
        self._pgconn.nonblocking = 1
        self._loop = asyncio.get_running_loop()
        self._fd = os.dup(self._pgconn.socket)
        self._loop.add_reader(self._fd, self._readable)

    def close(self) -> None:
        if self._pgconn is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
            self._pgconn.finish()
        self._conn = self._pgconn = None
        self._broken = False
        self._prepared = set()
        self._statements = {}
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(psycopg.OperationalError("the connection was closed"))

    async def run(self, statement: Prepared, args: Sequence[Any]) -> list[bytes | None]:
        """Run ``statement`` (its own transaction); its first row as bytes (text format),
        [] when none.

        Raises:
            psycopg.Error: the server's error (by SQLSTATE); ``OperationalError`` when the
                connection is lost (it is then closed: the next run reconnects).
        """
        await self._ready()
        values = statement.encode(args)
        try:
            if statement.name not in self._prepared:
                await self._exchange(lambda pg: pg.send_prepare(statement.name, statement.sql),
                                     prepare=True)
                self._prepared.add(statement.name)
            row: list[bytes | None] = await self._exchange(lambda pg: pg.send_query_prepared(
                statement.name, values, statement.formats))
            return row
        except psycopg.OperationalError:
            self.close()
            raise

    async def fetch(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Every row of ``sql`` (``%s`` placeholders, psycopg's), its arguments and
        columns adapted as psycopg's execute would (its C Transformer, the connection's
        adapters: postgres/connection.py ``configure``), prepared on first use."""
        await self._ready()
        assert self._conn is not None
        query, count = _dollars(sql)
        tx = Transformer(self._conn)
        params = tx.dump_sequence(args, [PyFormat.AUTO] * count) if count else []
        types = tuple(tx.types or ()) if count else ()
        name = self._statements.get((query, types))
        try:
            if name is None:
                name = b"r%d" % len(self._statements)
                await self._exchange(lambda pg: pg.send_prepare(name, query,
                                                                param_types=list(types)),
                                     prepare=True)
                self._statements[(query, types)] = name
            res = await self._exchange(lambda pg: pg.send_query_prepared(
                name, params, param_formats=tx.formats), whole=True)
        except psycopg.OperationalError:
            self.close()
            raise
        if res.status != pq.ExecStatus.TUPLES_OK:
            return []
        tx.set_pgresult(res)
        return tx.load_rows(0, res.ntuples, tuple)

    async def _ready(self) -> None:
        if self.lost:
            if not self._reopen:
                raise psycopg.OperationalError("the connection is lost")
            await self.open()

    async def _exchange(self, send: Any, prepare: bool = False, whole: bool = False) -> Any:
        """Send, then read the results: the last one's first row as bytes (``whole``: the
        last result itself)."""
        pgconn = self._pgconn
        assert pgconn is not None
        send(pgconn)
        last: pq.abc.PGresult | None = None
        try:
            while pgconn.flush():  # a large argument: the rest once the socket takes it
                await self._wait(writable=True)
            while True:
                while pgconn.is_busy():
                    await self._wait()
                res = pgconn.get_result()
                if res is None:
                    break
                last = res
        except asyncio.CancelledError:
            # Its results would come to the next statement: the connection goes (a read
            # or a flush pass, both safe to run again; the next use connects anew).
            self.close()
            raise
        if last is None or pgconn.status == pq.ConnStatus.BAD:
            raise psycopg.OperationalError("the connection is lost: "
                                           + pgconn.get_error_message())
        if last.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            if whole:
                return last
            return ([last.get_value(0, i) for i in range(last.nfields)]
                    if last.status == pq.ExecStatus.TUPLES_OK and last.ntuples else [])
        error = error_of(last, pgconn)
        if prepare and error.sqlstate == "42P05":  # prepared already on this connection
            return []
        raise error

    async def _wait(self, writable: bool = False) -> None:
        assert self._loop is not None and self._pgconn is not None
        if self._broken:
            raise psycopg.OperationalError("the connection is lost (the server closed it)")
        waiter = self._loop.create_future()
        if writable:
            self._loop.add_writer(self._fd, _done, waiter)
            try:
                await waiter
            finally:
                self._loop.remove_writer(self._fd)
            return
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _readable(self) -> None:
        """Input came (a result, or a notice while idle): take it in, wake the waiter."""
        pgconn = self._pgconn
        if pgconn is None:
            return
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:  # the server went away
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            self._broken = True
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(exc)
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@functools.lru_cache(maxsize=4096)
def _dollars(sql: str) -> tuple[bytes, int]:
    """psycopg's ``%s`` placeholders as libpq's ``$n`` (``%%``: a ``%``), and their count."""
    count = 0

    def one(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return re.sub(r"%%|%s", one, sql).encode(), count


def _done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
