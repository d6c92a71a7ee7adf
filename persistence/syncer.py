"""Durability for the loop writer under ``synchronous=FULL``: one ``fdatasync`` of the WAL
covers every batch committed since the previous one.

Why this is FULL: in WAL mode SQLite's ``FULL`` differs from ``NORMAL`` by one thing, a
sync of the WAL file after each commit's frames are written (with the unix VFS's default
``POWERSAFE_OVERWRITE`` no padding is written either way; checkpoints sync the WAL before
and the database after under both). So the writer's connection runs ``NORMAL`` — a commit
is a ``write()`` into the page cache, done on the loop — and this thread syncs the WAL
file afterwards. A commit is durable once a sync that *began after it* returned; Linux
syncs an inode's dirty pages whatever descriptor asks, and the WAL file is not replaced
while the writer's connection holds it open (it is reused from its start after a
checkpoint, same inode), which :meth:`WalSyncer._descriptor` checks anyway.

Group commit falls out: while one sync runs, every batch the loop commits waits for the
next, and one ``call_soon_threadsafe`` per sync hands all of them back. A caller that may
go on before durability (a step's commit, ``pipelined``) still has its events and acks
held until then: see persistence/writer.py and docs/operations.md (Durability).

A failed sync is not retried: after an ``fsync`` error the kernel may have dropped the
dirty pages and a second ``fsync`` can succeed without writing them ("fsyncgate"), so the
writer refuses every later batch and nothing waiting is ever reported durable.

``sync`` is injectable (a test holds it to check that nothing leaves before durability;
no sleeps); the default is :func:`os.fdatasync`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from ratchet.persistence.commit_stats import WriterStats

__all__ = ["WalSyncer", "Waiter"]

log = structlog.get_logger("ratchet.store.syncer")

#: Called on the loop once its batch is durable (None) or can never be (the sync's error).
Waiter = Callable[[BaseException | None], None]


class WalSyncer:
    """Counts the loop's committed batches and syncs the WAL on its own thread.

    Loop side (not thread-safe, call on the loop): :meth:`committed_batch` after each
    COMMIT, :meth:`when_synced` to run a callback once a batch is durable. The thread only
    reads ``committed`` (an int the GIL publishes whole) and replies through
    ``call_soon_threadsafe``.
    """

    def __init__(self, db_path: str, sync: Callable[[int], None] = os.fdatasync,
                 stats: WriterStats | None = None) -> None:
        self.wal_path = db_path + "-wal"
        self.sync_fn = sync
        self.committed = 0  # batches committed, on the loop
        self.synced = 0  # batches durable, as far as the loop knows
        self.failed: BaseException | None = None
        self.stats = stats or WriterStats()  # the writer's: record_sync
        self._issued = 0  # the thread's: batches covered by its last sync
        self._waiters: collections.deque[tuple[int, Waiter]] = collections.deque()
        #: Held while the thread has nothing to do: the loop wakes it by releasing it (a
        #: plain lock's release, not threading.Event's Python-level Condition: this runs at
        #: every batch, ~4 % of a step's loop time with the Event).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._stopping = False
        self._fd: int | None = None
        self._ino: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the loop's side -----------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="ratchet-wal-sync", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> bool:
        """Batches committed that are not known durable yet."""
        return self.synced < self.committed

    def committed_batch(self) -> int:
        """Note one more committed batch (its frames written); returns its number."""
        self.committed += 1
        self._wake_thread()
        return self.committed

    def _wake_thread(self) -> None:
        # Only the loop releases and only the thread acquires: once seen locked it stays
        # so until released here. Unlocked means a wake-up is pending already.
        if self._wake.locked():
            self._wake.release()

    def when_synced(self, batch: int, callback: Waiter) -> None:
        """Run ``callback(None)`` on the loop once batch number ``batch`` is durable (at
        once if it is; ``callback(error)`` if it never will be). Callbacks run in the order
        of their batches."""
        if self.failed is not None:
            callback(self.failed)
        elif batch <= self.synced:
            callback(None)
        else:
            self._waiters.append((batch, callback))

    def stop(self) -> None:
        """Join the thread, sync what is left on the caller's thread and run every waiter
        (the caller is on the loop). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            self._stopping = True
            self._wake_thread()
            self._thread.join()
        if self.failed is None and self.pending:
            try:
                self._sync_now(self.committed - self._issued)
            except OSError as exc:
                self._fail(exc)
                return
            self._synced(self.committed)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.acquire()  # until the loop releases it (at once if it has already)
            if self._stopping:
                return
            target = self.committed  # every batch counted here had written its frames
            if target <= self._issued:
                continue
            try:
                self._sync_now(target - self._issued)  # the GIL is released meanwhile
            except OSError as exc:
                log.critical("WAL sync failed; the store accepts no more writes",
                             error=repr(exc))
                self._reply(self._fail, exc)
                return
            self._issued = target
            self._reply(self._synced, target)

    def _sync_now(self, batches: int = 0) -> None:
        started = time.perf_counter()
        self.sync_fn(self._descriptor())
        self.stats.record_sync(batches, time.perf_counter() - started)

    def _descriptor(self) -> int:
        """The WAL file's descriptor, opened once (and the directory synced then: the
        file's name must survive a crash too); opened again should the file at the path
        ever be a different one."""
        ino: int | None
        try:
            ino = os.stat(self.wal_path).st_ino
        except FileNotFoundError:
            # Deleted under us: SQLite goes on writing into the inode it holds open, so that
            # is what to sync; what a vanished file means is file_watch.py's to decide (it
            # rescues the data at close), not a reason to fail every commit now.
            ino = self._ino if self._fd is not None else None
        if self._fd is None or ino != self._ino:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.wal_path, os.O_RDONLY)
            self._ino = os.fstat(self._fd).st_ino
            directory = os.open(os.path.dirname(os.path.abspath(self.wal_path)), os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return self._fd

    def _reply(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile: nobody is waiting
            pass

    # -- back on the loop ----------------------------------------------------------------

    def _synced(self, target: int) -> None:
        self.synced = max(self.synced, target)
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.synced:
            waiters.popleft()[1](None)

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        while self._waiters:  # never durable: never announced, never acked
            self._waiters.popleft()[1](exc)
