"""Applying the schema's migrations (persistence/schema.py) to a database file."""

from __future__ import annotations

import sqlite3
import time

from ratchet.persistence.schema import MIGRATIONS

__all__ = ["MIGRATIONS", "migrate", "schema_version"]


def schema_version(conn: sqlite3.Connection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration newer than the database's; returns the resulting version.

    Runs under ``BEGIN IMMEDIATE`` so two processes opening one file migrate once.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(conn)
        for version, name, sql in MIGRATIONS:
            if version <= current:
                continue
            for statement in sql.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                (version, name, time.time()),
            )
            current = version
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return current
