"""A ``tasks`` row as a :class:`TaskRecord`: the columns read, and how they decode."""

from __future__ import annotations

from typing import Any

from ratchet.persistence.checkpoints import decode_optional as _unpack
from ratchet.persistence.records import TaskRecord
from ratchet.protocol.secrets import Sealer

__all__ = ["TASK_COLUMNS", "task_record"]


TASK_COLUMNS = (
    "task_id, tenant, workflow, workflow_version, status, version, input, next_step,"
    " steps_total, last_checkpoint, last_event_seq, deadline_at, created_at, updated_at,"
    " error, output, step_failures, current_node, visits, budget, spent, control,"
    " traceparent, idempotency_key, definition_hash, sandbox"
)


def task_record(row: tuple[Any, ...], secrets: Sealer) -> TaskRecord:
    return TaskRecord(
        task_id=row[0], tenant=row[1], workflow=row[2], workflow_version=row[3],
        status=row[4], version=row[5], input=secrets.unpack(row[6]), next_step=row[7],
        steps_total=row[8], last_checkpoint=row[9], last_event_seq=row[10],
        deadline_at=row[11], created_at=row[12], updated_at=row[13],
        error=_unpack(row[14]), output=_unpack(row[15]), step_failures=row[16],
        current_node=row[17], visits=dict(_unpack(row[18]) or {}),
        budget=dict(_unpack(row[19]) or {}), spent=dict(_unpack(row[20]) or {}),
        control=dict(_unpack(row[21]) or {}), traceparent=row[22],
        idempotency_key=row[23], definition_hash=row[24], sandbox=_unpack(row[25]),
    )
