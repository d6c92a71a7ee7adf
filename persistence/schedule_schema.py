"""The DDL of the ``schedules`` table (migration 15 in persistence/schema.py; its rows:
persistence/schedule_rows.py), kept apart so that schema.py stays a readable size."""

from __future__ import annotations

__all__ = ["SCHEDULES_DDL"]

SCHEDULES_DDL = """
    -- A schedule submits one task of its workflow per tick (protocol/schedules.py).
    CREATE TABLE schedules (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        workflow TEXT NOT NULL,
        workflow_version INTEGER,
        input BLOB NOT NULL,          -- sealed like a task's input
        spec BLOB NOT NULL,           -- msgpack: cron or every, timezone, missed, catch_up
        deadline_s REAL,
        paused INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,        -- the first tick not yet fired
        last_tick REAL,
        last_task_id TEXT,
        last_error TEXT,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (tenant, name)
    ) WITHOUT ROWID;
    CREATE INDEX schedules_due ON schedules(next_at) WHERE paused = 0;
"""
