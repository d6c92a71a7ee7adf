"""Fork: a new execution branch of a task from any of its historical checkpoints.

The new task (``fork_of`` the original) starts QUEUED at the node the checkpoint was about
to run, with the state the checkpoint held — its values are referenced, never copied, so
large values stay one blob. The original's rows are only read. Side effects completed
before the fork point are not repeated: the ledger is keyed by the business action, so the
fork finds their recorded results when it calls them again (and a changed request under
the same key is a conflict, never a second effect). A sandbox fork (``sandbox``) is marked
so in the same transaction (persistence/sandbox_rows.py).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from ratchet.persistence.sandbox_rows import SandboxFork, mark_sandbox_txn
from ratchet.persistence.txns import NewTask, accept_submission_txn
from ratchet.protocol.errors import NotFound

__all__ = ["ForkRequest", "fork_txn"]


@dataclass(frozen=True)
class ForkRequest:
    source: str
    checkpoint: int | None  # None: the latest
    new: NewTask  # the new task's row (its input possibly changed)
    sandbox: SandboxFork | None = None  # a sandbox fork (a fork of one is one anyway)


def fork_txn(conn: sqlite3.Connection, fork: ForkRequest) -> dict[str, Any]:
    src = conn.execute("SELECT last_checkpoint, budget FROM tasks WHERE task_id = ?",
                       (fork.source,)).fetchone()
    if src is None:
        raise NotFound("no such task", task_id=fork.source)
    seq = fork.checkpoint if fork.checkpoint is not None else src[0]
    cp = conn.execute("SELECT next_step, next_node FROM checkpoints WHERE task_id = ? AND seq = ?",
                      (fork.source, seq)).fetchone()
    if seq and cp is None:
        raise NotFound("no such checkpoint", task_id=fork.source, checkpoint=seq)
    result = accept_submission_txn(conn, fork.new)
    task_id, now = fork.new.task_id, fork.new.now
    next_step, next_node = (cp[0], cp[1]) if cp else (0, None)
    if seq:
        conn.execute(
            "INSERT INTO checkpoints(task_id, seq, step_index, step_name, next_step, next_node,"
            " created_at) VALUES (?,?,?,?,?,?,?)",
            (task_id, 1, 0, f"fork of {fork.source}@{seq}", next_step, next_node, now))
        conn.execute(
            "INSERT INTO checkpoint_values(task_id, key, seq, inline, blob, deleted)"
            " SELECT ?, v.key, 1, v.inline, v.blob, v.deleted FROM checkpoint_values v"
            " JOIN (SELECT key, MAX(seq) AS seq FROM checkpoint_values"
            "       WHERE task_id = ? AND seq <= ? GROUP BY key) last"
            " ON v.key = last.key AND v.seq = last.seq WHERE v.task_id = ? AND v.deleted = 0",
            (task_id, fork.source, seq, fork.source))
    conn.execute(
        "UPDATE tasks SET fork_of = ?, next_step = ?, current_node = ?, last_checkpoint = ?,"
        " budget = ? WHERE task_id = ?",
        (fork.source, next_step, next_node, 1 if seq else 0, src[1], task_id))
    marks, outbox = mark_sandbox_txn(conn, task_id, fork.source, fork.sandbox, result.outbox)
    return {"task_id": task_id, "fork_of": fork.source, "from_checkpoint": seq,
            "next_node": next_node, "sandbox": marks, "outbox": outbox}
