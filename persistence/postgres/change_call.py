"""A task change on PostgreSQL as one round trip: ``ratchet_apply_change``
(persistence/postgres/change_sql.py) called in autocommit, the call its own transaction
(run by postgres/fast_lanes.py).

What stays in Python: every byte the rows hold (payloads, the events' wire form but for
their sequence and version, subjects, state values) and the mapping of the function's
SQLSTATEs back to the exceptions ``apply_change_txn`` raises, so a caller cannot tell the
paths apart. A change carrying what the function does not write — a ledger action,
timers, waits, a handoff, branches, an approval, a spend, agent log entries, an audit
entry, a blob over one chunk — and a change of a task that does not exist run
``apply_change_txn`` as before, in a transaction of their own (the store's fallback). So
does a change the function refused with ``RT006`` (:class:`Fallback`: the task's tenant or
sandbox flag was not what the store had noted — cannot happen, both are set when the row
is made, but then the Python path decides).

Why no transaction is left open: the call is one statement in autocommit, so no round
trip of the node happens while it holds the task's or the lease's row lock; a node frozen
mid-call holds them until the statement ends, never past it (docs/operations.md, "A node
frozen holding row locks").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import psycopg

from ratchet.persistence.blobs import CHUNK_BYTES
from ratchet.persistence.postgres.change_sql import APPLY_CHANGE_SQL, APPLY_CHANGE_TYPES
from ratchet.persistence.postgres.prepared import Prepared
from ratchet.persistence.txn_events import OutboxRow
from ratchet.persistence.txns import ChangeResult, TaskChange
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import DuplicateMessage, Fenced, NotFound, VersionConflict
from ratchet.protocol.events import encode_event_parts, pack_payload
from ratchet.protocol.ids import new_id
from ratchet.protocol.redaction import pack_redacted
from ratchet.protocol.states import TRANSITIONS, TaskEvent, TaskStatus, transition
from ratchet.protocol.subjects import event_subject, sandbox_event_subject
from ratchet.protocol.tracing import TRACEPARENT, add_event, current_traceparent

__all__ = ["ChangeCall", "Fallback", "TaskIdentities", "fast_path"]

_APPLY = Prepared("ratchet_apply_change", APPLY_CHANGE_SQL, APPLY_CHANGE_TYPES)

#: As persistence/txn_events.py: events that are not span events.
_ROUTINE = frozenset({EventType.STEP_COMPLETED.value, EventType.TASK_PROGRESS.value})

#: For each status event, the statuses it leaves and where each goes (TRANSITIONS, split).
_MOVES: dict[str, tuple[list[str], list[str]]] = {}
for (_src, _event), _dst in TRANSITIONS.items():
    _MOVES.setdefault(_event.value, ([], []))
    _MOVES[_event.value][0].append(_src.value)
    _MOVES[_event.value][1].append(_dst.value)


def fast_path(change: TaskChange) -> bool:
    """Whether ``ratchet_apply_change`` writes everything ``change`` carries."""
    if (change.action is not None or change.timers or change.cancel_timers or change.waits
            or change.resolve_waits or change.handoff is not None or change.branches is not None
            or change.approval is not None or change.spend or change.agent_log
            or change.audit is not None):
        return False
    if change.expected_version is None and (change.status_event is not None
                                            or change.checkpoint is not None):
        return False  # refused by apply_change_txn (ValueError): let it say so
    cp = change.checkpoint
    return cp is None or all(memoryview(b).nbytes <= CHUNK_BYTES for b in cp.delta.blobs.values())


class TaskIdentities:
    """(tenant, is a sandbox) of the tasks this store changed: what the events' subjects and
    wire form need before the call. Both are set when the task row is made and never
    change; the function checks them anyway (``RT006``). Bounded: dropped whole past
    :attr:`LIMIT` entries (a miss costs one read)."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, bool]] = {}

    def note(self, task_id: str, tenant: str, sandbox: bool) -> None:
        if len(self._known) >= self.LIMIT:
            self._known.clear()
        self._known[task_id] = (tenant, sandbox)

    def forget(self, task_id: str) -> None:
        self._known.pop(task_id, None)

    def get(self, task_id: str) -> tuple[str, bool] | None:
        return self._known.get(task_id)


def _columns(rows: list[Any], width: int) -> list[tuple[Any, ...]]:
    """``rows`` (tuples of ``width``) as columns: the function takes one array per field."""
    return list(zip(*rows, strict=True)) if rows else [()] * width


class Fallback(Exception):
    """The function left the change to ``apply_change_txn`` (``RT006``)."""


