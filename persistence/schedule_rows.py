"""Schedule rows (migration 15, persistence/schedule_schema.py): the port the schedule
service and the admin verbs use (:class:`ScheduleStore`, part of ``StorePort``) and the
SQLite store's implementation of it (:class:`ScheduleRows`, a mixin of ``Store``).

A schedule's progress is one column, ``next_at`` (its first tick not yet fired), moved
forward by compare-and-set (:meth:`ScheduleRows.advance_schedule`): two nodes that fire
the same tick both submit it under the same idempotency key, one task is created, and
only one of them moves the schedule on. Not fenced: the tick's task is what matters, and
its key makes it exactly one.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgpack

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.store_rows import _StoreParts

__all__ = ["ScheduleRow", "ScheduleRows", "ScheduleStore"]

_COLUMNS = ("tenant, name, workflow, workflow_version, input, spec, deadline_s, paused,"
            " next_at, last_tick, last_task_id, last_error, created_by, created_at, updated_at")


@dataclass
class ScheduleRow:
    """One schedule. ``input`` holds the task input as the workflow parsed it (its
    ``SecretStr`` fields sealed at rest); ``spec`` is ``ScheduleSpec.as_dict()``."""

    tenant: str
    name: str
    workflow: str
    workflow_version: int | None
    input: dict[str, Any]
    spec: dict[str, Any]
    next_at: float
    created_by: str
    created_at: float
    deadline_s: float | None = None
    paused: bool = False
    last_tick: float | None = None
    last_task_id: str | None = None
    last_error: str | None = None
    updated_at: float = field(default=0.0)

    def shown(self, redact: Any) -> dict[str, Any]:
        """The row as the admin verbs answer it (``redact``: how its input is shown)."""
        return {"name": self.name, "workflow": self.workflow,
                "workflow_version": self.workflow_version, "input": redact(self.input),
                **{k: v for k, v in self.spec.items() if v is not None and k != "anchor"},
                "deadline_s": self.deadline_s, "paused": self.paused, "next_at": self.next_at,
                "last_tick": self.last_tick, "last_task_id": self.last_task_id,
                "last_error": self.last_error, "created_by": self.created_by,
                "created_at": self.created_at}


@runtime_checkable
class ScheduleStore(Protocol):
    """Schedules: the admin verbs create, list, pause and delete them; the schedule
    service reads the due ones and moves each forward after firing its ticks."""

    async def create_schedule(self, row: ScheduleRow) -> bool:
        """Insert; False (nothing written) when the tenant has a schedule of that name."""
        ...

    async def schedule(self, tenant: str, name: str) -> ScheduleRow | None:
        ...

    async def schedules(self, tenant: str) -> list[ScheduleRow]:
        """The tenant's schedules, by name."""
        ...

    async def delete_schedule(self, tenant: str, name: str) -> bool:
        ...

    async def pause_schedule(self, tenant: str, name: str, paused: bool, next_at: float,
                             now: float) -> bool:
        """Pause or resume (then from ``next_at``); False when there is no such schedule."""
        ...

    async def due_schedules(self, now: float, limit: int = 100) -> list[ScheduleRow]:
        """Schedules not paused whose next tick is at or before ``now``, earliest first."""
        ...

    async def next_schedule_due(self) -> float | None:
        """The earliest ``next_at`` of a schedule not paused."""
        ...

    async def advance_schedule(self, row: ScheduleRow, next_at: float, now: float) -> bool:
        """Move ``row`` on to ``next_at`` with its ``last_*`` fields, only if its ``next_at``
        is still the one read (compare-and-set); False when another pass moved it first."""
        ...


def _row(r: Any, unpack: Any) -> ScheduleRow:
    return ScheduleRow(
        tenant=r[0], name=r[1], workflow=r[2], workflow_version=r[3], input=dict(unpack(r[4])),
        spec=dict(_unpack(r[5]) or {}), deadline_s=r[6], paused=bool(r[7]), next_at=r[8],
        last_tick=r[9], last_task_id=r[10], last_error=r[11], created_by=r[12],
        created_at=r[13], updated_at=r[14])


class ScheduleRows(_StoreParts):
    """:class:`ScheduleStore` on SQLite."""

    async def create_schedule(self, row: ScheduleRow) -> bool:
        packed = self.secrets.pack(row.input)  # SecretStr fields sealed, as a task's input

        def txn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                f"INSERT OR IGNORE INTO schedules({_COLUMNS})"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.tenant, row.name, row.workflow, row.workflow_version, packed,
                 msgpack.packb(row.spec), row.deadline_s, int(row.paused), row.next_at,
                 None, None, None, row.created_by, row.created_at, row.created_at))
            return cur.rowcount == 1

        created: bool = await self._writer.submit(txn)
        return created

    async def schedule(self, tenant: str, name: str) -> ScheduleRow | None:
        r = await self._row(f"SELECT {_COLUMNS} FROM schedules WHERE tenant = ? AND name = ?",
                            (tenant, name))
        return None if r is None else _row(r, self.secrets.unpack)

    async def schedules(self, tenant: str) -> list[ScheduleRow]:
        rows = await self._rows(f"SELECT {_COLUMNS} FROM schedules WHERE tenant = ?"
                                " ORDER BY name", (tenant,))
        return [_row(r, self.secrets.unpack) for r in rows]

    async def delete_schedule(self, tenant: str, name: str) -> bool:
        def txn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM schedules WHERE tenant = ? AND name = ?",
                               (tenant, name))
            return cur.rowcount == 1

        deleted: bool = await self._writer.submit(txn)
        return deleted

    async def pause_schedule(self, tenant: str, name: str, paused: bool, next_at: float,
                             now: float) -> bool:
        def txn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("UPDATE schedules SET paused = ?, next_at = ?, updated_at = ?"
                               " WHERE tenant = ? AND name = ?",
                               (int(paused), next_at, now, tenant, name))
            return cur.rowcount == 1

        changed: bool = await self._writer.submit(txn)
        return changed

    async def due_schedules(self, now: float, limit: int = 100) -> list[ScheduleRow]:
        rows = await self._rows(f"SELECT {_COLUMNS} FROM schedules WHERE paused = 0"
                                " AND next_at <= ? ORDER BY next_at LIMIT ?", (now, limit))
        return [_row(r, self.secrets.unpack) for r in rows]

    async def next_schedule_due(self) -> float | None:
        r = await self._row("SELECT MIN(next_at) FROM schedules WHERE paused = 0")
        return None if r is None or r[0] is None else float(r[0])

    async def advance_schedule(self, row: ScheduleRow, next_at: float, now: float) -> bool:
        def txn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE schedules SET next_at = ?, last_tick = ?, last_task_id = ?,"
                " last_error = ?, updated_at = ? WHERE tenant = ? AND name = ? AND next_at = ?",
                (next_at, row.last_tick, row.last_task_id, row.last_error, now, row.tenant,
                 row.name, row.next_at))
            return cur.rowcount == 1

        moved: bool = await self._writer.submit(txn)
        return moved
