"""How every Ratchet connection to the SQLite file is opened."""

from __future__ import annotations

import sqlite3

__all__ = ["open_connection"]


def open_connection(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection with the pragmas every Ratchet connection uses."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn
