"""The WAL stays bounded under steady writes with reads always running beside them."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from ratchet.persistence.connection import open_connection
from ratchet.persistence.store import Store
from ratchet.persistence.wal import WalGuard
from ratchet.persistence.writer import LoopWriter

LIMIT = 512 * 1024
ROW = os.urandom(3000)


def _create_table(path: str) -> None:
    conn = open_connection(path, "NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, data BLOB)")
    conn.close()


def _insert(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO rows (data) VALUES (?)", (ROW,))


def _wal_size(path: str) -> int:
    try:
        return os.stat(path + "-wal").st_size
    except FileNotFoundError:
        return 0


async def _reads_until(store: Store, stop: asyncio.Event) -> int:
    """Reads back to back through the store (as the node's actors read), until ``stop``."""
    reads = 0
    while not stop.is_set():
        await store.events("t-none")
        reads += 1
    return reads


@pytest.mark.parametrize(("synchronous", "writer"), [
    ("NORMAL", "auto"), ("FULL", "auto"), ("FULL", "thread")])  # loop (+ syncer), thread
async def test_the_wal_stays_under_its_limit_while_reads_and_writes_never_pause(
    tmp_path: Path, synchronous: str, writer: str
) -> None:
    path = str(tmp_path / "wal.db")
    _create_table(path)
    store = await Store.open(path, synchronous, writer, wal_limit=LIMIT)
    stop = asyncio.Event()
    readers = [asyncio.create_task(_reads_until(store, stop)) for _ in range(3)]
    largest = 0
    try:
        for _ in range(400):  # ~5 MB of rows, ten times the limit, in batches of 4
            await asyncio.gather(*(store.run_txn(_insert) for _ in range(4)))
            largest = max(largest, _wal_size(path))
    finally:
        stop.set()
        reads = sum(await asyncio.gather(*readers))
        stats = store.wal_stats
        await store.close()
    assert reads > 100
    assert stats.restarts >= 3
    assert stats.restart_failures == 0, stats
    # The hard cap is 1.5x the limit; a batch may land on top of it before the hold.
    assert largest < LIMIT * 3 // 2 + 128 * 1024, stats
    assert stats.wal_peak_bytes < LIMIT * 3 // 2 + 128 * 1024
    assert stats.hold_max_seconds < 1.0
    assert _wal_size(path) == 0  # a clean close truncates it


async def test_a_reader_holding_an_old_snapshot_delays_the_restart_but_never_the_writes(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "wal.db")
    _create_table(path)
    guard = WalGuard(path, "NORMAL", limit_bytes=LIMIT, passive_interval=0.01, busy_ms=20)
    writer = LoopWriter(path, "NORMAL", wal=guard)
    writer.start()
    holder = open_connection(path, "NORMAL")
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM rows").fetchall()  # a snapshot, kept open
        rows = 0
        for _ in range(100):  # twice the limit: every restart attempt is refused
            await asyncio.gather(*(writer.submit(_insert) for _ in range(4)))
            rows += 4
        assert guard.stats.restart_failures >= 1
        assert guard.stats.restarts == 0
        assert _wal_size(path) > LIMIT
        holder.execute("COMMIT")  # the snapshot is let go: the WAL starts over again
        for _ in range(200):
            await asyncio.gather(*(writer.submit(_insert) for _ in range(4)))
            rows += 4
            if guard.wal_used() < LIMIT // 2:
                break
            await asyncio.sleep(0.01)  # the retry backs off in wall time (0.1 s, 0.2 s, ...)
        assert guard.wal_used() < LIMIT // 2
    finally:
        holder.close()
        await writer.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM rows").fetchone()[0] == rows  # none lost
    conn.close()


def test_a_wal_limit_below_64_kib_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="64 KiB"):
        WalGuard(str(tmp_path / "x.db"), "NORMAL", limit_bytes=1024)
