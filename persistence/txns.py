"""Write transactions, each run by the writer thread inside the caller's batch.

``*_txn`` functions take the write connection and run inside a SAVEPOINT of a group
commit: they must not BEGIN/COMMIT, must raise to undo their own writes, and must not
touch the event loop. The event, outbox and checkpoint rows they append are written by
``persistence/txn_events.py``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.graph_rows import (
    ApprovalWrite,
    BranchWrites,
    write_approval,
    write_branches,
)
from ratchet.persistence.ledger import (
    ActionWrite,
    TimerWrite,
    write_action,
    write_timers_waits_handoff,
)
from ratchet.persistence.txn_events import (
    CheckpointWrite,
    OutboxRow,
    append_events,
    insert_outbox,
    write_checkpoint,
)
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import BudgetExhausted, DuplicateMessage, NotFound, VersionConflict
from ratchet.protocol.redaction import pack_redacted
from ratchet.protocol.states import TaskEvent, TaskStatus, transition

__all__ = [
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
    "delete_outbox_txn",
]


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
    definition_hash: str | None = None  # the definition it goes on under (resumed on new code)
    agent_log: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)
    #: An audit entry committed with the change (an approval decision): written by
    #: ``Store.apply``, which holds the audit key, not by :func:`apply_change_txn`.
    audit: AuditEntry | None = None
    #: The caller may go on before the change is durable (a step's commit, with FULL):
    #: ``Store.apply`` returns at the commit, with :attr:`ChangeResult.durable` to await;
    #: its events are published only once it is durable. A store that cannot, ignores it.
    pipelined: bool = False


#: The statuses a handoff leaves a task in: leaving them settles its open handoffs.
_HANDED = ("UNKNOWN", "WAITING_APPROVAL")


@dataclass(frozen=True, slots=True)
class ChangeResult:
    version: int
    status: TaskStatus
    last_event_seq: int
    last_checkpoint: int
    outbox: list[OutboxRow]
    #: A pipelined change's durability (None: durable already, as configured).
    durable: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _TaskUpdate:
    """The SET clauses of a change's UPDATE of the task row, with their arguments, in order."""

    sets: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)

    def add(self, clause: str, *values: Any) -> None:
        self.sets.append(clause)
        self.args.extend(values)


def apply_change_txn(conn: sqlite3.Connection, change: TaskChange) -> ChangeResult:
    """Apply ``change`` if the task is still at ``expected_version``.

    Raises:
        NotFound: no such task.
        VersionConflict: the version moved (another writer got there first).
        IllegalTransition: the status event is not allowed from the current status.
        DuplicateMessage: ``inbox_message_id`` was processed before.
    """
    tenant, status, version, last_seq, last_cp, spent_blob, budget_blob, sandbox = _load_task(
        conn, change)
    side_channel = change.expected_version is None
    if change.inbox_message_id is not None:
        _claim_inbox(conn, change, change.inbox_message_id)
    new_status = TaskStatus(status)
    if change.status_event is not None:
        new_status = transition(new_status, change.status_event)
    new_version = version if side_channel else version + 1
    outbox = append_events(
        conn,
        task_id=change.task_id,
        tenant=tenant,
        first_seq=last_seq + 1,
        version=new_version,
        producer=change.producer,
        now=change.now,
        events=change.events,
        sandbox=sandbox is not None,  # its events on the sandbox's subjects (sandbox_rows.py)
    )
    outbox += _write_related_rows(conn, change, tenant)
    if status in _HANDED and new_status.value != status:  # no longer waiting for a human
        conn.execute("UPDATE handoffs SET resolved_at = ? WHERE task_id = ? AND resolved_at"
                     " IS NULL", (change.now, change.task_id))
    update = _TaskUpdate()
    if new_status.value != status:
        # Only when it moves: setting the indexed column, even to its value, rewrites its
        # tasks_by_status entry — one more WAL page and ~20 µs per step commit.
        update.add("status = ?", new_status.value)
    update.add("last_event_seq = ?", last_seq + len(change.events))
    update.add("updated_at = ?", change.now)
    if not side_channel:
        update.add("version = ?", new_version)
    new_cp = _apply_checkpoint(conn, change, last_cp, update)
    _append_agent_log(conn, change)
    if change.spend:
        update.add("spent = ?", _spent_after(change, change.spend, spent_blob, budget_blob))
    _set_packed_columns(change, update)
    cur = conn.execute(
        f"UPDATE tasks SET {', '.join(update.sets)} WHERE task_id = ? AND version = ?",
        (*update.args, change.task_id, version),
    )
    if cur.rowcount != 1:  # cannot happen under the single writer; kept as the CAS of record
        raise VersionConflict("task version moved", task_id=change.task_id)
    return ChangeResult(new_version, new_status, last_seq + len(change.events), new_cp, outbox)


def _load_task(conn: sqlite3.Connection, change: TaskChange) -> tuple[Any, ...]:
    """The task row ``change`` applies to: (tenant, status, version, last_event_seq,
    last_checkpoint, spent, budget, sandbox), once the change is known to be allowed on it."""
    row = conn.execute(
        "SELECT tenant, status, version, last_event_seq, last_checkpoint, spent, budget,"
        " sandbox FROM tasks WHERE task_id = ?",
        (change.task_id,),
    ).fetchone()
    if row is None:
        raise NotFound("no such task", task_id=change.task_id)
    version = row[2]
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
    return tuple(row)


