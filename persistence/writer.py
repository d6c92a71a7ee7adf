"""The single writing owner of the SQLite file, with group commit.

Callers submit a transaction function (``fn(conn) -> T``) and await its result. The writer
drains whatever has queued up, runs each function (inside its own SAVEPOINT when it has
neighbours, so one failing compare-and-set does not undo them) and commits the batch once:
many actors' steps share one WAL append.

Where the commit runs depends on what it costs:

- ``synchronous=NORMAL`` (WAL): a commit is a ``write()`` into the page cache (~60 µs here).
  Handing it to a thread and back costs more than that (~100 µs of wake-ups measured), so
  :class:`LoopWriter` runs the batch on the event-loop thread, scheduled with
  ``call_soon`` so that every commit requested in the same loop iteration joins one batch.
  WAL checkpoints (which fsync) run off the loop, on the :class:`~persistence.wal.WalGuard`
  thread; when the WAL reaches its bound the writer holds its batches (the loop runs on)
  while the guard resets the WAL.
- ``synchronous=FULL``: each commit fsyncs (~0.15 ms here, milliseconds on real disks), so
  :class:`ThreadWriter` owns the connection on its own thread, which releases the GIL
  while it waits on the disk, and hands results back with one ``call_soon_threadsafe`` per
  batch. At the WAL's bound this thread resets the WAL itself, between two batches.

Why not aiosqlite for writes: every aiosqlite call is a round trip to its thread and it has
no public way to run a function there, so a six-statement step would cost six round trips.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from ratchet.persistence.batch import close_connection, execute_batch
from ratchet.persistence.connection import open_connection
from ratchet.persistence.wal import DEFAULT_WAL_LIMIT, WalGuard
from ratchet.protocol.tracing import bind_context

__all__ = ["COMMIT_BUCKETS", "Writer", "LoopWriter", "ThreadWriter", "WriterStats", "make_writer",
           "open_connection"]

T = TypeVar("T")
Txn = Callable[[sqlite3.Connection], Any]
log = structlog.get_logger("ratchet.store.writer")

_STOP = object()
_WAKE = object()  # an urgent item is waiting in the urgent lane
_RESTART = object()  # (urgent lane) reset the WAL before the next batch


#: Upper bounds (seconds) of the commit latency histogram's buckets.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class WriterStats:
    batches: int = 0
    transactions: int = 0
    largest_batch: int = 0
    commit_seconds: list[float] = field(default_factory=list)  # last 10,000 batch durations
    #: Every batch's duration since the start, by COMMIT_BUCKETS (the last one: above them),
    #: and their sum: the commit latency histogram of a metrics scrape.
    commit_buckets: list[int] = field(default_factory=lambda: [0] * (len(COMMIT_BUCKETS) + 1))
    commit_sum: float = 0.0

    def record(self, size: int, seconds: float) -> None:
        self.batches += 1
        self.transactions += size
        self.largest_batch = max(self.largest_batch, size)
        self.commit_buckets[bisect.bisect_left(COMMIT_BUCKETS, seconds)] += 1
        self.commit_sum += seconds
        if len(self.commit_seconds) >= 10_000:
            del self.commit_seconds[:5_000]
        self.commit_seconds.append(seconds)


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


def _settle(settled: list[tuple[asyncio.Future[Any], tuple[bool, Any]]]) -> None:
    for fut, (ok, value) in settled:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _call_soon_threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
                          *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed meanwhile: nobody is waiting
        pass


class LoopWriter:
    """Group commit on the event-loop thread (for ``synchronous=NORMAL``).

    A batch blocks the loop while it runs; ``stats.commit_seconds`` records how long (the
    bench reports its p99). Checkpoints run on the WAL guard's thread; while it resets the
    WAL the writer holds (requests queue, the loop runs on) — see :mod:`persistence.wal`.
    """

    def __init__(self, path: str, synchronous: str = "NORMAL", max_batch: int = 128,
                 wal_limit: int = DEFAULT_WAL_LIMIT, wal: WalGuard | None = None) -> None:
        self._path = path
        self._synchronous = synchronous
        self._max_batch = max_batch
        self._pending: list[tuple[Txn, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._held_since: float | None = None  # set while the guard resets the WAL
        self._conn: sqlite3.Connection | None = None
        self.wal = wal or WalGuard(path, synchronous, wal_limit)
        self.stats = WriterStats()
        self.rescued: str | None = None

    def start(self) -> None:
        self._conn = open_connection(self._path, self._synchronous)
        self.wal.configure(self._conn)
        self.wal.start()

    def submit(self, fn: Callable[[sqlite3.Connection], T],
               urgent: bool = False) -> asyncio.Future[T]:
        """``urgent``: ahead of everything queued (lease renewals must not wait behind a
        flood of step commits)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        fn = bind_context(fn)  # the caller's span, for the events it writes (if tracing)
        if urgent:
            self._pending.insert(0, (fn, fut))
        else:
            self._pending.append((fn, fut))
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
        started = time.perf_counter()
        outcomes = execute_batch(self._conn, [fn for fn, _ in batch], self.wal.lost)
        self.stats.record(len(batch), time.perf_counter() - started)
        loop = asyncio.get_running_loop()
        todo = self.wal.after_commit()
        if todo == "restart":
            self.wal.prepare_restart(lambda: _call_soon_threadsafe(loop, self._hold, loop))
        elif todo == "hold":  # over the hard cap: no batch until the restart is done
            self._held_since = self._held_since or time.perf_counter()
        if self._pending:
            self._schedule(loop)
        _settle([(fut, outcome) for (_, fut), outcome in zip(batch, outcomes, strict=True)])

    def _hold(self, loop: asyncio.AbstractEventLoop) -> None:
        """Between two batches (we run on the loop): hold while the guard resets the WAL."""
        if self._conn is None:
            return  # stopped meanwhile
        self._held_since = self._held_since or time.perf_counter()
        self.wal.restart_soon(lambda: _call_soon_threadsafe(loop, self._resume, loop))

    def _resume(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._held_since is None:
            return
        self.wal.stats.record_hold(time.perf_counter() - self._held_since)
        self._held_since = None
        if self._pending:
            self._schedule(loop)

    def stop(self) -> None:
        """Run what is pending, close the connection. Idempotent."""
        if self._conn is None:
            return
        self.wal.stop()  # finishes a restart in progress: nothing holds the writer after
        self._held_since = None
        while self._pending:
            self._flush()
        conn, self._conn = self._conn, None
        self.rescued = close_connection(conn, self.wal, self._path)

    async def close(self) -> None:
        self.stop()


class ThreadWriter:
    """Group commit on a dedicated thread (for ``synchronous=FULL``)."""

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
            _call_soon_threadsafe(loop, _settle, settled)


def make_writer(path: str, synchronous: str, kind: str = "auto",
                wal_limit: int = DEFAULT_WAL_LIMIT) -> Writer:
    """The writer that suits the durability setting (see the module doc), or the ``kind``
    asked for: ``thread`` also suits several processes sharing the file, whose write locks
    would otherwise be waited for on the event loop."""
    if kind not in ("auto", "loop", "thread"):
        raise ValueError("writer must be auto, loop or thread")
    if kind == "thread" or (kind == "auto" and synchronous == "FULL"):
        return ThreadWriter(path, synchronous, wal_limit=wal_limit)
    return LoopWriter(path, synchronous, wal_limit=wal_limit)
