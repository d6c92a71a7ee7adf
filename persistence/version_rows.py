"""Tasks by workflow version: moving one task to another version (``admin migrate``) and
counting tasks per version (``ratchet versions``). The port the admin service uses
(:class:`VersionStore`, part of ``StorePort``) and the SQLite store's implementation of it
(:class:`VersionRows`, a mixin of ``Store``).

A migration is one task change (persistence/txns.py: compare-and-set on the task's
version, its ``task.migrated`` event, a checkpoint of the migrated state whose
``next_node`` is where it goes on, the new definition hash) plus the task's
``workflow_version``, in one transaction: a task is never on the new version without its
migrated state, nor the other way round.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ratchet.persistence.store_rows import _StoreParts
from ratchet.persistence.txns import ChangeResult, TaskChange, apply_change_txn

__all__ = ["TaskMigration", "VersionRows", "VersionStore", "migrate_task_txn"]


@dataclass(frozen=True, slots=True)
class TaskMigration:
    """``change`` (with ``expected_version``, a checkpoint and ``definition_hash``) moves
    the task to ``workflow_version``."""

    change: TaskChange
    workflow_version: int


def migrate_task_txn(conn: sqlite3.Connection, migration: TaskMigration) -> ChangeResult:
    """Apply the migration in the caller's transaction (raises as ``apply_change_txn``)."""
    change = migration.change
    if change.expected_version is None or change.checkpoint is None \
            or change.definition_hash is None:
        raise ValueError("a migration is a compare-and-set change with a checkpoint and a hash")
    result = apply_change_txn(conn, change)
    conn.execute("UPDATE tasks SET workflow_version = ? WHERE task_id = ?",
                 (migration.workflow_version, change.task_id))
    return result


@runtime_checkable
class VersionStore(Protocol):
    """Tasks by workflow version (docs/workflows.md, "Versions and changed code")."""

    async def migrate_task(self, migration: TaskMigration) -> ChangeResult:
        """Move one task to another workflow version, atomically (module doc).

        Raises:
            NotFound, VersionConflict: as ``apply``; nothing is written then.
        """
        ...

    async def version_counts(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's tasks counted by ``workflow``, ``version``, ``definition_hash`` and
        ``status`` (``count``), in that order."""
        ...


class VersionRows(_StoreParts):
    """:class:`VersionStore` on SQLite."""

    async def migrate_task(self, migration: TaskMigration) -> ChangeResult:
        task_id = migration.change.task_id
        result: ChangeResult = await self._writer.submit(
            self._fenced(task_id, lambda conn: migrate_task_txn(conn, migration)))
        self._announce(result.outbox)
        return result

    async def version_counts(self, tenant: str) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT workflow, workflow_version, definition_hash, status, COUNT(*) FROM tasks"
            " WHERE tenant = ? GROUP BY workflow, workflow_version, definition_hash, status"
            " ORDER BY workflow, workflow_version, definition_hash, status", (tenant,))
        return [{"workflow": r[0], "version": r[1], "definition_hash": r[2], "status": r[3],
                 "count": r[4]} for r in rows]
