"""A submission's acceptance on PostgreSQL as one round trip: ``ratchet_accept``
(persistence/postgres/change_sql.py) called in autocommit (by postgres/fast_lanes.py) — what ``accept_submission_txn``
(persistence/txns.py) does in ~6 statements: the request's key (or the task it made
already, or the conflict recorded), the task row, its ``task.queued`` event with its
outbox row, and the start mail. Python builds every byte, the event's wire form whole: a
new task's first event is sequence 1 of version 1.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ratchet.persistence.postgres.change_sql import ACCEPT_SQL, ACCEPT_TYPES
from ratchet.persistence.postgres.prepared import Prepared
from ratchet.persistence.txn_events import OutboxRow
from ratchet.persistence.txns import AcceptResult, NewTask
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.events import encode_event, pack_payload
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import event_subject
from ratchet.protocol.tracing import TRACEPARENT, add_event, current_traceparent

__all__ = ["AcceptCall"]

_ACCEPT = Prepared("ratchet_accept", ACCEPT_SQL, ACCEPT_TYPES)


class AcceptCall:
    """``task``'s acceptance as one call (postgres/fast_lanes.py runs it): :meth:`result`
    is the :class:`AcceptResult` ``accept_submission_txn`` would return."""

    statement = _ACCEPT

    def __init__(self, task: NewTask) -> None:
        self.task = task
        self._event: tuple[str, str, bytes, dict[str, str] | None] | None = None

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def args(self) -> tuple[Any, ...]:
        """The function's arguments (called in the caller's context: its trace)."""
        t = self.task
        traceparent = current_traceparent()  # None when not tracing
        headers = {TRACEPARENT: traceparent} if traceparent else None
        event_type = EventType.TASK_QUEUED.value
        payload = {"workflow": t.workflow, "workflow_version": t.workflow_version,
                   "idempotency_key": t.idempotency_key}
        event_id = new_id("evt")
        packed = pack_payload(payload)
        wire = encode_event(event_id=event_id, task_id=t.task_id, tenant=t.tenant, sequence=1,
                            event_type=event_type, aggregate_version=1, occurred_at=t.now,
                            producer=t.producer, payload=payload, packed_payload=packed)
        subject = event_subject(t.tenant, t.task_id, event_type)
        self._event = (subject, event_id, wire, headers)
        mail_subject, mail_id, mail_payload = t.start_mail
        return (
            t.task_id, t.tenant, t.workflow, t.workflow_version, t.idempotency_key,
            t.request_hash, t.input, t.steps_total, t.deadline_at, t.now, t.message_id,
            None if t.budget is None else msgpack.packb(t.budget), t.traceparent,
            t.definition_hash, event_type, event_id, packed, wire, subject,
            msgpack.packb(headers) if headers else None, mail_subject, mail_id, mail_payload)

    def result(self, row: list[Any]) -> AcceptResult:
        assert self._event is not None
        task_id, status = row[0].decode(), row[1].decode()
        if row[2] != b"t":
            existing = row[4].decode() if row[4] is not None else None
            return AcceptResult(task_id, status, created=False, conflict=row[3] == b"t",
                                existing_hash=existing)
        ids = [int(i) for i in row[5][1:-1].split(b",")]
        subject, event_id, wire, headers = self._event
        if headers is not None:
            add_event(EventType.TASK_QUEUED.value, {"ratchet.sequence": 1})
        mail_subject, mail_id, mail_payload = self.task.start_mail
        return AcceptResult(task_id, status, created=True, outbox=[
            OutboxRow(ids[0], subject, event_id, wire, headers),
            OutboxRow(ids[1], mail_subject, mail_id, mail_payload)])

    def refusal(self, exc: Exception) -> Exception:
        return exc
