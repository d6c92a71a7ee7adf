"""The writer that owns its connection on its own thread (see persistence/writer.py for
when it is used and why it is not the default)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ratchet.persistence.batch import close_connection, execute_batch
from ratchet.persistence.commit_stats import WriterStats
from ratchet.persistence.connection import open_connection
from ratchet.persistence.group_commit import BatchQueue, hand_back
from ratchet.persistence.wal import DEFAULT_WAL_LIMIT, WalGuard

__all__ = ["ThreadWriter"]

T = TypeVar("T")

_RESTART = object()  # (urgent lane) reset the WAL before the next batch


class ThreadWriter:
    """Group commit on a dedicated thread (``serve --writer thread``: several nodes on one
file, whose write-lock waits would otherwise block the event loop). SQLite's own
``synchronous`` setting applies: with FULL, each batch's COMMIT fsyncs on this thread."""

    def __init__(self, path: str, synchronous: str = "FULL", max_batch: int = 512,
                 wal_limit: int = DEFAULT_WAL_LIMIT, wal: WalGuard | None = None) -> None:
        self._path = path
        self._synchronous = synchronous
        self._queue = BatchQueue(max_batch)
        self._thread = threading.Thread(target=self._run, name="ratchet-store-writer", daemon=True)
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self.wal = wal or WalGuard(path, synchronous, wal_limit)
        self.stats = WriterStats()
        self.rescued: str | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise self._open_error

    def submit(self, fn: Callable[[sqlite3.Connection], T],
               urgent: bool = False) -> asyncio.Future[T]:
        """``urgent``: into the next batch, ahead of everything queued."""
        return self._queue.submit(fn, urgent)

    def stop(self) -> None:
        """Finish what is queued, close the connection, join the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.stop()
            self._thread.join()

    async def close(self) -> None:
        await asyncio.to_thread(self.stop)

    def _run(self) -> None:
        try:
            conn = open_connection(self._path, self._synchronous)
            self.wal.configure(conn)
            self.wal.start()
        except BaseException as exc:  # reported to start()'s caller
            self._open_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (batch := self._queue.next_batch(
                    on_control=lambda _: self._restart_wal(conn))) is not None:
                if not batch:
                    continue  # the urgent items of this wake-up went in an earlier batch
                started = time.perf_counter()
                outcomes = execute_batch(conn, [fn for fn, _, _ in batch], self.wal.lost)
                self.stats.record(len(batch), time.perf_counter() - started)
                hand_back(batch, outcomes)
                todo = self.wal.after_commit()
                if todo == "restart":
                    self.wal.prepare_restart(self._ask_restart)
                elif todo == "hold":  # over the hard cap: restart before the next batch
                    self._restart_wal(conn)
        finally:
            self.wal.stop()
            self.rescued = close_connection(conn, self.wal, self._path)

    def _ask_restart(self) -> None:
        self._queue.control(_RESTART)

    def _restart_wal(self, conn: sqlite3.Connection) -> None:
        if self.wal.wal_used() < self.wal.limit_bytes and not self.wal.restarting:
            return  # already done (the hard cap came first)
        held = time.perf_counter()  # the queue waits meanwhile: that is the hold
        self.wal.restart(conn)
        self.wal.stats.record_hold(time.perf_counter() - held)