class ChangeCall:
    """``change`` as one call: :attr:`statement` with :meth:`args`, its row read by
    :meth:`result` into what the store's change transaction returns, ``(result, None)``
    (no audit head: a change with an audit entry takes the fallback); a refusal mapped by
    :meth:`refusal` to the exception ``apply_change_txn`` raises.

    Args:
        fence: the write's ``(partition, token)``; None: unfenced (a store without leases).
        lease_now: the store's lease time, read when the call is sent.
        identity: the task's (tenant, is a sandbox).
        on_fenced: counts a fenced refusal (the store's metric).
    """

    statement = _APPLY

    def __init__(self, change: TaskChange, fence: tuple[int, int] | None,
                 lease_now: Callable[[], float], identity: tuple[str, bool],
                 on_fenced: Callable[[], None]) -> None:
        self.change = change
        self.fence = fence
        self.lease_now = lease_now
        self.identity = identity
        self.on_fenced = on_fenced
        self._headers: dict[str, str] | None = None  # the events' (traceparent), if tracing
        self._events: list[Any] = []

    @property
    def task_id(self) -> str:
        """The task changed (its changes keep to one connection)."""
        return self.change.task_id

    def args(self) -> tuple[Any, ...]:
        """The function's arguments (called in the caller's context: its trace)."""
        params, self._events = self._params(*self.identity)
        return params

    def result(self, row: list[Any]) -> tuple[ChangeResult, None]:
        return self._result(row, self._events), None

    def _params(self, tenant: str, sandbox: bool) -> tuple[tuple[Any, ...], list[Any]]:
        """The function's arguments, and per event what its outbox row is rebuilt from:
        ``(type, id, packed payload, wire head, mid, tail, subject)``."""
        c = self.change
        traceparent = current_traceparent() if c.events else None  # None when not tracing
        headers = {TRACEPARENT: traceparent} if traceparent else None
        self._headers = headers
        subject_of = sandbox_event_subject if sandbox else event_subject
        events: list[Any] = []
        for event_type, payload in c.events:
            event_id = new_id("evt")
            packed = pack_payload(payload)
            parts = encode_event_parts(
                event_id=event_id, task_id=c.task_id, tenant=tenant, event_type=event_type,
                occurred_at=c.now, producer=c.producer, payload=payload, packed_payload=packed)
            events.append((event_type, event_id, packed, *parts,
                           subject_of(tenant, c.task_id, event_type)))
        moves = _MOVES.get(TaskEvent(c.status_event).value, ([], [])) if c.status_event else None
        partition, token = self.fence if self.fence is not None else (None, None)
        return (
            c.task_id, c.expected_version, partition, token,
            self.lease_now() if self.fence is not None else None, tenant, sandbox, c.now,
            c.inbox_message_id,
            None if moves is None else moves[0],
            None if moves is None else moves[1],
            *(list(column) for column in _columns(events, 7)),
            msgpack.packb(headers) if headers else None,
            [m[0] for m in c.mail], [m[1] for m in c.mail], [m[2] for m in c.mail],
            *self._checkpoint(),
            c.step_failed, c.control is not None,
            msgpack.packb(c.control, use_bin_type=True) if c.control else None,
            None if c.error is None else pack_redacted(c.error),
            None if c.output is None else pack_redacted(c.output),
            c.definition_hash,
        ), events

    def _checkpoint(self) -> tuple[Any, ...]:
        """Arguments 23-34: the checkpoint row, its values and its (one-chunk) blobs."""
        cp = self.change.checkpoint
        if cp is None:
            return (None,) * 12
        values = cp.delta.values
        blobs = cp.delta.blobs
        return (
            cp.step_index, cp.step_name, cp.next_step, cp.next_node,
            None if cp.visits is None else msgpack.packb(cp.visits),
            [v.key for v in values], [v.inline for v in values],
            [v.blob for v in values], [int(v.deleted) for v in values],
            list(blobs) if blobs else None,
            [memoryview(b).nbytes for b in blobs.values()],
            list(blobs.values()),
        )

    def _result(self, row: list[Any], events: list[Any]) -> ChangeResult:
        version, first_seq, checkpoint = int(row[0]), int(row[2]), int(row[3])
        status = row[1].decode()
        ids = [int(i) for i in row[4][1:-1].split(b",")] if len(row[4]) > 2 else []
        outbox: list[OutboxRow] = []
        headers = self._headers
        for i, (event_type, event_id, _, head, mid, tail, subject) in enumerate(events):
            seq = first_seq + i
            wire = b"".join((head, msgpack.packb(seq), mid, msgpack.packb(version), tail))
            outbox.append(OutboxRow(ids[i], subject, event_id, wire, headers))
            if headers is not None and event_type not in _ROUTINE:
                add_event(event_type, {"ratchet.sequence": seq})
        for j, (subject, msg_id, payload) in enumerate(self.change.mail):
            outbox.append(OutboxRow(ids[len(events) + j], subject, msg_id, payload))
        return ChangeResult(version, TaskStatus(status), first_seq - 1 + len(events),
                            checkpoint, outbox)

    def refusal(self, exc: psycopg.Error) -> Exception:
        """The exception ``apply_change_txn`` raises for what the function refused."""
        c = self.change
        detail = exc.diag.message_detail or ""
        match exc.sqlstate:
            case "RT001":
                self.on_fenced()
                owner, _, token = detail.partition(",")
                partition, mine = self.fence or (None, None)
                return Fenced("write refused: this node's lease on the partition is gone",
                              partition=partition, token=mine,
                              current_token=int(token) if token else None, owner=owner or None)
            case "RT002":
                return NotFound("no such task", task_id=c.task_id)
            case "RT003":
                return VersionConflict("task version moved", task_id=c.task_id,
                                       expected=c.expected_version, actual=int(detail))
            case "RT004":
                assert c.inbox_message_id is not None
                return DuplicateMessage(c.inbox_message_id)
            case "RT006":
                return Fallback()
            case "RT005":
                assert c.status_event is not None
                try:
                    transition(detail, c.status_event)
                except Exception as illegal:  # IllegalTransition, as the Python path says it
                    return illegal
        return exc
