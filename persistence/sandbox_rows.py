"""A sandbox fork's marks on its task row (``tasks.sandbox``, migration 21), written in the
fork's own transaction (persistence/fork.py).

The marks: ``source`` (the task it was forked from), ``lineage`` (the source and the tasks
the source was itself forked from, nearest first: whose ledger a ``recorded`` write and
``--reuse-model`` may answer from) and ``reuse_model``. Every later write transaction of
the task reads the column with the task row and publishes its events under
``ratchet.sandbox.events.…`` (persistence/txns.py); the fork's first event, written by the
submission it shares with any new task, is moved there here, before anything is published.

A fork of a sandbox fork is a sandbox too: nothing recorded under a simulator's answers may
reach a provider by being forked again.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from ratchet.persistence.checkpoints import decode_optional
from ratchet.persistence.txn_events import OutboxRow

__all__ = ["MAX_LINEAGE", "SandboxFork", "mark_sandbox_txn", "to_sandbox_subject"]

#: How far back ``lineage`` follows ``fork_of`` (a fork of a fork of ...).
MAX_LINEAGE = 32


@dataclass(frozen=True, slots=True)
class SandboxFork:
    """What ``admin fork --sandbox`` asks for."""

    reuse_model: bool = False  # agent model calls answered from the source's recorded turns


def to_sandbox_subject(subject: str) -> str:
    """``ratchet.events.<tenant>.<task>.<type>`` as the sandbox's subject
    (protocol/subjects.py ``sandbox_event_subject``); any other subject as it is."""
    if subject.startswith("ratchet.events."):
        return "ratchet.sandbox." + subject.removeprefix("ratchet.")
    return subject


def mark_sandbox_txn(conn: sqlite3.Connection, task_id: str, source: str,
                     wanted: SandboxFork | None, outbox: list[OutboxRow]
                     ) -> tuple[dict[str, Any] | None, list[OutboxRow]]:
    """Mark the new fork ``task_id`` of ``source`` a sandbox when asked, or when ``source``
    is one; returns its marks (None: not a sandbox) and ``outbox`` with its event rows moved
    to the sandbox's subjects."""
    row = conn.execute("SELECT sandbox FROM tasks WHERE task_id = ?", (source,)).fetchone()
    inherited: dict[str, Any] | None = decode_optional(row[0]) if row else None
    if wanted is None and inherited is None:
        return None, outbox
    reuse = wanted.reuse_model if wanted is not None else bool(inherited and
                                                               inherited.get("reuse_model"))
    marks = {"source": source, "lineage": _lineage(conn, source), "reuse_model": reuse}
    conn.execute("UPDATE tasks SET sandbox = ? WHERE task_id = ?",
                 (msgpack.packb(marks, use_bin_type=True), task_id))
    moved: list[OutboxRow] = []
    for out in outbox:
        subject = to_sandbox_subject(out.subject)
        if subject != out.subject:
            conn.execute("UPDATE outbox SET subject = ? WHERE id = ?", (subject, out.id))
            out = replace(out, subject=subject)
        moved.append(out)
    return marks, moved


def _lineage(conn: sqlite3.Connection, source: str) -> list[str]:
    """``source``, then what it was forked from, and so on (at most MAX_LINEAGE)."""
    lineage = [source]
    while len(lineage) < MAX_LINEAGE:
        row = conn.execute("SELECT fork_of FROM tasks WHERE task_id = ?",
                           (lineage[-1],)).fetchone()
        if row is None or row[0] is None or row[0] in lineage:
            break
        lineage.append(row[0])
    return lineage
