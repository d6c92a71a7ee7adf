"""The single writing owner of the SQLite file, with group commit.

Callers submit a transaction function (``fn(conn) -> T``) and await its result. The writer
drains whatever has queued up, runs each function (inside its own SAVEPOINT when it has
neighbours, so one failing compare-and-set does not undo them) and commits the batch once:
many actors' steps share one WAL append. A result is handed back once its commit is as
durable as the store is configured to be — except for :meth:`LoopWriter.submit_pipelined`,
whose caller gets the result at the commit and a future for its durability.

Where the work runs depends on what it costs (figures: docs/operations.md, "Where the time
goes"):

- the SQLite work of a batch (~60 µs of ``write()`` into the page cache plus the
  transaction's own Python) runs on the event loop in :class:`LoopWriter`, scheduled with
  ``call_soon`` so that every commit requested in the same loop iteration joins one batch.
  Handing each transaction to a thread and back cost more than that (~100 µs of wake-ups
  measured) and, with ``FULL``, put the fsync on every step's path;
- with ``synchronous=FULL`` the fsync is the one thing off the loop: the connection runs
  SQLite ``NORMAL`` and a :class:`~persistence.syncer.WalSyncer` thread syncs
  (``fdatasync``) the WAL after the commits (which is all FULL adds in WAL mode). One
  sync covers every batch committed while the previous one ran, and one ``call_soon_threadsafe`` per sync (not per
  transaction) hands them all back. A task's step commit is *pipelined*: the actor goes on
  to its next step while the sync runs; its events and acks wait for it (the store
  announces outbox rows only once durable, reads answer only once what they saw is durable).
  Rejected: the whole batch on a thread (:class:`ThreadWriter`, the previous FULL writer):
  a hand-off per batch and a step that waits for its fsync, 4x slower on one task;
- WAL checkpoints (which fsync) run on the :class:`~persistence.wal.WalGuard` thread; when
  the WAL reaches its bound the writer holds its batches (the loop runs on) while the guard
  resets the WAL.

:class:`ThreadWriter` owns the connection on its own thread (SQLite's own FULL or NORMAL):
``serve --writer thread``, for several nodes on one file, whose lock waits would otherwise
block the event loop. It hands results back with one ``call_soon_threadsafe`` per batch.

Why not aiosqlite for writes: every aiosqlite call is a round trip to its thread and it has
no public way to run a function there, so a six-statement step would cost six round trips.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import structlog

from ratchet.persistence.batch import close_connection, execute_batch
from ratchet.persistence.commit_stats import (
    COMMIT_BUCKETS,
    WriterStats,
    call_soon_threadsafe,
    settle,
)
from ratchet.persistence.connection import open_connection
from ratchet.persistence.syncer import WalSyncer
from ratchet.persistence.thread_writer import ThreadWriter
from ratchet.persistence.wal import DEFAULT_WAL_LIMIT, WalGuard
from ratchet.protocol.errors import StoreUnavailable
from ratchet.protocol.tracing import bind_context

__all__ = ["COMMIT_BUCKETS", "Writer", "LoopWriter", "Pipelined", "ThreadWriter", "WriterStats",
           "make_writer", "open_connection"]

T = TypeVar("T")
Txn = Callable[[sqlite3.Connection], Any]
#: A pipelined result: the value at the commit, and its durability (None: already durable).
Pipelined = tuple[Any, "asyncio.Future[None] | None"]
log = structlog.get_logger("ratchet.store.writer")



class Writer(Protocol):
    stats: WriterStats
    wal: WalGuard
    #: Where the data went when the database file was lost under the node (file_watch.py).
    rescued: str | None

    def start(self) -> None: ...

    def submit(self, fn: Callable[[sqlite3.Connection], T],
               urgent: bool = False) -> asyncio.Future[T]: ...

    def stop(self) -> None: ...

    async def close(self) -> None: ...


class LoopWriter:
    """Group commit on the event-loop thread; with ``FULL``, the WAL synced on a thread.

    A batch blocks the loop while it runs; ``stats.commit_seconds`` records how long (the
    bench reports its p99). Checkpoints run on the WAL guard's thread; while it resets the
    WAL the writer holds (requests queue, the loop runs on) — see :mod:`persistence.wal`.

    ``sync``: how the WAL file's descriptor is synced (``FULL`` only; tests inject one).
    """

    def __init__(self, path: str, synchronous: str = "NORMAL", max_batch: int = 128,
                 wal_limit: int = DEFAULT_WAL_LIMIT, wal: WalGuard | None = None,
                 sync: Callable[[int], None] = os.fdatasync) -> None:
        self._path = path
        self._synchronous = synchronous
        self._max_batch = max_batch
        #: (fn, future, pipelined)
        self._pending: list[tuple[Txn, asyncio.Future[Any], bool]] = []
        self._scheduled = False
        self._held_since: float | None = None  # set while the guard resets the WAL
        self._conn: sqlite3.Connection | None = None
        self.wal = wal or WalGuard(path, synchronous, wal_limit)
        self.stats = WriterStats()
        #: FULL: SQLite runs NORMAL and this thread adds the WAL's sync (persistence/syncer.py).
        self.syncer = WalSyncer(path, sync, self.stats) if synchronous == "FULL" else None
        self.rescued: str | None = None

    def start(self) -> None:
        self._conn = open_connection(self._path, "NORMAL" if self.syncer else self._synchronous)
        self.wal.configure(self._conn)
        self.wal.start()
        if self.syncer is not None:
            self.syncer.start()

    def submit(self, fn: Callable[[sqlite3.Connection], T],
               urgent: bool = False) -> asyncio.Future[T]:
        """``urgent``: ahead of everything queued (lease renewals must not wait behind a
        flood of step commits). The result comes once the commit is durable."""
        return self._enqueue(fn, urgent, False)

    def submit_pipelined(self, fn: Txn) -> asyncio.Future[Pipelined]:
        """``(result, durable)`` as soon as the batch committed; ``durable`` (None when it
        already is) resolves once the commit is durable, or fails if it never will be.
        Nothing that depends on the commit may leave the process before then."""
        return self._enqueue(fn, False, True)

    async def synced(self) -> None:
        """Return once every commit made so far is durable (at once when it is)."""
        syncer = self.syncer
        if syncer is not None and syncer.pending:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            syncer.when_synced(syncer.committed, functools.partial(_resolve, done))
            await done

    def _enqueue(self, fn: Txn, urgent: bool, pipelined: bool) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        fn = bind_context(fn)  # the caller's span, for the events it writes (if tracing)
        if urgent:
            self._pending.insert(0, (fn, fut, pipelined))
        else:
            self._pending.append((fn, fut, pipelined))
        self._schedule(loop)
        return fut

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled and self._held_since is None:
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._held_since is not None:
            return  # _resume schedules the next batch
        batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch:]
        if not batch:
            return
        assert self._conn is not None, "writer not started"
        syncer = self.syncer
        refuse = self.wal.lost or (None if syncer is None or syncer.failed is None
                                   else f"the WAL could not be synced ({syncer.failed!r})")
        started = time.perf_counter()
        outcomes = execute_batch(self._conn, [fn for fn, _, _ in batch], refuse)
        self.stats.record(len(batch), time.perf_counter() - started)
        loop = asyncio.get_running_loop()
        todo = self.wal.after_commit()
        if todo == "restart":
            self.wal.prepare_restart(lambda: call_soon_threadsafe(loop, self._hold, loop))
        elif todo == "hold":  # over the hard cap: no batch until the restart is done
            self._held_since = self._held_since or time.perf_counter()
        if self._pending:
            self._schedule(loop)
        if syncer is None or refuse is not None:
            settle([(fut, (ok, (value, None)) if pipelined and ok else (ok, value))
                     for (_, fut, pipelined), (ok, value) in zip(batch, outcomes, strict=True)])
        else:
            self._settle_when_synced(syncer, batch, outcomes, loop)

    @staticmethod
    def _settle_when_synced(syncer: WalSyncer, batch: list[tuple[Txn, asyncio.Future[Any], bool]],
                            outcomes: list[tuple[bool, Any]],
                            loop: asyncio.AbstractEventLoop) -> None:
        """Pipelined results now, with a durability future; the others at the sync (a
        refusal too: it may rest on a commit that is not durable yet)."""
        number = syncer.committed_batch()
        later: list[tuple[asyncio.Future[Any], tuple[bool, Any]]] = []
        for (_, fut, pipelined), (ok, value) in zip(batch, outcomes, strict=True):
            if pipelined and ok:
                durable: asyncio.Future[None] = loop.create_future()
                later.append((durable, (True, None)))
                settle([(fut, (True, (value, durable)))])
            elif pipelined:  # not committed: nothing to wait for
                settle([(fut, (False, value))])
            else:
                later.append((fut, (ok, value)))
        syncer.when_synced(number, functools.partial(_settle_or_fail, later))

    def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        """Between two batches (we run on the loop): hold while the guard resets the WAL."""
        if self._conn is None:
            return  # stopped meanwhile
        self._held_since = self._held_since or time.perf_counter()
        self.wal.restart_soon(lambda: call_soon_threadsafe(loop, self._resume, loop))

    def _resume(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._held_since is None:
            return
        self.wal.stats.record_hold(time.perf_counter() - self._held_since)
        self._held_since = None
        if self._pending:
            self._schedule(loop)

    def stop(self) -> None:
        """Run what is pending, sync it, close the connection. Idempotent."""
        if self._conn is None:
            return
        self.wal.stop()  # finishes a restart in progress: nothing holds the writer after
        self._held_since = None
        while self._pending:
            self._flush()
        if self.syncer is not None:
            self.syncer.stop()  # the last sync, and every waiter answered
        conn, self._conn = self._conn, None
        self.rescued = close_connection(conn, self.wal, self._path)

    async def close(self) -> None:
        self.stop()


def _resolve(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if not fut.done():
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


def _settle_or_fail(settled: list[tuple[asyncio.Future[Any], tuple[bool, Any]]],
                    error: BaseException | None) -> None:
    """Settle at the sync; a sync that failed fails them all (StoreUnavailable)."""
    if error is not None:
        failure = StoreUnavailable(f"the WAL could not be synced: {error!r}")
        settled = [(fut, (False, failure)) for fut, _ in settled]
    settle(settled)


def make_writer(path: str, synchronous: str, kind: str = "auto",
                wal_limit: int = DEFAULT_WAL_LIMIT) -> Writer:
    """The writer ``kind`` asked for: ``auto`` and ``loop`` are the :class:`LoopWriter`
    (see the module doc), ``thread`` the :class:`ThreadWriter` (several processes sharing
    the file, whose write locks would otherwise be waited for on the event loop)."""
    if kind not in ("auto", "loop", "thread"):
        raise ValueError("writer must be auto, loop or thread")
    if kind == "thread":
        return ThreadWriter(path, synchronous, wal_limit=wal_limit)
    return LoopWriter(path, synchronous, wal_limit=wal_limit)
