"""A libpq connection in pipeline mode, driven by the event loop: the hot calls of the
store (postgres/fast_lanes.py) sent as they come, without waiting for the results of
those before them, each followed by its own Sync — so each is its own transaction, as in
autocommit, and the server runs them back to back.

Why: a call sent to a server process that sleeps wakes it, and on a loaded host the wake
costs both sides a context switch (the node's loop is preempted in its ``send``: a quarter
of its samples measured with one call in flight per connection). With the calls of many
tasks queued on one connection, the server finds the next one waiting and the node reads
several results per wake.

Why a Sync after each call, not one per batch: between two Syncs the server runs the
statements in one implicit transaction, which would stay open — its row locks held —
should the node freeze after sending a batch's first statements but before its Sync, and
``idle_in_transaction_session_timeout`` does not end a session in a pipeline. With a Sync
each, a call that reached the server commits (or fails) whole before the server reads on.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq

from ratchet.persistence.postgres.connection import (
    RECONNECT_WINDOW_S,
    configure,
    connect_kwargs,
    session_setup,
)
from ratchet.persistence.postgres.prepared import Prepared, error_of

__all__ = ["PipelineConnection"]

#: What a pending entry waits for, in order: a statement's result, the NULL after it, and
#: (a call's) the Sync's.
_RESULT, _END, _SYNC = 0, 1, 2


class PipelineConnection:
    """Open with :meth:`open`; :meth:`run` from any number of tasks at once."""

    def __init__(self, dsn: str, setup: Sequence[str] = ()) -> None:
        self._dsn = dsn
        self._setup = setup
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1  # a duplicate of libpq's socket (postgres/loop_conn.py says why)
        self._prepared: set[bytes] = set()
        #: Per statement sent: its future, or (a PREPARE) the name it prepares; and what it
        #: waits for next.
        self._pending: collections.deque[tuple[asyncio.Future[Any] | bytes, list[int]]] = (
            collections.deque())
        self._writing = False
        self._opening = asyncio.Lock()
        self._broken = False

    @property
    def lost(self) -> bool:
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
        self._pgconn.enter_pipeline_mode()
        self._loop = asyncio.get_running_loop()
        self._fd = os.dup(self._pgconn.socket)
        self._loop.add_reader(self._fd, self._readable)

    async def _reopen(self) -> None:
        """Connect again, trying for the reconnect window: a server restarting is back
        within it, and the calls meanwhile wait instead of failing (and crashing their
        tasks)."""
        deadline = time.monotonic() + RECONNECT_WINDOW_S
        delay = 0.05
        while True:
            try:
                await self.open()
                return
            except psycopg.OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(0.5, delay * 2)

    def close(self, error: BaseException | None = None) -> None:
        """Close; every call waiting fails (``error``, else OperationalError)."""
        if self._pgconn is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            if self._writing:
                self._loop.remove_writer(self._fd)
            os.close(self._fd)
            self._pgconn.finish()
        self._conn = self._pgconn = None
        self._prepared = set()
        self._writing = self._broken = False
        failure = error or psycopg.OperationalError("the connection was closed")
        while self._pending:
            fut, _ = self._pending.popleft()
            if isinstance(fut, asyncio.Future) and not fut.done():
                fut.set_exception(failure)

    async def run(self, statement: Prepared, args: Sequence[Any]) -> list[bytes | None]:
        """Run ``statement`` (its own transaction); its first row as bytes, [] when none.

        Raises:
            psycopg.Error: the server's error (by SQLSTATE); ``OperationalError`` when the
                connection is lost (it is closed: the next run reconnects) or cannot be
                made again within the reconnect window.
        """
        if self.lost:
            async with self._opening:
                if self.lost:
                    await self._reopen()
        assert self._loop is not None and self._pgconn is not None
        pgconn = self._pgconn
        fut: asyncio.Future[list[bytes | None]] = self._loop.create_future()
        values = statement.encode(args)
        try:
            if statement.name not in self._prepared:
                pgconn.send_prepare(statement.name, statement.sql)
                self._pending.append((statement.name, [_RESULT, _END]))
                self._prepared.add(statement.name)
            pgconn.send_query_prepared(statement.name, values, statement.formats)
            pgconn.pipeline_sync()
            self._pending.append((fut, [_RESULT, _END, _SYNC]))
            self._flush()
        except psycopg.OperationalError as exc:
            self.close(exc)
            raise
        return await fut

    def _flush(self) -> None:
        """Send what libpq holds; the rest once the socket takes it."""
        assert self._pgconn is not None and self._loop is not None
        if self._pgconn.flush() and not self._writing:
            self._writing = True
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        assert self._pgconn is not None and self._loop is not None
        try:
            if not self._pgconn.flush():
                self._loop.remove_writer(self._fd)
                self._writing = False
        except psycopg.OperationalError as exc:
            self.close(exc)

    def _readable(self) -> None:
        """Input came: take in every result it completes, in the order they were sent."""
        pgconn = self._pgconn
        if pgconn is None:
            return
        try:
            pgconn.consume_input()
            while self._pending and not pgconn.is_busy():
                self._one_result(pgconn.get_result())
        except psycopg.OperationalError as exc:  # the server went away
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            self._broken = True
            self.close(exc)

    def _one_result(self, res: pq.abc.PGresult | None) -> None:
        fut, steps = self._pending[0]
        step = steps.pop(0)
        if not steps:
            self._pending.popleft()
        if step != _RESULT or res is None:
            return  # the NULL after a result, or the Sync's
        if isinstance(fut, bytes):  # a PREPARE's: failed, the call after it is aborted
            if res.status != pq.ExecStatus.COMMAND_OK:
                self._prepared.discard(fut)
            return
        if fut.done():
            return
        if res.status == pq.ExecStatus.TUPLES_OK:
            fut.set_result([res.get_value(0, i) for i in range(res.nfields)]
                           if res.ntuples else [])
        elif res.status == pq.ExecStatus.COMMAND_OK:
            fut.set_result([])
        elif res.status == pq.ExecStatus.PIPELINE_ABORTED:
            fut.set_exception(psycopg.OperationalError(
                "the statement before it in the pipeline failed (its PREPARE)"))
        else:
            fut.set_exception(error_of(res, self._pgconn))  # type: ignore[arg-type]
