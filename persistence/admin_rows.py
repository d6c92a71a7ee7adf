"""The admin service's rows: the audit log (a hash chain) and command ids.

The audit log records what people and operators did: every admin command (before it runs
and with its outcome), every approval decision a task applied or refused (also those on
``ratchet.decisions.<tenant>``, and the crash-loop handoffs they resolve), and credential
changes (verbs ``grant``, ``revoke``, ``bootstrap``). One chain per store, across tenants;
the key and the head that make it tamper-evident are in persistence/audit_seal.py, the
check in persistence/audit_check.py. When tracing, an entry's ``detail`` holds the
``trace_id`` of the span that wrote it (the command's, the task's; protocol/tracing.py).
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from ratchet.persistence.audit_seal import GENESIS, AuditHead, AuditSeal
from ratchet.protocol.codec import canonical
from ratchet.protocol.tracing import trace_id

__all__ = ["AuditEntry", "CREDENTIAL_VERBS", "append_audit_txn", "claim_command_txn",
           "credential_entry", "entry_fields", "entry_hash", "release_command_txn",
           "store_reply_txn", "GENESIS"]

#: The verbs of credential changes (issuing, revoking, the first operator's credential).
CREDENTIAL_VERBS = frozenset({"grant", "revoke", "bootstrap"})
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
    outcome: str  # "requested", then "ok" or an error code; a decision's "applied", ...
    detail: dict[str, Any]


def credential_entry(tenant: str, at: float, by: str, verb: str, command_id: str,
                     detail: dict[str, Any], outcome: str = "ok") -> AuditEntry:
    """The entry of a credential change: ``by`` granted, revoked or bootstrapped the
    credential ``detail`` describes (name, roles, key id; never the secret itself)."""
    if verb not in CREDENTIAL_VERBS:
        raise ValueError(f"not a credential verb: {verb!r}")
    return AuditEntry(tenant, at, by, verb, command_id, None, outcome, detail)


def entry_fields(prev: str, e: AuditEntry) -> list[Any]:
    """What an entry's hash covers (after its sequence number, for a keyed one)."""
    return [prev, e.tenant, e.at, e.principal, e.verb, e.command_id, e.task_id, e.outcome,
            e.detail]


def entry_hash(prev: str, e: AuditEntry) -> str:
    """The unkeyed hash: entries written before the store had a seal, or by a store opened
    without one (tools, tests). Anyone can recompute it; only the seal's MAC proves."""
    return "sha256:" + hashlib.sha256(canonical(entry_fields(prev, e))).hexdigest()


def append_audit_txn(conn: sqlite3.Connection, e: AuditEntry,
                     seal: AuditSeal | None = None) -> AuditHead:
    """Append ``e`` after the newest entry; returns the new head (to write once committed).

    The sequence number is chosen here rather than by AUTOINCREMENT, because a keyed hash
    covers it (renumbering entries breaks their MACs), and it is past the head's as well as
    past the table's newest: after the newest entries were deleted, the next entry leaves
    their numbers as a gap that verification reports for good, instead of taking them
    over and letting the head move on as if nothing had happened."""
    trace = trace_id()  # the command's trace, when tracing (protocol/tracing.py)
    if trace is not None and "trace_id" not in e.detail:
        e = replace(e, detail={**e.detail, "trace_id": trace})
    row = conn.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    last, prev = (row[0], row[1]) if row else (0, GENESIS)
    head, _ = seal.current_head() if seal else (None, None)
    seq = max(last, head.seq if head else 0) + 1
    digest = seal.entry_mac(seq, entry_fields(prev, e)) if seal else entry_hash(prev, e)
    conn.execute(
        "INSERT INTO audit(seq, tenant, at, principal, verb, command_id, task_id, outcome,"
        " detail, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (seq, e.tenant, e.at, e.principal, e.verb, e.command_id, e.task_id, e.outcome,
         msgpack.packb(e.detail, use_bin_type=True), prev, digest))
    first = conn.execute("SELECT MIN(seq) FROM audit").fetchone()[0]
    return AuditHead(seq, digest, seq - first + 1)  # contiguous from the first when intact


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
