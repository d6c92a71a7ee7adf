"""The writer that owns its connection on its own thread (see persistence/writer.py for
when it is used and why it is not the default)."""

from __future__ import annotations

import asyncio
import collections
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ratchet.persistence.batch import close_connection, execute_batch
from ratchet.persistence.commit_stats import WriterStats, call_soon_threadsafe, settle
from ratchet.persistence.connection import open_connection
from ratchet.persistence.wal import DEFAULT_WAL_LIMIT, WalGuard
from ratchet.protocol.tracing import bind_context

__all__ = ["ThreadWriter"]

T = TypeVar("T")

_STOP = object()
_WAKE = object()  # an urgent item is waiting in the urgent lane
_RESTART = object()  # (urgent lane) reset the WAL before the next batch


class ThreadWriter:
    """Group commit on a dedicated thread (``serve --writer thread``: several nodes on one
file, whose write-lock waits would otherwise block the event loop). SQLite's own
``synchronous`` setting applies: with FULL, each batch's COMMIT fsyncs on this thread."""

    def __init__(self, path: str, synchronous: str = "FULL", max_batch: int = 512,
                 wal_limit: int = DEFAULT_WAL_LIMIT, wal: WalGuard | None = None) -> None:
        self._path = path
        self._synchronous = synchronous
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._urgent: collections.deque[Any] = collections.deque()  # thread-safe appends/pops
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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        fn = bind_context(fn)  # the caller's span, for the events it writes (if tracing)
        if urgent:
            self._urgent.append((fn, loop, fut))
            self._queue.put(_WAKE)
        else:
            self._queue.put((fn, loop, fut))
        return fut

    def stop(self) -> None:
        """Finish what is queued, close the connection, join the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
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
            stopping = False
            while not stopping:
                first = self._queue.get()
                if first is _STOP:
                    break
                batch = []
                while self._urgent:
                    item = self._urgent.popleft()
                    if item is _RESTART:
                        self._restart_wal(conn)
                    else:
                        batch.append(item)
                if first is not _WAKE:
                    batch.append(first)
                while len(batch) < self._max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    if item is not _WAKE:
                        batch.append(item)
                if not batch:
                    continue  # the urgent items of this wake-up went in an earlier batch
                started = time.perf_counter()
                outcomes = execute_batch(conn, [fn for fn, _, _ in batch], self.wal.lost)
                self.stats.record(len(batch), time.perf_counter() - started)
                self._hand_back(batch, outcomes)
                todo = self.wal.after_commit()
                if todo == "restart":
                    self.wal.prepare_restart(self._ask_restart)
                elif todo == "hold":  # over the hard cap: restart before the next batch
                    self._restart_wal(conn)
        finally:
            self.wal.stop()
            self.rescued = close_connection(conn, self.wal, self._path)

    def _ask_restart(self) -> None:
        self._urgent.append(_RESTART)
        self._queue.put(_WAKE)

    def _restart_wal(self, conn: sqlite3.Connection) -> None:
        if self.wal.wal_used() < self.wal.limit_bytes and not self.wal.restarting:
            return  # already done (the hard cap came first)
        held = time.perf_counter()  # the queue waits meanwhile: that is the hold
        self.wal.restart(conn)
        self.wal.stats.record_hold(time.perf_counter() - held)

    @staticmethod
    def _hand_back(batch: list[Any], outcomes: list[tuple[bool, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], tuple[bool, Any]]]] = {}
        for (_, loop, fut), outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(loop, []).append((fut, outcome))
        for loop, settled in by_loop.items():
            call_soon_threadsafe(loop, settle, settled)
