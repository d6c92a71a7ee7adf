"""Rows of workflow graphs written inside a task change: fan-out branches and approvals."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.protocol.errors import BranchSettled
from ratchet.protocol.redaction import pack_redacted

__all__ = [
    "ApprovalWrite",
    "BranchStep",
    "BranchWrites",
    "finish_branch_txn",
    "write_approval",
    "write_branches",
]


@dataclass(frozen=True, slots=True)
class BranchStep:
    """A branch's progress after a committed step: where it goes on, its state and node
    visits there (msgpack, secrets sealed) and how many steps it has committed."""

    branch: str
    next_node: str
    state: bytes
    visits: bytes
    steps: int


@dataclass(slots=True)
class BranchWrites:
    """Start branches of a fan-out (``start``), record a running branch's progress
    (``steps``), count a retry of a running branch (``retried``), run a settled one again
    (``reopen``: FAILED or TIMED_OUT back to RUNNING, keeping its progress), or settle the
    ones still RUNNING (``settle``: branch → status) when the join decided. ``placed``:
    of the ``start`` branches, where each runs (its partition) and its initial state
    (msgpack, secrets sealed), so that the owner of that partition can run it (migration 24)."""

    node: str
    start: list[str] = field(default_factory=list)
    placed: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    settle: dict[str, str] = field(default_factory=dict)
    steps: list[BranchStep] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    reopen: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ApprovalWrite:
    approval_id: str
    status: str
    insert: bool = False
    node: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    request_hash: str = ""
    approvers: str = ""
    expires_at: float | None = None
    decided_by: str | None = None
    reason: str | None = None


def write_branches(conn: sqlite3.Connection, task_id: str, b: BranchWrites, now: float) -> None:
    if b.start and b.placed:
        conn.executemany(
            "INSERT OR IGNORE INTO branches(task_id, node, branch, status, started_at,"
            " partition, input) VALUES (?,?,?,'RUNNING',?,?,?)",
            [(task_id, b.node, name, now, *b.placed[name]) for name in b.start])
    elif b.start:
        conn.executemany(
            "INSERT OR IGNORE INTO branches(task_id, node, branch, status, started_at)"
            " VALUES (?,?,?,'RUNNING',?)", [(task_id, b.node, name, now) for name in b.start])
    for step in b.steps:
        # Only a RUNNING branch goes on; one settled meanwhile (its timeout, its join's
        # verdict) rolls the whole change back: its step's event must not be recorded.
        cur = conn.execute(
            "UPDATE branches SET next_node = ?, state = ?, visits = ?, steps = ?"
            " WHERE task_id = ? AND node = ? AND branch = ? AND status = 'RUNNING'",
            (step.next_node, step.state, step.visits, step.steps, task_id, b.node,
             step.branch))
        _one(cur, task_id, b.node, step.branch)
    for branch in b.retried:
        _one(conn.execute(
            "UPDATE branches SET attempts = attempts + 1 WHERE task_id = ? AND node = ?"
            " AND branch = ? AND status = 'RUNNING'", (task_id, b.node, branch)),
            task_id, b.node, branch)
    for branch in b.reopen:
        _one(conn.execute(
            "UPDATE branches SET status = 'RUNNING', result = NULL, error = NULL,"
            " finished_at = NULL, attempts = attempts + 1 WHERE task_id = ? AND node = ?"
            " AND branch = ? AND status IN ('FAILED', 'TIMED_OUT')", (task_id, b.node, branch)),
            task_id, b.node, branch, "is not FAILED or TIMED_OUT")
    if b.settle:
        conn.executemany(
            "UPDATE branches SET status = ?, finished_at = ? WHERE task_id = ? AND node = ?"
            " AND branch = ? AND status = 'RUNNING'",
            [(status, now, task_id, b.node, name) for name, status in b.settle.items()])


def _one(cur: sqlite3.Cursor, task_id: str, node: str, branch: str,
         why: str = "is no longer running") -> None:
    """The branch's row was updated, or the whole change rolls back."""
    if cur.rowcount != 1:
        raise BranchSettled(f"branch {branch} of {node} {why}", task_id=task_id)


def finish_branch_txn(conn: sqlite3.Connection, task_id: str, node: str, branch: str,
                      status: str, result: Any, error: dict[str, Any] | None, now: float,
                      default: Callable[[Any], Any] | None = None) -> bool:
    """Settle one RUNNING branch; False when it was already settled (a repeat, or a
    timeout that got there first), in which case nothing is written. ``default``: msgpack's
    hook for the result (a store's ``secrets.default`` seals its secrets)."""
    cur = conn.execute(
        "UPDATE branches SET status = ?, result = ?, error = ?, finished_at = ?"
        " WHERE task_id = ? AND node = ? AND branch = ? AND status = 'RUNNING'",
        (status, None if result is None else msgpack.packb(result, use_bin_type=True,
                                                           default=default),
         None if error is None else pack_redacted(error), now,
         task_id, node, branch))
    return cur.rowcount == 1


def write_approval(conn: sqlite3.Connection, task_id: str, a: ApprovalWrite, now: float) -> None:
    if a.insert:
        conn.execute(
            "INSERT INTO approvals(approval_id, task_id, node, request, request_hash, approvers,"
            " status, expires_at, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (a.approval_id, task_id, a.node, pack_redacted(a.request),
             a.request_hash, a.approvers, a.status, a.expires_at, now))
        return
    cur = conn.execute(
        "UPDATE approvals SET status = ?, decided_by = ?, reason = ?, decided_at = ?"
        " WHERE approval_id = ? AND task_id = ? AND status = 'PENDING'",
        (a.status, a.decided_by, a.reason, now, a.approval_id, task_id))
    if cur.rowcount != 1:
        raise ValueError(f"approval {a.approval_id} is not pending")
