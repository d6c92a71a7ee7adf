"""What ``admin diagnose`` reads of one task (:class:`DiagnoseStore`, part of ``StorePort``,
and the SQLite store's :class:`DiagnoseRows`, a mixin of ``Store``), and the step
heartbeats it shows (migration 18, persistence/ops_schema.py).

Every read is bounded by the task (an index on each table it reads) and by a row limit, so
a diagnosis costs the same with 10 or 100,000 tasks in the store. A heartbeat is one upsert
outside the task's version and checkpoints: a long step reports how far it is without
committing a step boundary.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol, runtime_checkable

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.ledger import ACTION_COLUMNS, ActionRecord, action_record
from ratchet.persistence.store_rows import _StoreParts
from ratchet.protocol.catalogue import EventType as E

__all__ = ["DIAGNOSIS_EVENTS", "DiagnoseRows", "DiagnoseStore", "SETTLED"]

#: Action statuses that need nothing more from anyone.
SETTLED = ("SUCCEEDED", "FAILED", "COMPENSATED")
#: The event types a diagnosis reads: retries and failures, recovery and interruptions,
#: and those that put a task in its status (which say since when it is in it).
DIAGNOSIS_EVENTS: tuple[str, ...] = tuple(e.value for e in (
    E.ACTION_RETRY, E.STEP_FAILED, E.ACTION_UNKNOWN, E.ACTION_FAILED, E.BRANCH_FAILED,
    E.TASK_RECOVERED, E.TASK_RECOVERY_STOPPED, E.STEP_INTERRUPTED,
    E.TASK_QUEUED, E.TASK_STARTED, E.TASK_RESUMED, E.TASK_PAUSED, E.TASK_WAITING_EXTERNAL,
    E.APPROVAL_REQUESTED, E.APPROVAL_DECIDED, E.WAIT_STARTED, E.WAIT_COMPLETED,
    E.TASK_UNKNOWN, E.TASK_HANDOFF, E.SLEEP_STARTED, E.SLEEP_COMPLETED, E.ACTION_RECONCILED,
    E.TASK_SUCCEEDED, E.TASK_FAILED, E.TASK_CANCELLED, E.FANOUT_STARTED, E.JOIN_COMPLETED,
))
_LIMIT = 200  # rows of each kind a diagnosis shows at most


@runtime_checkable
class DiagnoseStore(Protocol):
    """What the admin service reads to diagnose a task, and what a step's heartbeat writes."""

    async def diagnosis_rows(self, task_id: str, partition: int | None) -> dict[str, Any]:
        """One task's pending timers, open waits, pending approvals, unsettled actions,
        recent diagnosis events (newest last), step heartbeats, fan-out branches, and the
        lease of ``partition`` with its owner's node row (None: no leases)."""
        ...

    async def record_heartbeat(self, task_id: str, scope: str, step: str, attempt: int,
                               fraction: float | None, note: str | None, owner: str,
                               at: float) -> None:
        """Keep the latest heartbeat of a task's step (``scope`` '') or of one branch."""
        ...

    async def heartbeats(self, task_id: str) -> list[dict[str, Any]]:
        """The task's latest heartbeats, one per scope."""
        ...


class DiagnoseRows(_StoreParts):
    """:class:`DiagnoseStore` on SQLite."""

    async def record_heartbeat(self, task_id: str, scope: str, step: str, attempt: int,
                               fraction: float | None, note: str | None, owner: str,
                               at: float) -> None:
        def txn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO step_heartbeats(task_id, scope, step, attempt, fraction, note,"
                " owner, at) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(task_id, scope) DO UPDATE"
                " SET step = excluded.step, attempt = excluded.attempt,"
                " fraction = excluded.fraction, note = excluded.note, owner = excluded.owner,"
                " at = excluded.at", (task_id, scope, step, attempt, fraction, note, owner, at))

        await self._writer.submit(txn)

    async def heartbeats(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT scope, step, attempt, fraction, note, owner, at FROM step_heartbeats"
            " WHERE task_id = ? ORDER BY scope", (task_id,))
        return [{"scope": r[0], "step": r[1], "attempt": r[2], "fraction": r[3],
                 "note": r[4], "owner": r[5], "at": r[6]} for r in rows]

    async def diagnosis_rows(self, task_id: str, partition: int | None) -> dict[str, Any]:
        timers = await self._rows(
            "SELECT timer_id, kind, due_at, payload FROM timers WHERE task_id = ?"
            " AND fired_at IS NULL ORDER BY due_at LIMIT ?", (task_id, _LIMIT))
        waits = await self._rows(
            "SELECT correlation_id, kind, created_at FROM waits WHERE task_id = ?"
            " AND resolved_at IS NULL LIMIT ?", (task_id, _LIMIT))
        approvals = await self._rows(
            "SELECT approval_id, node, request_hash, approvers, expires_at, created_at"
            " FROM approvals WHERE task_id = ? AND status = 'PENDING' LIMIT ?",
            (task_id, _LIMIT))
        actions = await self._rows(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE task_id = ? AND status NOT IN"
            " ('SUCCEEDED', 'FAILED', 'COMPENSATED') ORDER BY seq LIMIT ?", (task_id, _LIMIT))
        marks = ",".join("?" * len(DIAGNOSIS_EVENTS))
        events = await self._rows(
            f"SELECT sequence, type, occurred_at, payload FROM events WHERE task_id = ?"
            f" AND type IN ({marks}) ORDER BY sequence DESC LIMIT ?",
            (task_id, *DIAGNOSIS_EVENTS, _LIMIT))
        branches = await self._rows(
            "SELECT node, branch, status, started_at, finished_at FROM branches"
            " WHERE task_id = ? LIMIT ?", (task_id, 2000))
        return {
            "timers": [{"timer_id": r[0], "kind": r[1], "due_at": r[2],
                        "payload": _unpack(r[3])} for r in timers],
            "waits": [{"correlation_id": r[0], "kind": r[1], "since": r[2]} for r in waits],
            "approvals": [{"approval_id": r[0], "node": r[1], "request_hash": r[2],
                           "approvers": r[3], "expires_at": r[4], "since": r[5]}
                          for r in approvals],
            "actions": [self._action(r) for r in actions],
            "events": [{"sequence": r[0], "type": r[1], "at": r[2], "payload": _unpack(r[3])}
                       for r in reversed(events)],
            "branches": [{"node": r[0], "branch": r[1], "status": r[2], "started_at": r[3],
                          "finished_at": r[4]} for r in branches],
            "heartbeats": await self.heartbeats(task_id),
            "lease": await self._lease_and_owner(partition),
        }

    def _action(self, row: Any) -> ActionRecord:
        return action_record(row, self.secrets.unpack_optional)

    async def _lease_and_owner(self, partition: int | None) -> dict[str, Any] | None:
        if partition is None:
            return None
        row = await self._row(
            "SELECT l.partition, l.owner, l.token, l.previous_owner, n.status, n.heartbeat_at"
            " FROM leases l LEFT JOIN nodes n ON n.node_id = l.owner WHERE l.partition = ?",
            (partition,))
        if row is None:
            return {"partition": partition, "owner": None}
        # heartbeat_at is the owner's wall clock (shown to people); lease times are the
        # store's clock (persistence/leases.py) and are not shown here.
        return {"partition": row[0], "owner": row[1], "token": row[2], "previous_owner": row[3],
                "owner_status": row[4], "owner_heartbeat_at": row[5]}
