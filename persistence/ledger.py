"""Ledger rows written inside a task change: actions, timers, external waits, handoffs.

The action ledger is how every external write takes effect once: a row per business action
(tenant, idempotency key), IN_FLIGHT committed before the call, the outcome after it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ratchet.persistence.checkpoints import decode_optional
from ratchet.protocol.errors import ActionKeyTaken, NotFound
from ratchet.protocol.redaction import pack_redacted

__all__ = ["ACTION_COLUMNS", "ActionRecord", "ActionWrite", "TimerWrite",
           "action_record", "write_action", "write_timers_waits_handoff"]

#: The ledger's columns, in the order :func:`action_record` reads them.
ACTION_COLUMNS = (
    "tenant, idempotency_key, task_id, step_index, tool, kind, request_hash, args, status,"
    " attempts, accepted, result, error, provider_id, compensates, seq, created_at, updated_at,"
    " next_attempt_at"
)


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One row of the action ledger."""

    tenant: str
    key: str
    task_id: str
    step_index: int
    tool: str
    kind: str
    request_hash: str
    args: Any
    status: str
    attempts: int
    accepted: bool
    result: Any
    error: dict[str, Any] | None
    provider_id: str | None
    compensates: str | None
    seq: int
    created_at: float
    updated_at: float
    next_attempt_at: float | None = None


def action_record(row: Any, unpack: Callable[[bytes | None], Any] = decode_optional
                  ) -> ActionRecord:
    """An ActionRecord from a row of :data:`ACTION_COLUMNS`; ``unpack`` decodes the
    arguments and result (a store's ``secrets.unpack_optional`` opens their secrets)."""
    return ActionRecord(
        tenant=row[0], key=row[1], task_id=row[2], step_index=row[3], tool=row[4], kind=row[5],
        request_hash=row[6], args=unpack(row[7]), status=row[8], attempts=row[9],
        accepted=bool(row[10]), result=unpack(row[11]),
        error=decode_optional(row[12]), provider_id=row[13], compensates=row[14], seq=row[15],
        created_at=row[16], updated_at=row[17], next_attempt_at=row[18],
    )


@dataclass(slots=True)
class ActionWrite:
    """Insert (``insert=True``) or update one row of the action ledger.

    On update, only ``status`` and the fields that are not None are changed. ``args`` are
    packed by the caller and ``result`` holds plain data: both with their secrets sealed
    (``Sealer.pack``, ``Sealer.seal_leaves``); an ``error`` is shown, so redacted.
    """

    key: str
    status: str
    insert: bool = False
    tool: str = ""
    kind: str = ""
    request_hash: str = ""
    args: bytes = b""
    step_index: int = 0
    compensates: str | None = None
    attempts: int | None = None
    accepted: bool | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    provider_id: str | None = None
    next_attempt_at: float | None = None  # a retry's durable delay (status PENDING)


@dataclass(frozen=True, slots=True)
class TimerWrite:
    timer_id: str
    kind: str
    due_at: float
    payload: dict[str, Any]


def write_action(conn: sqlite3.Connection, a: ActionWrite, task_id: str, tenant: str,
                 now: float) -> None:
    """Insert or update one ledger row inside the task change's transaction."""
    packed_result = None if a.result is None else msgpack.packb(a.result, use_bin_type=True)
    packed_error = None if a.error is None else pack_redacted(a.error)
    if a.insert:
        seq_row = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM actions WHERE task_id = ?", (task_id,)
        ).fetchone()
        try:
            conn.execute(
                "INSERT INTO actions(tenant, idempotency_key, task_id, step_index, tool, kind,"
                " request_hash, args, status, attempts, accepted, result, error, provider_id,"
                " compensates, seq, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (tenant, a.key, task_id, a.step_index, a.tool, a.kind, a.request_hash,
                 a.args, a.status, a.attempts or 0, int(bool(a.accepted)), packed_result,
                 packed_error, a.provider_id, a.compensates, seq_row[0], now, now),
            )
        except sqlite3.IntegrityError:
            existing = conn.execute(
                f"SELECT {ACTION_COLUMNS} FROM actions WHERE tenant = ? AND idempotency_key = ?",
                (tenant, a.key)).fetchone()
            raise ActionKeyTaken(a.key, existing) from None
        return
    sets, args = ["status = ?", "updated_at = ?"], [a.status, now]
    for column, value in (("attempts", a.attempts), ("result", packed_result),
                          ("error", packed_error), ("provider_id", a.provider_id),
                          ("next_attempt_at", a.next_attempt_at)):
        if value is not None:
            sets.append(f"{column} = ?")
            args.append(value)
    if a.accepted is not None:
        sets.append("accepted = ?")
        args.append(int(a.accepted))
    cur = conn.execute(
        f"UPDATE actions SET {', '.join(sets)} WHERE tenant = ? AND idempotency_key = ?",
        (*args, tenant, a.key),
    )
    if cur.rowcount != 1:
        raise NotFound("no such action", key=a.key, task_id=task_id)


def write_timers_waits_handoff(conn: sqlite3.Connection, change: Any, tenant: str) -> None:
    """Timers, external waits and handoffs carried by a TaskChange."""
    if change.timers:
        conn.executemany(
            "INSERT OR REPLACE INTO timers(timer_id, task_id, kind, due_at, payload, fired_at)"
            " VALUES (?,?,?,?,?,NULL)",
            [(t.timer_id, change.task_id, t.kind, t.due_at, msgpack.packb(t.payload))
             for t in change.timers],
        )
    if change.cancel_timers:
        conn.executemany("DELETE FROM timers WHERE timer_id = ?",
                         [(t,) for t in change.cancel_timers])
    if change.waits:
        conn.executemany(
            "INSERT OR REPLACE INTO waits(tenant, correlation_id, task_id, kind, created_at,"
            " resolved_at) VALUES (?,?,?,?,?,NULL)",
            [(tenant, cid, change.task_id, kind, change.now) for cid, kind in change.waits],
        )
    if change.resolve_waits:
        conn.executemany(
            "UPDATE waits SET resolved_at = ? WHERE tenant = ? AND correlation_id = ?",
            [(change.now, tenant, cid) for cid in change.resolve_waits],
        )
    if change.handoff is not None:
        reason, package = change.handoff
        conn.execute(
            "INSERT INTO handoffs(task_id, reason, package, created_at) VALUES (?,?,?,?)",
            (change.task_id, reason, pack_redacted(package), change.now),
        )
