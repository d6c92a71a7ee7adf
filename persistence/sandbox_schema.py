"""The DDL of migration 21 (persistence/schema.py): ``tasks.sandbox``, the marks of a
sandbox fork (persistence/sandbox_rows.py), kept with the task so that a fork recovered on
any node after any restart is still a sandbox."""

from __future__ import annotations

__all__ = ["SANDBOX_DDL"]

# NULL for every task but a sandbox fork: a packed map {source, lineage, reuse_model}. Read
# with the task row by every write transaction (its events' subjects), so no join, no index.
SANDBOX_DDL = "ALTER TABLE tasks ADD COLUMN sandbox BLOB"
