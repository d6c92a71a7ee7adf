"""The DDL of the ``reconcile_passes`` table (migration 16 in persistence/schema.py; its
rows: persistence/drift_rows.py), kept apart so that schema.py stays a readable size."""

from __future__ import annotations

__all__ = ["RECONCILE_DDL"]

RECONCILE_DDL = """
    -- When a workflow's drift reconciliation (actors/workflow/reconcile.py) next runs over
    -- one partition's effects: the node holding the partition runs it, then moves it on.
    CREATE TABLE reconcile_passes (
        workflow TEXT NOT NULL,
        partition INTEGER NOT NULL,
        next_at REAL NOT NULL,        -- the next pass is due at
        last_pass REAL,               -- when the last one ran
        checked INTEGER NOT NULL DEFAULT 0,   -- effects it compared
        drifted INTEGER NOT NULL DEFAULT 0,   -- of which had drifted
        PRIMARY KEY (workflow, partition)
    ) WITHOUT ROWID;
"""
