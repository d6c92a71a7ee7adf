"""The admin service's rows: the audit log (a hash chain) and command ids."""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Any

import msgpack

from ratchet.protocol.codec import canonical

__all__ = ["AuditEntry", "append_audit_txn", "claim_command_txn", "release_command_txn",
           "store_reply_txn", "verify_audit_rows", "entry_hash"]

GENESIS = "sha256:" + "0" * 64
#: A command claimed this long ago without an answer is taken as abandoned.
STALE_CLAIM_S = 60.0


@dataclass(frozen=True)
class AuditEntry:
    tenant: str
    at: float
    principal: str
    verb: str
    command_id: str
    task_id: str | None
    outcome: str  # "requested", then "ok" or an error code
    detail: dict[str, Any]


def entry_hash(prev: str, e: AuditEntry) -> str:
    body = canonical([prev, e.tenant, e.at, e.principal, e.verb, e.command_id, e.task_id,
                      e.outcome, e.detail])
    return "sha256:" + hashlib.sha256(body).hexdigest()


def append_audit_txn(conn: sqlite3.Connection, e: AuditEntry) -> int:
    row = conn.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    prev = row[0] if row else GENESIS
    cur = conn.execute(
        "INSERT INTO audit(tenant, at, principal, verb, command_id, task_id, outcome, detail,"
        " prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (e.tenant, e.at, e.principal, e.verb, e.command_id, e.task_id, e.outcome,
         msgpack.packb(e.detail, use_bin_type=True), prev, entry_hash(prev, e)))
    return int(cur.lastrowid or 0)


def claim_command_txn(conn: sqlite3.Connection, tenant: str, command_id: str, verb: str,
                      request_hash: str, now: float) -> tuple[str, Any]:
    """``("new", None)``, ``("repeat", stored reply)`` (None while the first is still
    running) or ``("conflict", None)`` when the id was used for another request."""
    row = conn.execute(
        "SELECT request_hash, reply, created_at FROM admin_commands WHERE tenant = ?"
        " AND command_id = ?", (tenant, command_id)).fetchone()
    if row is not None and row[1] is None and now - row[2] > STALE_CLAIM_S:
        # Claimed but never answered (the node died mid-command): run it again.
        conn.execute("DELETE FROM admin_commands WHERE tenant = ? AND command_id = ?",
                     (tenant, command_id))
        row = None
    if row is None:
        conn.execute(
            "INSERT INTO admin_commands(tenant, command_id, verb, request_hash, created_at)"
            " VALUES (?,?,?,?,?)", (tenant, command_id, verb, request_hash, now))
        return ("new", None)
    if row[0] != request_hash:
        return ("conflict", None)
    return ("repeat", None if row[1] is None else msgpack.unpackb(row[1], raw=False))


def release_command_txn(conn: sqlite3.Connection, tenant: str, command_id: str) -> None:
    """Forget a claim whose answer must not be replayed (a retryable error)."""
    conn.execute("DELETE FROM admin_commands WHERE tenant = ? AND command_id = ?",
                 (tenant, command_id))


def store_reply_txn(conn: sqlite3.Connection, tenant: str, command_id: str,
                    reply: dict[str, Any]) -> None:
    conn.execute("UPDATE admin_commands SET reply = ? WHERE tenant = ? AND command_id = ?",
                 (msgpack.packb(reply, use_bin_type=True), tenant, command_id))


def verify_audit_rows(rows: list[tuple[Any, ...]]) -> int | None:
    """The seq of the first entry whose hash does not chain, or None if all do."""
    prev = GENESIS
    for seq, tenant, at, principal, verb, command_id, task_id, outcome, detail, p, h in rows:
        e = AuditEntry(tenant, at, principal, verb, command_id, task_id, outcome,
                       dict(msgpack.unpackb(detail, raw=False)))
        if p != prev or h != entry_hash(prev, e):
            return int(seq)
        prev = h
    return None
