"""Write transactions, each run by the writer thread inside the caller's batch.

``*_txn`` functions take the write connection and run inside a SAVEPOINT of a group
commit: they must not BEGIN/COMMIT, must raise to undo their own writes, and must not
touch the event loop.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.persistence.checkpoints import StateDelta
from ratchet.persistence.graph_rows import (
    ApprovalWrite,
    BranchWrites,
    write_approval,
    write_branches,
)
from ratchet.persistence.ledger import (
    ActionKeyTaken,
    ActionWrite,
    TimerWrite,
    write_action,
    write_timers_waits_handoff,
)
from ratchet.protocol.errors import BudgetExhausted, NotFound, VersionConflict
from ratchet.protocol.ids import new_id
from ratchet.protocol.messages import SCHEMA_VERSION
from ratchet.protocol.states import TaskEvent, TaskStatus, transition
from ratchet.protocol.subjects import event_subject

__all__ = [
    "DuplicateMessage",
    "ActionKeyTaken",
    "ActionWrite",
    "TimerWrite",
    "OutboxRow",
    "CheckpointWrite",
    "TaskChange",
    "ChangeResult",
    "NewTask",
    "AcceptResult",
    "accept_submission_txn",
    "apply_change_txn",
    "record_dead_letter_txn",
    "delete_outbox_txn",
]


#: Event payloads larger than this are published truncated (stored whole).
MAX_EVENT_PAYLOAD = 256 * 1024


class DuplicateMessage(Exception):
    """The inbound message id was already processed; the change was not applied."""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    subject: str
    msg_id: str
    payload: bytes
    headers: dict[str, str] | None = None


@dataclass(slots=True)
class CheckpointWrite:
    step_index: int
    step_name: str
    next_step: int
    delta: StateDelta
    next_node: str | None = None
    visits: dict[str, int] | None = None


@dataclass(slots=True)
class TaskChange:
    """One atomic state change of a task (compare-and-set on ``expected_version``).

    ``expected_version=None`` is a side-channel change (a fan-out branch recording an event
    or an action): no compare-and-set and no version bump, so branches running side by side
    never conflict with each other or with their task; it may not change the status or the
    checkpoint.
    """

    task_id: str
    expected_version: int | None
    producer: str
    now: float
    status_event: TaskEvent | None = None
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    checkpoint: CheckpointWrite | None = None
    inbox_message_id: str | None = None
    error: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    mail: list[tuple[str, str, bytes]] = field(default_factory=list)  # subject, msg_id, payload
    step_failed: bool = False  # counts a failed attempt of the next step
    action: ActionWrite | None = None
    timers: list[TimerWrite] = field(default_factory=list)
    cancel_timers: list[str] = field(default_factory=list)
    waits: list[tuple[str, str]] = field(default_factory=list)  # correlation id, kind
    resolve_waits: list[str] = field(default_factory=list)
    handoff: tuple[str, dict[str, Any]] | None = None  # reason, package
    branches: BranchWrites | None = None
    approval: ApprovalWrite | None = None
    spend: dict[str, float] | None = None  # added to the task's spent budget, atomically
    enforce_budget: bool = False  # refuse (BudgetExhausted) a spend past the task's budget
    control: dict[str, Any] | None = None  # operator requests pending on the task ({} clears)
    agent_log: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChangeResult:
    version: int
    status: TaskStatus
    last_event_seq: int
    last_checkpoint: int
    outbox: list[OutboxRow]


def _outbox_insert(
    conn: sqlite3.Connection,
    subject: str,
    msg_id: str,
    payload: bytes,
    now: float,
    headers: dict[str, str] | None = None,
) -> OutboxRow:
    packed_headers = msgpack.packb(headers) if headers else None
    cur = conn.execute(
        "INSERT INTO outbox(subject, msg_id, payload, headers, created_at) VALUES (?,?,?,?,?)",
        (subject, msg_id, payload, packed_headers, now),
    )
    return OutboxRow(int(cur.lastrowid or 0), subject, msg_id, payload, headers)


def _append_events(
    conn: sqlite3.Connection,
    *,
    task_id: str,
    tenant: str,
    first_seq: int,
    version: int,
    producer: str,
    now: float,
    events: list[tuple[str, dict[str, Any]]],
) -> list[OutboxRow]:
    rows: list[OutboxRow] = []
    seq = first_seq
    for event_type, payload in events:
        event_id = new_id("evt")
        packed_payload = msgpack.packb(payload, use_bin_type=True)
        conn.execute(
            "INSERT INTO events(task_id, sequence, event_id, type, aggregate_version,"
            " occurred_at, payload) VALUES (?,?,?,?,?,?,?)",
            (task_id, seq, event_id, event_type, version, now, packed_payload),
        )
        published = payload
        if len(packed_payload) > MAX_EVENT_PAYLOAD:
            # The stream (NATS max payload) cannot carry it; the events table keeps it whole.
            published = {"truncated": True, "bytes": len(packed_payload)}
        wire = msgpack.packb(
            {
                "schema_version": SCHEMA_VERSION,
                "event_id": event_id,
                "task_id": task_id,
                "tenant": tenant,
                "sequence": seq,
                "type": event_type,
                "aggregate_version": version,
                "occurred_at": now,
                "producer": producer,
                "payload": published,
            },
            use_bin_type=True,
        )
        rows.append(_outbox_insert(conn, event_subject(tenant, task_id, event_type), event_id, wire, now))
        seq += 1
    return rows


def _write_checkpoint(
    conn: sqlite3.Connection, task_id: str, seq: int, cp: CheckpointWrite, now: float
) -> None:
    conn.execute(
        "INSERT INTO checkpoints(task_id, seq, step_index, step_name, next_step, next_node,"
        " created_at) VALUES (?,?,?,?,?,?,?)",
        (task_id, seq, cp.step_index, cp.step_name, cp.next_step, cp.next_node, now),
    )
    if cp.delta.blobs:
        conn.executemany(
            "INSERT OR IGNORE INTO blobs(digest, size, data, created_at) VALUES (?,?,?,?)",
            [(d, len(b), b, now) for d, b in cp.delta.blobs.items()],
        )
    if cp.delta.values:
        conn.executemany(
            "INSERT INTO checkpoint_values(task_id, key, seq, inline, blob, deleted)"
            " VALUES (?,?,?,?,?,?)",
            [(task_id, v.key, seq, v.inline, v.blob, int(v.deleted)) for v in cp.delta.values],
        )


def apply_change_txn(conn: sqlite3.Connection, change: TaskChange) -> ChangeResult:
    """Apply ``change`` if the task is still at ``expected_version``.

    Raises:
        NotFound: no such task.
        VersionConflict: the version moved (another writer got there first).
        IllegalTransition: the status event is not allowed from the current status.
        DuplicateMessage: ``inbox_message_id`` was processed before.
    """
    row = conn.execute(
        "SELECT tenant, status, version, last_event_seq, last_checkpoint, spent, budget"
        " FROM tasks WHERE task_id = ?",
        (change.task_id,),
    ).fetchone()
    if row is None:
        raise NotFound("no such task", task_id=change.task_id)
    tenant, status, version, last_seq, last_cp, spent_blob, budget_blob = row
    side_channel = change.expected_version is None
    if side_channel and (change.status_event is not None or change.checkpoint is not None):
        raise ValueError("a side-channel change cannot move the task")
    if not side_channel and version != change.expected_version:
        raise VersionConflict(
            "task version moved",
            task_id=change.task_id,
            expected=change.expected_version,
            actual=version,
        )
    if change.inbox_message_id is not None:
        cur = conn.execute(
            "INSERT OR IGNORE INTO inbox(message_id, task_id, processed_at) VALUES (?,?,?)",
            (change.inbox_message_id, change.task_id, change.now),
        )
        if cur.rowcount == 0:
            raise DuplicateMessage(change.inbox_message_id)
    new_status = TaskStatus(status)
    if change.status_event is not None:
        new_status = transition(new_status, change.status_event)
    new_version = version if side_channel else version + 1
    outbox = _append_events(
        conn,
        task_id=change.task_id,
        tenant=tenant,
        first_seq=last_seq + 1,
        version=new_version,
        producer=change.producer,
        now=change.now,
        events=change.events,
    )
    for subject, msg_id, payload in change.mail:
        outbox.append(_outbox_insert(conn, subject, msg_id, payload, change.now))
    if change.action is not None:
        write_action(conn, change.action, change.task_id, tenant, change.now)
    write_timers_waits_handoff(conn, change, tenant)
    if change.branches is not None:
        write_branches(conn, change.task_id, change.branches, change.now)
    if change.approval is not None:
        write_approval(conn, change.task_id, change.approval, change.now)
    new_cp = last_cp
    sets = ["status = ?", "last_event_seq = ?", "updated_at = ?"]
    args: list[Any] = [new_status.value, last_seq + len(change.events), change.now]
    if not side_channel:
        sets.append("version = ?")
        args.append(new_version)
    if change.checkpoint is not None:
        new_cp = last_cp + 1
        _write_checkpoint(conn, change.task_id, new_cp, change.checkpoint, change.now)
        sets += ["last_checkpoint = ?", "next_step = ?", "step_failures = 0", "current_node = ?"]
        args += [new_cp, change.checkpoint.next_step, change.checkpoint.next_node]
        if change.checkpoint.visits is not None:
            sets.append("visits = ?")
            args.append(msgpack.packb(change.checkpoint.visits))
    elif change.step_failed:
        sets.append("step_failures = step_failures + 1")
    if change.agent_log:
        conn.executemany(
            "INSERT INTO agent_log(task_id, node, seq, kind, body) VALUES (?,?,?,?,?)",
            [(change.task_id, node, seq, kind, msgpack.packb(body, use_bin_type=True))
             for node, seq, kind, body in change.agent_log])
    if change.spend:
        spent = dict(msgpack.unpackb(spent_blob)) if spent_blob else {}
        budget = dict(msgpack.unpackb(budget_blob)) if budget_blob else {}
        for dim, amount in change.spend.items():
            spent[dim] = spent.get(dim, 0) + amount
            if change.enforce_budget and budget.get(dim) is not None and spent[dim] > budget[dim]:
                # Checked in the transaction: branches drawing on one budget at once
                # cannot overspend it between them.
                raise BudgetExhausted(f"{dim} budget exhausted", task_id=change.task_id,
                                      dimension=dim, budget=budget[dim])
        sets.append("spent = ?")
        args.append(msgpack.packb(spent))
    if change.control is not None:
        sets.append("control = ?")
        args.append(msgpack.packb(change.control, use_bin_type=True) if change.control else None)
    if change.error is not None:
        sets.append("error = ?")
        args.append(msgpack.packb(change.error, use_bin_type=True))
    if change.output is not None:
        sets.append("output = ?")
        args.append(msgpack.packb(change.output, use_bin_type=True))
    cur = conn.execute(
        f"UPDATE tasks SET {', '.join(sets)} WHERE task_id = ? AND version = ?",
        (*args, change.task_id, version),
    )
    if cur.rowcount != 1:  # cannot happen under the single writer; kept as the CAS of record
        raise VersionConflict("task version moved", task_id=change.task_id)
    return ChangeResult(new_version, new_status, last_seq + len(change.events), new_cp, outbox)


@dataclass(frozen=True, slots=True)
class NewTask:
    task_id: str
    tenant: str
    workflow: str
    workflow_version: int
    idempotency_key: str
    request_hash: str
    input: bytes
    steps_total: int | None
    deadline_at: float | None
    now: float
    producer: str
    message_id: str | None
    start_mail: tuple[str, str, bytes]  # subject, msg_id, payload
    budget: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AcceptResult:
    task_id: str
    status: str
    created: bool
    conflict: bool = False
    existing_hash: str | None = None
    outbox: list[OutboxRow] = field(default_factory=list)


def accept_submission_txn(conn: sqlite3.Connection, task: NewTask) -> AcceptResult:
    """Create the task for a submission, or return the one its key already made.

    Same (tenant, key) and same request hash: the existing task, ``created=False``.
    Same key, different hash: nothing is created; the conflict is recorded and reported
    (a result, not an exception, so that the record commits).
    """
    row = conn.execute(
        "SELECT request_hash, task_id FROM requests WHERE tenant = ? AND idempotency_key = ?",
        (task.tenant, task.idempotency_key),
    ).fetchone()
    if row is not None:
        existing_hash, task_id = row
        status_row = conn.execute("SELECT status FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        status = status_row[0] if status_row else "UNKNOWN"
        if existing_hash == task.request_hash:
            return AcceptResult(task_id, status, created=False)
        conn.execute(
            "INSERT INTO request_conflicts(tenant, idempotency_key, request_hash, existing_hash,"
            " message_id, occurred_at) VALUES (?,?,?,?,?,?)",
            (task.tenant, task.idempotency_key, task.request_hash, existing_hash,
             task.message_id, task.now),
        )
        return AcceptResult(task_id, status, created=False, conflict=True, existing_hash=existing_hash)
    conn.execute(
        "INSERT INTO requests(tenant, idempotency_key, request_hash, task_id, created_at)"
        " VALUES (?,?,?,?,?)",
        (task.tenant, task.idempotency_key, task.request_hash, task.task_id, task.now),
    )
    conn.execute(
        "INSERT INTO tasks(task_id, tenant, workflow, workflow_version, status, version,"
        " idempotency_key, request_hash, input, steps_total, last_event_seq, deadline_at,"
        " created_at, updated_at, budget) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (task.task_id, task.tenant, task.workflow, task.workflow_version,
         TaskStatus.QUEUED.value, 1, task.idempotency_key, task.request_hash, task.input,
         task.steps_total, 1, task.deadline_at, task.now, task.now,
         None if task.budget is None else msgpack.packb(task.budget)),
    )
    outbox = _append_events(
        conn,
        task_id=task.task_id,
        tenant=task.tenant,
        first_seq=1,
        version=1,
        producer=task.producer,
        now=task.now,
        events=[("task.queued", {"workflow": task.workflow,
                                 "workflow_version": task.workflow_version,
                                 "idempotency_key": task.idempotency_key})],
    )
    subject, msg_id, payload = task.start_mail
    outbox.append(_outbox_insert(conn, subject, msg_id, payload, task.now))
    return AcceptResult(task.task_id, TaskStatus.QUEUED.value, created=True, outbox=outbox)


def record_dead_letter_txn(
    conn: sqlite3.Connection,
    *,
    subject: str,
    raw: bytes,
    error: dict[str, Any],
    dlq_subject: str,
    now: float,
) -> list[OutboxRow]:
    """Keep an unprocessable message with its error, and queue it for the DLQ stream."""
    conn.execute(
        "INSERT INTO dead_letters(subject, error_code, error_message, details, raw, received_at)"
        " VALUES (?,?,?,?,?,?)",
        (subject, error["code"], error["message"],
         msgpack.packb(error.get("details") or {}, use_bin_type=True), raw, now),
    )
    headers = {
        "Ratchet-Error-Code": str(error["code"]),
        "Ratchet-Error": str(error["message"])[:512],
        "Ratchet-Source-Subject": subject,
    }
    return [_outbox_insert(conn, dlq_subject, new_id("dlq"), raw, now, headers)]


def delete_outbox_txn(conn: sqlite3.Connection, ids: list[int]) -> int:
    conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
    return len(ids)
