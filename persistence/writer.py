"""The single writing owner of the SQLite file, with group commit.

One thread owns the write connection. Callers on the event loop submit a transaction
function (``fn(conn) -> T``); the thread drains whatever has queued up, runs each function
inside its own SAVEPOINT (so one failing compare-and-set does not undo its neighbours) and
commits the whole batch once: many actors' steps share one WAL write. Results go back to
the loop with one ``call_soon_threadsafe`` per batch.

Why not aiosqlite for writes: every aiosqlite call is a round trip to its thread (~90 µs
here) and it has no public way to run a function in that thread, so a five-statement step
would cost five round trips; here it costs one, shared by the batch.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

__all__ = ["GroupCommitWriter", "WriterStats", "open_connection"]

T = TypeVar("T")
log = structlog.get_logger("ratchet.store.writer")

_STOP = object()


def open_connection(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection with the pragmas every Ratchet connection uses."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


@dataclass
class WriterStats:
    batches: int = 0
    transactions: int = 0
    largest_batch: int = 0


class GroupCommitWriter:
    """Runs write transactions on one thread, committing concurrent ones together.

    Args:
        path: the SQLite file.
        synchronous: ``NORMAL`` (WAL: survives process crashes, may lose the last commits
            on power loss) or ``FULL`` (fsync per commit: survives power loss).
        max_batch: most transactions in one commit.
    """

    def __init__(self, path: str, synchronous: str = "NORMAL", max_batch: int = 512) -> None:
        self._path = path
        self._synchronous = synchronous
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ratchet-store-writer", daemon=True)
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self.stats = WriterStats()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise self._open_error

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue ``fn`` to run in the next batch; the future settles after COMMIT."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, loop, fut))
        return fut

    def stop(self) -> None:
        """Finish what is queued, close the connection, join the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # -- writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            conn = open_connection(self._path, self._synchronous)
        except BaseException as exc:  # reported to start()'s caller
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            stopping = False
            while not stopping:
                first = self._queue.get()
                if first is _STOP:
                    break
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    batch.append(item)
                self._run_batch(conn, batch)
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for fn, _, _ in batch:
                conn.execute("SAVEPOINT txn")
                try:
                    result = fn(conn)
                except BaseException as exc:
                    conn.execute("ROLLBACK TO txn")
                    conn.execute("RELEASE txn")
                    outcomes.append((False, exc))
                else:
                    conn.execute("RELEASE txn")
                    outcomes.append((True, result))
            conn.execute("COMMIT")
        except BaseException as exc:
            log.error("group commit failed", error=repr(exc), batch=len(batch))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(False, exc)] * len(batch)
        self.stats.batches += 1
        self.stats.transactions += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for (_, loop, fut), (ok, value) in zip(batch, outcomes, strict=True):
            by_loop.setdefault(loop, []).append((fut, ok, value))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:  # the loop closed while we committed; nobody is waiting
                pass


def _settle(settled: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in settled:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