def _claim_inbox(conn: sqlite3.Connection, change: TaskChange, message_id: str) -> None:
    """Record the inbound message as processed: a redelivered message changes nothing."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO inbox(message_id, task_id, processed_at) VALUES (?,?,?)",
        (message_id, change.task_id, change.now),
    )
    if cur.rowcount == 0:
        raise DuplicateMessage(message_id)


def _write_related_rows(
    conn: sqlite3.Connection, change: TaskChange, tenant: str
) -> list[OutboxRow]:
    """The rows the change carries besides its events and checkpoint: mail (returned, as
    outbox rows), the ledger action, timers, waits and handoff, branches, the approval."""
    outbox = [insert_outbox(conn, subject, msg_id, payload, change.now)
              for subject, msg_id, payload in change.mail]
    if change.action is not None:
        write_action(conn, change.action, change.task_id, tenant, change.now)
    write_timers_waits_handoff(conn, change, tenant)
    if change.branches is not None:
        write_branches(conn, change.task_id, change.branches, change.now)
    if change.approval is not None:
        write_approval(conn, change.task_id, change.approval, change.now)
    return outbox


def _apply_checkpoint(
    conn: sqlite3.Connection, change: TaskChange, last_cp: int, update: _TaskUpdate
) -> int:
    """Write the change's checkpoint, if any, and the task columns it moves (or count a
    failed attempt of the next step); returns the task's last checkpoint after the change."""
    cp = change.checkpoint
    if cp is None:
        if change.step_failed:
            update.add("step_failures = step_failures + 1")
        return last_cp
    new_cp = last_cp + 1
    write_checkpoint(conn, change.task_id, new_cp, cp, change.now)
    update.add("last_checkpoint = ?", new_cp)
    update.add("next_step = ?", cp.next_step)
    update.add("step_failures = 0")
    update.add("current_node = ?", cp.next_node)
    if cp.visits is not None:
        update.add("visits = ?", msgpack.packb(cp.visits))
    return new_cp


def _append_agent_log(conn: sqlite3.Connection, change: TaskChange) -> None:
    if change.agent_log:
        conn.executemany(
            "INSERT INTO agent_log(task_id, node, seq, kind, body) VALUES (?,?,?,?,?)",
            [(change.task_id, node, seq, kind, msgpack.packb(body, use_bin_type=True))
             for node, seq, kind, body in change.agent_log])


def _spent_after(change: TaskChange, spend: dict[str, float], spent_blob: bytes | None,
                 budget_blob: bytes | None) -> bytes:
    """The task's spent budget with ``spend`` added (packed). Checked here, in the
    transaction, when enforced: branches drawing on one budget at once cannot overspend it
    between them."""
    spent = dict(msgpack.unpackb(spent_blob)) if spent_blob else {}
    budget = dict(msgpack.unpackb(budget_blob)) if budget_blob else {}
    for dim, amount in spend.items():
        spent[dim] = spent.get(dim, 0) + amount
        if change.enforce_budget and budget.get(dim) is not None and spent[dim] > budget[dim]:
            raise BudgetExhausted(f"{dim} budget exhausted", task_id=change.task_id,
                                  dimension=dim, budget=budget[dim])
    packed: bytes = msgpack.packb(spent)
    return packed


def _set_packed_columns(change: TaskChange, update: _TaskUpdate) -> None:
    """The control requests (an empty map clears them), the error and the output (both
    shown to clients, so with their secrets redacted)."""
    if change.control is not None:
        update.add("control = ?",
                   msgpack.packb(change.control, use_bin_type=True) if change.control else None)
    if change.error is not None:
        update.add("error = ?", pack_redacted(change.error))
    if change.output is not None:
        update.add("output = ?", pack_redacted(change.output))
    if change.definition_hash is not None:
        update.add("definition_hash = ?", change.definition_hash)


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
    traceparent: str | None = None  # the intake span's, when tracing (protocol/tracing.py)
    definition_hash: str | None = None  # the workflow's (actors/workflow/definition.py)


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
    try:
        conn.execute(
            "INSERT INTO requests(tenant, idempotency_key, request_hash, task_id, created_at)"
            " VALUES (?,?,?,?,?)",
            (task.tenant, task.idempotency_key, task.request_hash, task.task_id, task.now),
        )
    except sqlite3.IntegrityError:
        # Another node's accept of the key committed since the read above (PostgreSQL:
        # the insert waited for it): answer as the read would have.
        return accept_submission_txn(conn, task)
    conn.execute(
        "INSERT INTO tasks(task_id, tenant, workflow, workflow_version, status, version,"
        " idempotency_key, request_hash, input, steps_total, last_event_seq, deadline_at,"
        " created_at, updated_at, budget, traceparent, definition_hash)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (task.task_id, task.tenant, task.workflow, task.workflow_version,
         TaskStatus.QUEUED.value, 1, task.idempotency_key, task.request_hash, task.input,
         task.steps_total, 1, task.deadline_at, task.now, task.now,
         None if task.budget is None else msgpack.packb(task.budget), task.traceparent,
         task.definition_hash),
    )
    outbox = append_events(
        conn,
        task_id=task.task_id,
        tenant=task.tenant,
        first_seq=1,
        version=1,
        producer=task.producer,
        now=task.now,
        events=[(EventType.TASK_QUEUED, {"workflow": task.workflow,
                                         "workflow_version": task.workflow_version,
                                         "idempotency_key": task.idempotency_key})],
    )
    subject, msg_id, payload = task.start_mail
    outbox.append(insert_outbox(conn, subject, msg_id, payload, task.now))
    return AcceptResult(task.task_id, TaskStatus.QUEUED.value, created=True, outbox=outbox)


def delete_outbox_txn(conn: sqlite3.Connection, ids: list[int]) -> int:
    conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
    return len(ids)
