"""The Store's reads (and small writes) of the ledger, tool sessions, timers, waits,
handoffs, fan-out branches, approvals and agent logs — a mixin of :class:`Store`, kept
apart so that each module stays one concept and a readable size."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ratchet.persistence.admin_rows import (
    AuditEntry,
    append_audit_txn,
    claim_command_txn,
    release_command_txn,
    store_reply_txn,
)
from ratchet.persistence.audit_check import AUDIT_COLUMNS, AuditReport, ChainCheck
from ratchet.persistence.audit_heads import HeadWriter
from ratchet.persistence.audit_seal import AuditHead, AuditSeal
from ratchet.persistence.branch_rows import BranchRows
from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.fork import ForkRequest, fork_txn
from ratchet.persistence.graph_rows import finish_branch_txn
from ratchet.persistence.ledger import ACTION_COLUMNS, ActionRecord, action_record
from ratchet.persistence.session_rows import SessionRows
from ratchet.persistence.txns import ChangeResult, OutboxRow, TaskChange, apply_change_txn
from ratchet.persistence.writer import Writer
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.secrets import Sealer
from ratchet.protocol.states import TERMINAL

__all__ = ["AdminRows", "RowReads"]

T = TypeVar("T")

#: A switch's scope is stored in its name, ``<scope>/<name>``: "/" is in neither a tenant
#: token nor a tool name, so the table keeps its key (kind, name) and needs no migration,
#: and a row written before switches had scopes (no "/") keeps its meaning: every tenant.
_SCOPE_SEP = "/"


def _scoped(scope: str, name: str) -> str:
    return f"{scope}{_SCOPE_SEP}{name}"


def _unscoped(stored: str) -> tuple[str, str]:
    scope, sep, name = stored.partition(_SCOPE_SEP)
    return (scope, name) if sep else (SYSTEM_TENANT, stored)


class _StoreParts:
    """What the mixins use of :class:`Store` (which provides it)."""

    _writer: Writer
    audit_seal: AuditSeal | None
    _heads: HeadWriter
    secrets: Sealer

    async def _rows(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def _row(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        raise NotImplementedError

    def _announce(self, rows: list[OutboxRow]) -> None:
        raise NotImplementedError

    def _fenced(self, task_id: str, fn: Callable[[sqlite3.Connection], T]
                ) -> Callable[[sqlite3.Connection], T]:
        raise NotImplementedError

    async def _advance_head(self, head: AuditHead) -> None:
        raise NotImplementedError


def _branch(status: str, result: bytes | None, error: bytes | None,
            secrets: Sealer) -> dict[str, Any]:
    return {"status": status, "result": secrets.unpack_optional(result), "error": _unpack(error)}


class RowReads(BranchRows, SessionRows, _StoreParts):

    # -- ledger, sessions, timers, waits, handoffs ----------------------------------------

    async def get_action(self, tenant: str, key: str) -> ActionRecord | None:
        row = await self._row(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE tenant = ? AND idempotency_key = ?",
            (tenant, key),
        )
        return None if row is None else action_record(row, self.secrets.unpack_optional)

    async def task_actions(self, task_id: str) -> list[ActionRecord]:
        """The task's actions in the order they were first recorded."""
        rows = await self._rows(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE task_id = ? ORDER BY seq", (task_id,)
        )
        return [action_record(r, self.secrets.unpack_optional) for r in rows]

    async def model_calls(self, tenant: str, limit: int) -> list[ActionRecord]:
        """The tenant's most recent agent model calls (their keys start ``model:``)."""
        rows = await self._rows(
            f"SELECT {ACTION_COLUMNS} FROM actions WHERE tenant = ? AND idempotency_key"
            " >= 'model:' AND idempotency_key < 'model;' AND kind = 'model'"
            " ORDER BY created_at DESC LIMIT ?", (tenant, limit))
        return [action_record(r, self.secrets.unpack_optional) for r in rows]

    async def next_timer_due(self) -> float | None:
        row = await self._row(
            "SELECT MIN(due_at) FROM timers WHERE fired_at IS NULL")
        return None if row is None or row[0] is None else float(row[0])

    async def due_timers(self, now: float, limit: int = 500) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT timer_id, task_id, kind, due_at, payload FROM timers"
            " WHERE fired_at IS NULL AND due_at <= ? ORDER BY due_at LIMIT ?", (now, limit)
        )
        return [{"timer_id": r[0], "task_id": r[1], "kind": r[2], "due_at": r[3],
                 "payload": _unpack(r[4])} for r in rows]

    async def timer_fired(self, timer_id: str) -> bool:
        row = await self._row(
            "SELECT fired_at FROM timers WHERE timer_id = ?", (timer_id,))
        return row is not None and row[0] is not None

    async def timer_payload(self, timer_id: str) -> dict[str, Any] | None:
        """The payload of a timer, armed or fired; None when there is no such row."""
        row = await self._row("SELECT payload FROM timers WHERE timer_id = ?", (timer_id,))
        return None if row is None else dict(_unpack(row[0]) or {})

    async def mark_timers_fired(self, fired: list[tuple[str, float]], now: float) -> None:
        """Mark ``(timer_id, due_at)`` pairs fired. The due time is part of the match: a
        timer re-armed (same id, new due time) while it was being delivered stays armed."""

        def txn(conn: sqlite3.Connection) -> None:
            conn.executemany("UPDATE timers SET fired_at = ? WHERE timer_id = ? AND due_at = ?",
                             [(now, t, due) for t, due in fired])

        await self._writer.submit(txn)

    async def find_wait(self, tenant: str, correlation_id: str) -> tuple[str, str] | None:
        """(task_id, kind) of an open wait, or None."""
        row = await self._row(
            "SELECT task_id, kind FROM waits WHERE tenant = ? AND correlation_id = ?"
            " AND resolved_at IS NULL", (tenant, correlation_id)
        )
        return None if row is None else (row[0], row[1])

    async def handoffs(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self._rows(
            "SELECT id, reason, package, created_at, resolved_at FROM handoffs WHERE task_id = ?"
            " ORDER BY id", (task_id,)
        )
        return [{"id": r[0], "reason": r[1], "package": _unpack(r[2]), "created_at": r[3],
                 "resolved_at": r[4]} for r in rows]

    # -- graphs: branches, approvals, checkpoint history -----------------------------------

    async def finish_branch(self, change: TaskChange, node: str, branch: str, status: str,
                            result: Any, error: dict[str, Any] | None) -> bool:
        """Settle a RUNNING branch and, only if it was still running, apply ``change`` (a
        side-channel change: its events and mail) in the same transaction."""

        def txn(conn: sqlite3.Connection) -> tuple[bool, ChangeResult | None]:
            if not finish_branch_txn(conn, change.task_id, node, branch, status, result, error,
                                     change.now, self.secrets.default):
                return (False, None)
            return (True, apply_change_txn(conn, change))

        settled, applied = await self._writer.submit(self._fenced(change.task_id, txn))
        if applied is not None:
            self._announce(applied.outbox)
        return bool(settled)

    async def branches(self, task_id: str, node: str) -> dict[str, dict[str, Any]]:
        rows = await self._rows(
            "SELECT branch, status, result, error FROM branches WHERE task_id = ? AND node = ?",
            (task_id, node))
        return {r[0]: _branch(r[1], r[2], r[3], self.secrets) for r in rows}

    async def branches_named(self, task_id: str, node: str,
                             names: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for i in range(0, len(names), 500):  # within SQLite's host parameters
            chunk = names[i:i + 500]
            for r in await self._rows(
                    "SELECT branch, status, result, error FROM branches WHERE task_id = ?"
                    f" AND node = ? AND branch IN ({','.join('?' * len(chunk))})",
                    (task_id, node, *chunk)):
                found[r[0]] = _branch(r[1], r[2], r[3], self.secrets)
        return found

    async def branch(self, task_id: str, node: str, branch: str) -> dict[str, Any] | None:
        r = await self._row(
            "SELECT status, result, error FROM branches WHERE task_id = ? AND node = ?"
            " AND branch = ?", (task_id, node, branch))
        return None if r is None else _branch(r[0], r[1], r[2], self.secrets)

    async def approval(self, approval_id: str) -> dict[str, Any] | None:
        r = await self._row(
            "SELECT approval_id, task_id, node, request, request_hash, approvers, status,"
            " decided_by, reason, expires_at, created_at, decided_at FROM approvals"
            " WHERE approval_id = ?", (approval_id,))
        if r is None:
            return None
        return {"approval_id": r[0], "task_id": r[1], "node": r[2], "request": _unpack(r[3]),
                "request_hash": r[4], "approvers": r[5], "status": r[6], "decided_by": r[7],
                "reason": r[8], "expires_at": r[9], "created_at": r[10], "decided_at": r[11]}

    async def agent_log(self, task_id: str, node: str) -> list[tuple[str, dict[str, Any]]]:
        """An agent node's log entries ``(kind, body)`` in order (messages and turns), their
        sealed secrets opened."""
        rows = await self._rows(
            "SELECT kind, body FROM agent_log WHERE task_id = ? AND node = ? ORDER BY seq",
            (task_id, node))
        return [(r[0], dict(self.secrets.unpack(r[1]))) for r in rows]

    async def checkpoint_names(self, task_id: str) -> list[str]:
        """The names of the nodes completed, in checkpoint order."""
        rows = await self._rows(
            "SELECT step_name FROM checkpoints WHERE task_id = ? ORDER BY seq", (task_id,))
        return [r[0] for r in rows]

    async def recent_events(self, task_id: str, types: tuple[str, ...],
                            since: float) -> list[dict[str, Any]]:
        """The task's events of ``types`` that occurred at or after ``since``, in sequence
        order (rows shaped as :meth:`Store.events`' ones)."""
        if not types:
            return []
        marks = ",".join("?" * len(types))
        rows = await self._rows(
            "SELECT sequence, event_id, type, aggregate_version, occurred_at, payload"
            f" FROM events WHERE task_id = ? AND type IN ({marks}) AND occurred_at >= ?"
            " ORDER BY sequence", (task_id, *types, since))
        return [{"sequence": r[0], "event_id": r[1], "type": r[2], "aggregate_version": r[3],
                 "occurred_at": r[4], "payload": _unpack(r[5])} for r in rows]


class AdminRows(_StoreParts):
    """Store methods of the admin service (a mixin of :class:`Store`)."""

    async def fork(self, request: ForkRequest) -> dict[str, Any]:
        """Create a fork (see persistence/fork.py); its start mail goes out via the outbox."""
        result: dict[str, Any] = await self._writer.submit(lambda c: fork_txn(c, request))
        self._announce(result.pop("outbox"))
        return result

    async def purge_task(self, task_id: str) -> dict[str, int]:
        """Remove a finished task's rows and the blobs nothing references any more.

        The action ledger is kept: it is what stops a business action from happening twice,
        whatever happens to the task that made it."""
        def txn(conn: sqlite3.Connection) -> dict[str, int]:
            row = conn.execute("SELECT status, tenant, idempotency_key FROM tasks"
                               " WHERE task_id = ?", (task_id,)).fetchone()
            if row is None or row[0] not in {s.value for s in TERMINAL}:
                raise ValueError(f"task {task_id} is not finished")
            removed: dict[str, int] = {}
            for table in ("events", "checkpoints", "checkpoint_values", "agent_log", "branches",
                          "approvals", "tool_sessions", "timers", "waits", "inbox", "handoffs",
                          "step_heartbeats"):
                removed[table] = conn.execute(f"DELETE FROM {table} WHERE task_id = ?",
                                              (task_id,)).rowcount
            conn.execute("DELETE FROM requests WHERE tenant = ? AND idempotency_key = ?",
                         (row[1], row[2]))
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
            removed["blobs"] = conn.execute(
                "DELETE FROM blobs WHERE digest NOT IN (SELECT blob FROM checkpoint_values"
                " WHERE blob IS NOT NULL)").rowcount
            conn.execute("DELETE FROM blob_chunks WHERE digest NOT IN (SELECT digest FROM blobs)")
            return removed

        result: dict[str, int] = await self._writer.submit(txn)
        return result

    async def expired_tasks(self, tenant: str | None, finished_before: float,
                            limit: int = 500, exclude: list[str] | None = None) -> list[str]:
        """Finished tasks (of ``tenant``, or any) last updated before ``finished_before``."""
        where, args = "status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at < ?", \
            [finished_before]
        if tenant is not None:
            where += " AND tenant = ?"
            args.append(tenant)  # type: ignore[arg-type]
        for other in exclude or []:  # tenants with a period of their own
            where += " AND tenant != ?"
            args.append(other)  # type: ignore[arg-type]
        rows = await self._rows(f"SELECT task_id FROM tasks WHERE {where} LIMIT ?",
                                    (*args, limit))
        return [r[0] for r in rows]

    async def switches(self) -> list[tuple[str, str, str]]:
        """Every switch that is on: ``(scope, kind, name)``, the scope a tenant or
        ``_system`` (every tenant)."""
        rows = await self._rows("SELECT kind, name FROM switches")
        return [(scope, kind, name) for kind, (scope, name)
                in ((r[0], _unscoped(r[1])) for r in rows)]

    async def set_switch(self, scope: str, kind: str, name: str, on: bool, by: str,
                         reason: str | None, now: float) -> None:
        stored = _scoped(scope, name)

        def txn(conn: sqlite3.Connection) -> None:
            if on:
                conn.execute("INSERT OR REPLACE INTO switches(kind, name, by, reason, at)"
                             " VALUES (?,?,?,?,?)", (kind, stored, by, reason, now))
            else:
                conn.execute("DELETE FROM switches WHERE kind = ? AND name = ?", (kind, stored))

        await self._writer.submit(txn)

    async def claim_command(self, tenant: str, command_id: str, verb: str, request_hash: str,
                            now: float) -> tuple[str, Any]:
        result: tuple[str, Any] = await self._writer.submit(
            lambda c: claim_command_txn(c, tenant, command_id, verb, request_hash, now))
        return result

    async def release_command(self, tenant: str, command_id: str) -> None:
        await self._writer.submit(lambda c: release_command_txn(c, tenant, command_id))

    async def store_command_reply(self, tenant: str, command_id: str,
                                  reply: dict[str, Any]) -> None:
        await self._writer.submit(lambda c: store_reply_txn(c, tenant, command_id, reply))

    async def audit(self, entry: AuditEntry) -> int:
        """Append one audit entry (hash-chained, keyed with the seal's key) and, once it is
        committed, move the head to it; returns its sequence number."""
        head: AuditHead = await self._writer.submit(
            lambda c: append_audit_txn(c, entry, self.audit_seal))
        await self._advance_head(head)
        return head.seq

    async def _advance_head(self, head: AuditHead) -> None:
        # After the commit, never before: a head ahead of the table would read as a deleted
        # entry. Queued, not awaited: persistence/audit_heads.py.
        self._heads.advance(head)

    async def audit_log(self, tenant: str | None = None, after: int = 0,
                        limit: int = 500) -> list[dict[str, Any]]:
        where, args = ("WHERE seq > ?", [after]) if tenant is None else \
            ("WHERE seq > ? AND tenant = ?", [after, tenant])
        rows = await self._rows(
            "SELECT seq, tenant, at, principal, verb, command_id, task_id, outcome, detail,"
            f" hash FROM audit {where} ORDER BY seq LIMIT ?", (*args, limit))
        return [{"seq": r[0], "tenant": r[1], "at": r[2], "principal": r[3], "verb": r[4],
                 "command_id": r[5], "task_id": r[6], "outcome": r[7], "detail": _unpack(r[8]),
                 "hash": r[9]} for r in rows]

    async def verify_audit(self, page: int = 2000) -> AuditReport:
        """Check every entry and the head (persistence/audit_check.py); a page of rows at a
        time, each page's hashing on a thread (a long chain must not stall the loop)."""
        seal = self.audit_seal
        await self._heads.flush()
        # The head before the rows: entries appended while we read then come after it.
        head = await asyncio.to_thread(seal.read_head) if seal else (None, None)
        check, after = ChainCheck(seal, head), -1
        while True:
            rows = await self._rows(f"SELECT {AUDIT_COLUMNS} FROM audit WHERE seq > ?"
                                    " ORDER BY seq LIMIT ?", (after, page))
            if not rows:
                return check.finish()
            await asyncio.to_thread(check.feed, [tuple(r) for r in rows])
            after = rows[-1][0]

    async def list_tasks(self, tenant: str, *, status: str | None = None,
                         workflow: str | None = None, limit: int = 100,
                         cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the tenant's tasks, newest first; returns (rows, next cursor)."""
        clauses, args = ["tenant = ?"], [tenant]
        if status:
            clauses.append("status = ?")
            args.append(status)
        if workflow:
            clauses.append("workflow = ?")
            args.append(workflow)
        if cursor:
            created_text, _, task_id = cursor.partition("/")
            created = float(created_text)
            clauses.append("(created_at < ? OR (created_at = ? AND task_id < ?))")
            args += [created, created, task_id]  # type: ignore[list-item]
        rows = await self._rows(
            "SELECT task_id, workflow, workflow_version, status, version, created_at,"
            f" updated_at FROM tasks WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at DESC, task_id DESC LIMIT ?", (*args, limit + 1))
        page = [{"task_id": r[0], "workflow": r[1], "workflow_version": r[2], "status": r[3],
                 "version": r[4], "created_at": r[5], "updated_at": r[6]} for r in rows[:limit]]
        more = len(rows) > limit
        next_cursor = f"{page[-1]['created_at']!r}/{page[-1]['task_id']}" if more else None
        return page, next_cursor
