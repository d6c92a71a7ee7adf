"""Rows a write transaction appends beside the task row: events (each with the outbox row
that publishes it), other outbox rows, and checkpoints with their values and blobs.

Called by the ``*_txn`` functions of ``persistence/txns.py``, inside their SAVEPOINT: like
them they must not BEGIN/COMMIT and must not touch the event loop.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import msgpack

from ratchet.persistence.blobs import write_blobs
from ratchet.persistence.checkpoints import StateDelta
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.events import encode_event, pack_payload
from ratchet.protocol.ids import new_id
from ratchet.protocol.subjects import event_subject, sandbox_event_subject
from ratchet.protocol.tracing import TRACEPARENT, add_events, current_traceparent

__all__ = [
    "OutboxRow",
    "CheckpointWrite",
    "insert_outbox",
    "append_events",
    "write_checkpoint",
]

#: Events that are not span events: a step span's end is its ``step.completed`` and
#: progress is a figure, and recording them would be ~25 µs a step (bench/tracing.py).
_ROUTINE = frozenset({EventType.STEP_COMPLETED.value, EventType.TASK_PROGRESS.value})


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


def insert_outbox(
    conn: sqlite3.Connection,
    subject: str,
    msg_id: str,
    payload: bytes,
    now: float,
    headers: dict[str, str] | None = None,
) -> OutboxRow:
    """Queue one message for the outbox relay (published after the transaction commits)."""
    packed_headers = msgpack.packb(headers) if headers else None
    cur = conn.execute(
        "INSERT INTO outbox(subject, msg_id, payload, headers, created_at) VALUES (?,?,?,?,?)",
        (subject, msg_id, payload, packed_headers, now),
    )
    return OutboxRow(int(cur.lastrowid or 0), subject, msg_id, payload, headers)


def append_events(
    conn: sqlite3.Connection,
    *,
    task_id: str,
    tenant: str,
    first_seq: int,
    version: int,
    producer: str,
    now: float,
    events: list[tuple[str, dict[str, Any]]],
    sandbox: bool = False,
) -> list[OutboxRow]:
    """Append ``events`` to the task's history from ``first_seq`` on, each with the outbox
    row that publishes it on the event stream (the table keeps the payload whole; the
    stream's copy is truncated past ``protocol.events.MAX_EVENT_PAYLOAD``). A sandbox
    fork's (``sandbox``) are published under ``ratchet.sandbox.events.…``, never on the
    production subjects (persistence/sandbox_rows.py).

    When tracing, each event's message carries the ``traceparent`` of the span that
    committed it, and the event (but a routine one) is a span event of that span
    (protocol/tracing.py)."""
    rows: list[OutboxRow] = []
    seq = first_seq
    traceparent = current_traceparent() if events else None  # None when tracing is off
    headers = {TRACEPARENT: traceparent} if traceparent else None
    spanned: list[tuple[str, dict[str, Any]]] = []  # span events of the current span
    subject_of = sandbox_event_subject if sandbox else event_subject
    for event_type, payload in events:
        event_id = new_id("evt")
        packed_payload = pack_payload(payload)
        conn.execute(
            "INSERT INTO events(task_id, sequence, event_id, type, aggregate_version,"
            " occurred_at, payload) VALUES (?,?,?,?,?,?,?)",
            (task_id, seq, event_id, event_type, version, now, packed_payload),
        )
        wire = encode_event(
            event_id=event_id, task_id=task_id, tenant=tenant, sequence=seq,
            event_type=event_type, aggregate_version=version, occurred_at=now,
            producer=producer, payload=payload, packed_payload=packed_payload)
        rows.append(insert_outbox(conn, subject_of(tenant, task_id, event_type), event_id, wire,
                                  now, headers))
        if headers is not None and event_type not in _ROUTINE:
            spanned.append((event_type, {"ratchet.sequence": seq}))
        seq += 1
    if spanned:
        add_events(spanned)
    return rows


def write_checkpoint(
    conn: sqlite3.Connection, task_id: str, seq: int, cp: CheckpointWrite, now: float
) -> None:
    """Write checkpoint ``seq``: its row, the new blobs (deduplicated by digest) and the
    state keys it changed."""
    conn.execute(
        "INSERT INTO checkpoints(task_id, seq, step_index, step_name, next_step, next_node,"
        " created_at) VALUES (?,?,?,?,?,?,?)",
        (task_id, seq, cp.step_index, cp.step_name, cp.next_step, cp.next_node, now),
    )
    write_blobs(conn, cp.delta.blobs, now)
    if cp.delta.values:
        conn.executemany(
            "INSERT INTO checkpoint_values(task_id, key, seq, inline, blob, deleted)"
            " VALUES (?,?,?,?,?,?)",
            [(task_id, v.key, seq, v.inline, v.blob, int(v.deleted)) for v in cp.delta.values],
        )
