"""Keeps SQLite's write-ahead log bounded under any steady load.

Why the WAL grew without bound (measured in a soak at 150 tasks/s): SQLite starts writing
the WAL from its beginning again only when a writer opens a transaction while *every*
frame has been copied back into the database and no reader is inside the WAL. Our
checkpointer ran ``PASSIVE`` checkpoints on its own thread beside the writer; each one
completed (``log == checkpointed``) for the frames that existed when it began, but the
writer had appended more by the time it finished, so no transaction ever began on a fully
checkpointed WAL. The file grew by ~40 MB/s, and the WAL index (``-shm``, mapped into the
process) grew with it — most of the node's rising RSS.

What bounds it now:

- the guard thread keeps running ``PASSIVE`` checkpoints beside the writer (every
  ``passive_interval``), so the database never falls far behind the WAL;
- after each group commit the writer asks :meth:`WalGuard.after_commit`: once the WAL
  file reaches ``limit_bytes`` a restart begins. Its first phase is one more ``PASSIVE``
  checkpoint while writes go on; then the writer *holds* (starts no batch) while a
  ``RESTART`` checkpoint copies the few frames appended meanwhile, waits for readers
  still inside the WAL (our reads are single calls, so microseconds; new reads of this
  process wait for the restart, so a steady stream of them cannot starve it), and
  makes the next commit write the WAL from its beginning again. The hold lasts
  milliseconds and is measured (``hold_max_ms``). Should the
  WAL reach one and a half times the limit before the first phase ends, the writer holds
  at once: that
  is the hard cap;
- a restart that cannot complete (a reader — another process — keeps an old snapshot past
  ``busy_ms``) lets the writer go on and is retried with a doubling delay, logged as a
  warning with the WAL's size: the file can outgrow the limit only while someone else holds
  a read snapshot open.

The WAL file is reused, not truncated: a commit that overwrites blocks of an existing file
costs one ``fdatasync``, while one that extends the file also commits the file system's
journal (its size changed). Truncating to zero at each restart was measured to hurt
``FULL``: commit p99 24 ms against 9 ms reusing the file, and e2e p99 rising from 138 to
482 ms over a ten-minute soak, where it now stays flat. So
the file stays at about the limit (``journal_size_limit`` trims it there when a reset
finds it larger), and the fill level is read from the WAL index: ``mxFrame``, the last
valid frame, at byte 16 of the ``-shm`` file's header (SQLite's documented WAL-index
format). Closing the store truncates the file to zero.

One checkpoint runs at a time in a process (SQLite refuses a second one with BUSY rather
than waiting), so every checkpoint here takes :attr:`WalGuard.lock`.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from ratchet.persistence.connection import open_connection
from ratchet.persistence.file_watch import FileWatch

__all__ = ["CheckpointResult", "WalGuard", "WalStats", "DEFAULT_WAL_LIMIT"]

log = structlog.get_logger("ratchet.store.wal")

#: The WAL size at which a restart begins. Each restart holds the writer for a few ms (two
#: fsyncs), and every task committing meanwhile waits: measured at 150 tasks/s (~40 MB/s of
#: WAL), 16 MB meant 2.6 holds a second and minute p99s of 74-134 ms; 32 MB, 1.4 a second
#: and 42-45 ms. The hard cap (1.5x) keeps the file under 48 MB.
DEFAULT_WAL_LIMIT = 32 * 1024 * 1024


@dataclass
class CheckpointResult:
    """One ``PRAGMA wal_checkpoint``: its mode, SQLite's three figures, and its cost."""

    mode: str
    busy: bool  # SQLite could not finish (readers or another checkpoint in the way)
    log_frames: int
    checkpointed_frames: int
    wal_bytes_before: int
    seconds: float
    at: float  # wall time it ended


@dataclass
class WalStats:
    wal_bytes: int = 0  # frames in use (from the WAL index) as last seen after a commit
    wal_peak_bytes: int = 0  # the largest fill level, and so the largest file size
    passive_checkpoints: int = 0
    restarts: int = 0  # RESTART checkpoints after which the next commit starts the WAL over
    restart_failures: int = 0
    holds: int = 0
    hold_seconds_total: float = 0.0
    hold_max_seconds: float = 0.0
    last: CheckpointResult | None = None
    last_restart: CheckpointResult | None = None

    def record_hold(self, seconds: float) -> None:
        self.holds += 1
        self.hold_seconds_total += seconds
        self.hold_max_seconds = max(self.hold_max_seconds, seconds)

    def summary(self) -> dict[str, Any]:
        """Flat figures for a log line or a metric."""
        return {
            "wal_mb": round(self.wal_bytes / 1e6, 2),
            "wal_peak_mb": round(self.wal_peak_bytes / 1e6, 2),
            "passive_checkpoints": self.passive_checkpoints, "restarts": self.restarts,
            "restart_failures": self.restart_failures, "holds": self.holds,
            "hold_max_ms": round(self.hold_max_seconds * 1000, 2),
            "last_checkpoint": None if self.last is None else asdict(self.last),
        }


