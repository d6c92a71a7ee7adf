"""Durability for the PostgreSQL store's writes: they commit without waiting for the WAL
flush (``synchronous_commit = off``) and this syncer, on a connection of its own, makes
them durable — one flush for every commit made while the previous one ran. The SQLite
store's FULL works the same way (persistence/syncer.py): no write waits on the disk, a
step's commit is pipelined (the task goes on while the flush runs), and nothing that
rests on a commit leaves the process before it is durable.

A *pass* is one call of ``ratchet_flush()`` (persistence/postgres/change_sql.py) in
autocommit, on the event loop (postgres/loop_conn.py): nothing when the WAL is flushed as
far as it is written (one round trip); else a tiny transaction whose synchronous commit
flushes the WAL up to its own commit record — past every commit made before the pass
began, whoever made it: the WAL is one sequence. So a caller waiting for durability waits
for a pass that *begins after* its commit (or, for a read, after its read: what it saw is
durable then).

What a pass cannot vouch for: a commit made before the server restarted or reinitialised
after a crash, which may be lost with the WAL buffers (asynchronous commits). A crash
ends every connection, so a waiter carries the *generation* of the syncer's connection
read before its commit, and a pass on another connection than that one fails it
(:class:`StoreUnavailable`, retryable) instead of vouching for it: the connection that
flushes lived across the commit, so the server did not go down in between. The syncer
connects once per pass at most, never waiting out a restart: while the server is
unreachable its waiters fail at once instead of holding everything that waits for
durability — the lease renewals too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from ratchet.persistence.commit_stats import WriterStats, call_soon_threadsafe, settle
from ratchet.persistence.postgres.change_sql import FLUSH_SQL
from ratchet.persistence.postgres.loop_conn import LoopConnection
from ratchet.persistence.postgres.prepared import Prepared
from ratchet.protocol.errors import StoreUnavailable

__all__ = ["PgSyncer", "Waiter"]

log = structlog.get_logger("ratchet.store.syncer")

_FLUSH = Prepared("ratchet_flush", FLUSH_SQL, ())

#: The syncer's commits must wait for the WAL flush: ``on`` unless the server or the DSN
#: says more (``remote_write``, ``remote_apply``: a synchronous standby's copy too) or
#: ``local``; never ``off``.
_FLUSHES = ("SELECT set_config('synchronous_commit', 'on', false)"
            " WHERE current_setting('synchronous_commit') = 'off'")

#: A future to settle with an outcome ``(ok, value)`` once durable.
Waiter = tuple["asyncio.Future[Any]", tuple[bool, Any]]


class PgSyncer:
    """Runs passes on the event loop while anyone waits. :meth:`after` on the loop,
    :meth:`after_threadsafe` from a writer thread."""

    #: Seconds between the starts of two passes, at least: under load the next pass waits
    #: out the rest, so more commits share it. Measured on one task's steps (bench/nodes.py
    #: ``--store postgres``, interleaved): a flush for every step (~1.3 commits a pass) cost
    #: the server a WAL flush and both sides a wake-up per step; spaced by 1 ms, ~3.5
    #: commits share a pass and the steps go 13-25 % faster. An idle store's pass starts
    #: at once.
    SPACING = 0.001

    def __init__(self, dsn: str, stats: WriterStats) -> None:
        self.stats = stats
        # Never reconnected behind the syncer's back: each connection is a generation.
        self._conn = LoopConnection(dsn, setup=(_FLUSHES,), reopen=False)
        self._connecting = asyncio.Lock()
        self._waiting: list[tuple[int, Waiter]] = []
        self._commits = 0  # transactions the waiting wait for
        self._last_pass = 0.0  # time.monotonic() at the start of the last pass
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Bumped at each (re)connection: what a waiter's commit was made under.
        self.generation = 0
        #: Called on the loop when a pass fails commits it cannot vouch for: they may have
        #: committed (and survived) all the same, their outbox rows unannounced.
        self.on_unsure: Callable[[], None] | None = None

    async def start(self) -> None:
        """Connect (raises if the server cannot be reached) and run the passes."""
        await self._connect()
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="ratchet-pg-sync")

    def after(self, generation: int, waiters: list[Waiter], commits: int = 0) -> None:
        """Settle ``waiters`` once a pass begun after this call has returned, if the
        syncer's connection is still the one of ``generation`` (read before the commit or
        the read they wait for); else with :class:`StoreUnavailable`. ``commits``: how
        many transactions they wait for (the figures: a pass is the group commit of
        those). On the loop."""
        if waiters:
            assert self._wake is not None, "start() first"
            self._waiting.extend((generation, w) for w in waiters)
            self._commits += commits
            self._wake.set()

    def after_threadsafe(self, generation: int, waiters: list[Waiter],
                         commits: int = 0) -> None:
        if waiters:
            assert self._loop is not None, "start() first"
            call_soon_threadsafe(self._loop, self.after, generation, waiters, commits)

    async def reconnect(self) -> None:
        """Connect again now if the connection is lost (one attempt): a commit made after
        a restart then carries the new connection's generation, and the first pass after
        it vouches for it instead of failing it."""
        if self._conn.lost:
            try:
                await self._connect()
            except psycopg.Error:  # still down: the next pass tries again (and fails)
                pass

    async def close(self) -> None:
        """Run a last pass for whoever waits, then close. Idempotent."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        self._conn.close()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting:
                if self._stopping:
                    return
                continue
            spacing = self._last_pass + self.SPACING - time.monotonic()
            if spacing > 0 and not self._stopping:
                await asyncio.sleep(spacing)  # more commits join this pass meanwhile
            self._last_pass = time.monotonic()
            batch, self._waiting = self._waiting, []  # who comes meanwhile: the next pass
            commits, self._commits = self._commits, 0
            await self._pass(batch, commits)

    async def _pass(self, batch: list[tuple[int, Waiter]], commits: int) -> None:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            await self.reconnect()
            await self._conn.run(_FLUSH, ())  # lost still: raises
        except psycopg.Error as exc:
            log.warning("WAL flush failed; its waiters are told the store is unavailable",
                        error=repr(exc), waiting=len(batch))
            error = exc
            await self.reconnect()  # now: a read that runs again may be vouched for at once
        seconds = time.perf_counter() - started
        self.stats.record_sync(commits, seconds)
        if commits:  # the commit figures of a PostgreSQL store: its flushes (the group commit)
            self.stats.record(commits, seconds)
        settled = []
        for generation, (fut, outcome) in batch:
            if error is not None or generation != self.generation:
                reason = error or "the store's connection was lost since the commit"
                outcome = (False, StoreUnavailable(
                    f"the store cannot vouch that a commit is durable: {reason!r}",
                    postgres_error=str(reason)))
            settled.append((fut, outcome))
        if commits and self.on_unsure is not None and any(
                not ok and isinstance(value, StoreUnavailable) for _, (ok, value) in settled):
            self.on_unsure()  # before anything later is announced
        settle(settled)

    async def _connect(self) -> None:
        async with self._connecting:  # the passes and the lanes may both ask
            if self._conn.lost:
                await self._conn.open()
                self.generation += 1
