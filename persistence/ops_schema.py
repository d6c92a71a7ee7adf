"""The DDL of migration 18 (persistence/schema.py): step heartbeats, indexes that let
``admin diagnose`` read one task's timers and waits without a scan, and dead letters kept
with their original headers and their replays (rows: persistence/diagnose_rows.py and
persistence/dead_letter_rows.py), kept apart so that schema.py stays a readable size."""

from __future__ import annotations

__all__ = ["OPS_DDL"]

OPS_DDL = """
    -- The latest ctx.heartbeat of a task's running step ('' scope) or of one fan-out branch
    -- of it (scope = the branch): written without a checkpoint, at most once a second.
    CREATE TABLE step_heartbeats (
        task_id TEXT NOT NULL,
        scope TEXT NOT NULL,
        step TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        fraction REAL,                -- 0..1 of the step done, as the step said
        note TEXT,
        owner TEXT NOT NULL,          -- the node whose step beat
        at REAL NOT NULL,
        PRIMARY KEY (task_id, scope)
    ) WITHOUT ROWID;
    CREATE INDEX timers_by_task ON timers(task_id) WHERE fired_at IS NULL;
    CREATE INDEX waits_by_task ON waits(task_id) WHERE resolved_at IS NULL;
    CREATE INDEX actions_open_by_task ON actions(task_id)
        WHERE status NOT IN ('SUCCEEDED', 'FAILED', 'COMPENSATED');
    -- Dead letters: which DLQ subject (and so which tenant) they went to, the original
    -- message's headers, their size (the table is bounded in bytes and rows), and replays.
    ALTER TABLE dead_letters ADD COLUMN dlq_subject TEXT NOT NULL DEFAULT '';
    ALTER TABLE dead_letters ADD COLUMN tenant TEXT NOT NULL DEFAULT '_system';
    ALTER TABLE dead_letters ADD COLUMN headers BLOB;
    ALTER TABLE dead_letters ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE dead_letters ADD COLUMN replay_of INTEGER;
    ALTER TABLE dead_letters ADD COLUMN replays INTEGER NOT NULL DEFAULT 0;
    UPDATE dead_letters SET size = length(raw);
    CREATE INDEX dead_letters_by_tenant ON dead_letters(tenant, id);
    -- what the trim sums at every new letter: read from this index, not the raw rows
    CREATE INDEX dead_letters_sizes ON dead_letters(id, size)
"""
