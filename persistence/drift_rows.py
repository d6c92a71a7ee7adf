"""Drift reconciliation rows (migration 16, persistence/drift_schema.py): the port the
drift service uses (:class:`DriftStore`, part of ``StorePort``) and the SQLite store's
implementation of it (:class:`DriftRows`, a mixin of ``Store``).

A pass's progress is one column, ``next_at`` per (workflow, partition), moved forward by
compare-and-set (:meth:`DriftRows.advance_reconcile`), so a pass that ran is not run again
after a restart or by the partition's next owner before it is due; two nodes that both
believed they held the partition may both run it, which only compares twice (the drift
event is recorded twice at worst: it changes nothing else).
"""

from __future__ import annotations

import sqlite3
from typing import Protocol, runtime_checkable

from ratchet.persistence.ledger import ACTION_COLUMNS, ActionRecord, action_record
from ratchet.persistence.store_rows import _StoreParts

__all__ = ["DriftRows", "DriftStore"]

_ACTIONS = ", ".join(f"a.{c.strip()}" for c in ACTION_COLUMNS.split(","))


@runtime_checkable
class DriftStore(Protocol):
    """What the drift service reads and moves on."""

    async def reconcile_due(self, workflow: str, partition: int, first_at: float) -> float:
        """When the workflow's next pass over the partition is due (``first_at`` recorded
        the first time it is asked)."""
        ...

    async def advance_reconcile(self, workflow: str, partition: int, due: float,
                                next_at: float, now: float, checked: int, drifted: int) -> bool:
        """Move the pass that was ``due`` on to ``next_at`` with its figures; False when
        another pass moved it first (compare-and-set)."""
        ...

    async def succeeded_writes(self, workflow: str, limit: int = 10_000) -> list[ActionRecord]:
        """The workflow's tasks' writes that succeeded (not compensations), oldest first."""
        ...


class DriftRows(_StoreParts):
    """:class:`DriftStore` on SQLite."""

    async def reconcile_due(self, workflow: str, partition: int, first_at: float) -> float:
        def txn(conn: sqlite3.Connection) -> float:
            conn.execute("INSERT OR IGNORE INTO reconcile_passes(workflow, partition, next_at)"
                         " VALUES (?,?,?)", (workflow, partition, first_at))
            row = conn.execute("SELECT next_at FROM reconcile_passes WHERE workflow = ?"
                               " AND partition = ?", (workflow, partition)).fetchone()
            return float(row[0])

        due: float = await self._writer.submit(txn)
        return due

    async def advance_reconcile(self, workflow: str, partition: int, due: float,
                                next_at: float, now: float, checked: int, drifted: int) -> bool:
        def txn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE reconcile_passes SET next_at = ?, last_pass = ?, checked = ?,"
                " drifted = ? WHERE workflow = ? AND partition = ? AND next_at = ?",
                (next_at, now, checked, drifted, workflow, partition, due))
            return cur.rowcount == 1

        moved: bool = await self._writer.submit(txn)
        return moved

    async def succeeded_writes(self, workflow: str, limit: int = 10_000) -> list[ActionRecord]:
        rows = await self._rows(
            f"SELECT {_ACTIONS} FROM actions a JOIN tasks t ON t.task_id = a.task_id"
            " WHERE t.workflow = ? AND a.kind = 'write' AND a.status = 'SUCCEEDED'"
            " AND a.compensates IS NULL ORDER BY a.created_at LIMIT ?", (workflow, limit))
        return [action_record(r, self.secrets.unpack_optional) for r in rows]
