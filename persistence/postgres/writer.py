"""The PostgreSQL store's writer: the same group-commit contract as persistence/writer.py.

The hot writes — a task change, an acceptance, an outbox deletion — are each one call of
a server-side function, its own transaction in autocommit, sent from the event loop
(postgres/fast_lanes.py). Every other ``*_txn`` function is submitted to a writer thread
owning one psycopg connection (postgres/lane.py), which drains what has queued (urgent
items first: lease renewals) and runs it in one transaction, behind savepoints.

Durability: both commit with ``synchronous_commit = off`` — a commit does not wait for
the WAL flush — and :class:`~persistence.postgres.syncer.PgSyncer` flushes on a connection
of its own: one flush for every commit made while the previous one ran (the group commit).
A result is handed back once a flush begun after its commit returned; a pipelined one (a
step's commit) at once, with a future for its durability: the task goes on while the
flush runs, as on SQLite with FULL.

Why a thread and psycopg's sync connection for the others (bench/pg_driver.py): the txn
functions stay the synchronous ones SQLite runs, their statements' round trips off the
loop; they are rare on a step's path (leases, admin, ledger writes).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ratchet.persistence.postgres.connection import PgConnection
from ratchet.persistence.postgres.fast_lanes import FastLanes
from ratchet.persistence.postgres.lane import Lane, LaneItem
from ratchet.persistence.postgres.syncer import PgSyncer
from ratchet.persistence.wal import WalStats
from ratchet.persistence.writer import WriterStats
from ratchet.protocol.tracing import bind_context

__all__ = ["NoWal", "PgWriter"]

T = TypeVar("T")
Txn = Callable[[Any], Any]


class NoWal:
    """What the Store reads of SQLite's WAL guard, for a store without a WAL file: never
    lost, reads never held, figures all zero."""

    def __init__(self) -> None:
        self.lost: str | None = None
        self.on_lost: list[Callable[[str], None]] = []
        self.reads_open = threading.Event()
        self.reads_open.set()
        self.stats = WalStats()


class PgWriter:
    """The store's writes against PostgreSQL: the hot calls on the event loop
    (:attr:`fast`: postgres/fast_lanes.py), every other ``*_txn`` function on one writer
    thread with its connection (postgres/lane.py), and the syncer making both durable."""

    def __init__(self, dsn: str, max_batch: int = 256,
                 on_batch: Callable[[PgConnection], None] | None = None) -> None:
        self.wal = NoWal()
        self.stats = WriterStats()
        self.syncer = PgSyncer(dsn, self.stats)
        self.fast = FastLanes(dsn, self.syncer)
        self._lane = Lane("ratchet-pg-writer", dsn, max_batch, self.syncer, on_batch)
        self.rescued: str | None = None

    async def open(self) -> None:
        """Connect the syncer, the lanes and the writer thread (raises
        ``psycopg.OperationalError`` if the server cannot be reached)."""
        await self.syncer.start()
        await self.fast.open()
        await asyncio.to_thread(self._lane.start)

    def submit(self, fn: Callable[[Any], T], urgent: bool = False) -> asyncio.Future[T]:
        """The result once its commit is durable (on the writer thread)."""
        return self._lane.queue.submit(fn, urgent)

    def submit_pipelined(self, fn: Txn
                         ) -> asyncio.Future[tuple[Any, asyncio.Future[None] | None]]:
        """``(result, durable)`` as soon as it committed; ``durable`` resolves once the
        commit is durable, or fails if it never will be. Nothing that depends on the commit
        may leave the process before then."""
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return self._lane.queue.submit(LaneItem(bind_context(fn), durable), bind=False)

    async def synced(self, generation: int | None = None) -> None:
        """Return once everything committed so far — by any node — is durable: a read
        answers only then. ``generation``: the syncer's, read before the read (default:
        now); raises StoreUnavailable if the server may have gone down since."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if generation is None:
            generation = self.syncer.generation
        self.syncer.after(generation, [(done, (True, None))])
        await done

    def stop(self) -> None:
        """The writer thread only (the loop's parts close in :meth:`close`)."""
        self._lane.stop()

    async def close(self) -> None:
        await asyncio.to_thread(self._lane.stop)
        await self.syncer.close()
        self.fast.close()