@dataclass
class _Backoff:
    """Doubling delay between restart attempts that failed."""

    base: float = 0.1
    cap: float = 5.0
    failures: int = 0
    not_before: float = 0.0

    def failed(self, now: float) -> float:
        self.failures += 1
        delay = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 16))
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = 0.0


_Job = Callable[[sqlite3.Connection], None]  # runs on the guard thread, on its connection
_STOP = object()


class WalGuard:
    """The WAL's bound and the thread that checkpoints it (see the module doc).

    A restart has two phases so that the writer holds as briefly as possible: first a
    ``PASSIVE`` checkpoint while writes go on (:meth:`prepare_restart`), then, with the
    writer holding, a ``RESTART`` that copies only what was appended meanwhile
    (:meth:`restart` on the writer's thread, or :meth:`restart_soon` on the guard's).

    Args:
        path: the database file (the WAL is ``path + "-wal"``).
        limit_bytes: the WAL size at which a restart begins.
        passive_interval: seconds between background ``PASSIVE`` checkpoints.
        busy_ms: how long a restart waits for readers before giving up this time.
        summary_interval: seconds between the info log lines with :meth:`WalStats.summary`.
    """

    def __init__(self, path: str, synchronous: str, limit_bytes: int = DEFAULT_WAL_LIMIT,
                 passive_interval: float = 0.25, busy_ms: int = 1000,
                 summary_interval: float = 60.0) -> None:
        if limit_bytes < 64 * 1024:
            raise ValueError("limit_bytes must be at least 64 KiB")
        self.path = path
        self.wal_path = path + "-wal"
        self.shm_path = path + "-shm"
        self._shm_fd: int | None = None
        self._frame_bytes = 4096 + 24  # page + frame header; the real page size at start()
        self._synchronous = synchronous
        self.limit_bytes = limit_bytes
        self._passive_interval = passive_interval
        self._busy_ms = busy_ms
        self._summary_interval = summary_interval
        self.stats = WalStats()
        self.lock = threading.Lock()  # one checkpoint at a time in this process
        self._backoff = _Backoff()
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._restarting = False  # from prepare_restart until the restart's result
        #: Cleared while a restart waits for readers: new reads of this process wait for
        #: it (Store._rows), so a steady stream of them cannot starve the restart.
        self.reads_open = threading.Event()
        self.reads_open.set()
        self._thread = threading.Thread(target=self._run, name="ratchet-wal-guard", daemon=True)
        #: Compares the open database file with its path once a second (file_watch.py).
        self.watch: FileWatch | None = None
        self.watch_interval = 1.0
        #: Called once, on the guard thread, with the reason the file was lost.
        self.on_lost: list[Callable[[str], None]] = []

    # -- the writer's side ------------------------------------------------------------

    def configure(self, conn: sqlite3.Connection) -> None:
        """Pragmas for the writing connection: no automatic checkpoints (the guard runs
        them), and a WAL reset trims a larger file to the limit."""
        self._frame_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0]) + 24
        # The file only grows when the WAL's fill level passes its end, so after this one
        # look (a WAL left by a crash) the peak fill level is the peak file size too.
        self.stats.wal_peak_bytes = max(self.stats.wal_peak_bytes, self.wal_size())
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(f"PRAGMA journal_size_limit={self.limit_bytes}")

    @property
    def restarting(self) -> bool:
        """From :meth:`prepare_restart` until the restart's result."""
        return self._restarting

    def after_commit(self) -> str:
        """Called by the writer after each commit. Returns what it must do:

        - ``"restart"``: the WAL reached the limit; call :meth:`prepare_restart`;
        - ``"hold"``: a restart is under way but the WAL reached 1.5x the limit before
          its first phase ended (writes outran the passive checkpoint): hold now;
        - ``""``: nothing (below the limit, or a failed restart is backing off).
        """
        size = self.wal_used()
        self.stats.wal_bytes = size
        if size > self.stats.wal_peak_bytes:
            self.stats.wal_peak_bytes = size
        if size < self.limit_bytes or time.monotonic() < self._backoff.not_before:
            return ""
        if not self._restarting:
            return "restart"
        return "hold" if size >= self.limit_bytes * 3 // 2 else ""

    def prepare_restart(self, then: Callable[[], None]) -> None:
        """Phase one, on the guard thread: a ``PASSIVE`` checkpoint while writes go on;
        then ``then()`` (there), which makes the writer hold and ask for phase two."""
        self._restarting = True
        self._put(self._passive, then)

    def restart(self, conn: sqlite3.Connection) -> CheckpointResult:
        """Phase two on the caller's thread: reset the WAL on ``conn``, a connection with
        no transaction open whose writer starts none meanwhile."""
        previous = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        self.reads_open.clear()
        try:
            result = self._checkpoint(conn, "RESTART")
        finally:
            self.reads_open.set()
            conn.execute(f"PRAGMA busy_timeout={int(previous)}")
            self._restarting = False
        self._after_restart(result)
        return result

    def restart_soon(self, on_done: Callable[[], None]) -> None:
        """Phase two on the guard thread (for a writer on the event loop, which holds its
        batches meanwhile); ``on_done()`` is called there afterwards."""
        self._put(self.restart, on_done)

    def _put(self, work: Callable[[sqlite3.Connection], Any], then: Callable[[], None]) -> None:
        """Queue ``work`` for the guard thread, ``then()`` after it whatever happens (the
        writer waiting on it must never be left holding)."""

        def job(conn: sqlite3.Connection) -> None:
            try:
                work(conn)
            finally:
                then()

        self._jobs.put(job)

    # -- the guard thread -------------------------------------------------------------

    @property
    def lost(self) -> str | None:
        """Why the database file is no longer the one at its path, once noticed."""
        return None if self.watch is None else self.watch.lost

    def start(self) -> None:
        self.watch = FileWatch(self.path)
        self._thread.start()

    def stop(self) -> None:
        """Finish the jobs asked for and join the thread (the writer truncates the WAL
        after its last commit)."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join()
        if self._shm_fd is not None:
            os.close(self._shm_fd)
            self._shm_fd = None
        if self.watch is not None:
            self.watch.close()

    def _run(self) -> None:
        conn = open_connection(self.path, self._synchronous)
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        next_summary = time.monotonic() + self._summary_interval
        next_watch = time.monotonic() + self.watch_interval
        try:
            while True:
                if time.monotonic() >= next_watch:
                    next_watch = time.monotonic() + self.watch_interval
                    self._check_file()
                try:
                    job = self._jobs.get(timeout=self._passive_interval)
                except queue.Empty:
                    job = self._passive
                if job is _STOP:
                    break
                try:
                    job(conn)
                except Exception as exc:  # a callback failed: the guard must go on
                    log.error("wal guard job failed", error=repr(exc))
                if time.monotonic() >= next_summary:
                    next_summary = time.monotonic() + self._summary_interval
                    log.info("wal", **self.stats.summary())
        finally:
            conn.close()

    def _check_file(self) -> None:
        if self.watch is None or self.watch.lost is not None:
            return
        try:
            reason = self.watch.check()
        except OSError as exc:  # the descriptor itself failed: nothing to compare
            log.warning("database file check failed", error=repr(exc))
            return
        if reason is None:
            return
        log.critical("database file lost; refusing every write", reason=reason, path=self.path)
        for callback in self.on_lost:
            try:
                callback(reason)
            except Exception as exc:  # one listener failing must not hide it from the rest
                log.error("file-lost listener failed", error=repr(exc))

    def _passive(self, conn: sqlite3.Connection) -> None:
        if self.wal_used() == 0:
            return
        try:
            self._checkpoint(conn, "PASSIVE")
            self.stats.passive_checkpoints += 1
        except sqlite3.Error as exc:  # the database is busy or failing: try at the next tick
            log.warning("wal checkpoint failed", mode="PASSIVE", error=repr(exc))

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> CheckpointResult:
        before = self.wal_size()
        started = time.perf_counter()
        with self.lock:
            try:
                busy, frames, done = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            except sqlite3.OperationalError as exc:  # locked past the busy timeout
                log.debug("wal checkpoint refused", mode=mode, error=repr(exc))
                busy, frames, done = 1, -1, -1
        result = CheckpointResult(mode, bool(busy), frames, done, before,
                                  time.perf_counter() - started, time.time())
        self.stats.last = result
        return result

    def _after_restart(self, result: CheckpointResult) -> None:
        self.stats.last_restart = result
        if not result.busy:
            self.stats.restarts += 1
            self._backoff.succeeded()
            self.stats.wal_bytes = 0  # the next commit writes from the WAL's start
            log.debug("wal restarted", **asdict(result))
            return
        self.stats.restart_failures += 1
        delay = self._backoff.failed(time.monotonic())
        log.warning("wal restart blocked (a reader holds an old snapshot); writers go on",
                    wal_mb=round(result.wal_bytes_before / 1e6, 1), retry_in_s=delay,
                    failures=self._backoff.failures)

    def wal_used(self) -> int:
        """Bytes of the WAL in use: ``mxFrame`` from the WAL-index header, times the frame
        size. The index is open for as long as the writer's connection (which keeps the
        file in place); one ``pread`` per commit, about a microsecond."""
        if self._shm_fd is None:
            try:
                self._shm_fd = os.open(self.shm_path, os.O_RDONLY)
            except FileNotFoundError:
                return 0
        header = os.pread(self._shm_fd, 20, 0)
        if len(header) < 20:
            return 0
        (max_frame,) = struct.unpack_from("=I", header, 16)  # native byte order, by format
        return int(max_frame) * self._frame_bytes

    def wal_size(self) -> int:
        """Bytes of the WAL file on disk (at least :meth:`wal_used`)."""
        try:
            return os.stat(self.wal_path).st_size
        except FileNotFoundError:
            return 0
