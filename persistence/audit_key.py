"""Which audit key a store's chain is under: its check value in the database.

Nodes on several machines share one store, so they must seal the audit chain under one key
(persistence/audit_seal.py), given to each (``RATCHET_AUDIT_KEY`` or ``--audit-key-file``).
A node given another key would see every other node's entry as forged and log
``audit chain tampered`` for ever, while its own entries would look forged to the others.
So the store keeps the key's check value (a MAC of a fixed string under the key, never
the key) in ``cluster_secrets`` under :data:`CHECK_NAME`, recorded by the first node that
starts with a seal, and a node whose key gives another check value is refused at start
(``AUDIT_KEY_MISMATCH``) before it writes or judges anything.

A store from before the check (no value yet) with keyed entries is judged by its newest
one: a key that does not verify it is refused too. That entry may also have been edited,
which the refusal's message says (``admin verify-audit`` with the first key tells); the
one thing a mismatch cannot be is taken for a tampered chain by a node that has the
right key, since the check value is compared before any entry.
"""

from __future__ import annotations

import sqlite3

import msgpack

from ratchet.persistence.admin_rows import AuditEntry, entry_fields
from ratchet.persistence.audit_seal import KEYED_PREFIX, AuditSeal
from ratchet.protocol.errors import ErrorCode, StartRefused

__all__ = ["CHECK_NAME", "claim_audit_key_txn"]

#: The ``cluster_secrets`` row that holds the audit key's check value (not a secret).
CHECK_NAME = "audit-key-check"


def claim_audit_key_txn(conn: sqlite3.Connection, seal: AuditSeal) -> bool:
    """Check ``seal``'s key against the store's check value, recording it if there is
    none; True when this call recorded it.

    Raises:
        StartRefused: AUDIT_KEY_MISMATCH, the store's chain is under another key.
    """
    check = seal.key_check()
    row = conn.execute("SELECT value FROM cluster_secrets WHERE name = ?",
                       (CHECK_NAME,)).fetchone()
    if row is not None:
        if bytes(row[0]).decode() != check:
            raise _mismatch("the store records another audit key's check value")
        return False
    newest = conn.execute("SELECT seq, tenant, at, principal, verb, command_id, task_id,"
                          " outcome, detail, prev_hash, hash FROM audit"
                          " ORDER BY seq DESC LIMIT 1").fetchone()
    if newest is not None and str(newest[10]).startswith(KEYED_PREFIX):
        entry = AuditEntry(newest[1], newest[2], newest[3], newest[4], newest[5], newest[6],
                           newest[7], dict(msgpack.unpackb(newest[8], raw=False)))
        if seal.entry_mac(int(newest[0]), entry_fields(str(newest[9]), entry)) != newest[10]:
            raise _mismatch(f"the newest audit entry ({newest[0]}) does not verify under this"
                            " key (another key wrote it, or it was edited: run `admin"
                            " verify-audit` on a node with the first key)")
    # Two nodes starting at once: the second's insert is a no-op, and its next start
    # compares against the first's value (one key either way, or that start is refused).
    conn.execute("INSERT INTO cluster_secrets(name, value) VALUES (?, ?)"
                 " ON CONFLICT(name) DO NOTHING", (CHECK_NAME, check.encode()))
    again = conn.execute("SELECT value FROM cluster_secrets WHERE name = ?",
                         (CHECK_NAME,)).fetchone()
    if again is not None and bytes(again[0]).decode() != check:
        raise _mismatch("another node recorded another audit key's check value just now")
    return True


def _mismatch(why: str) -> StartRefused:
    return StartRefused(
        ErrorCode.AUDIT_KEY_MISMATCH,
        f"this node's audit key is not the one the store's audit chain is sealed under:"
        f" {why}; start every node with the same key (RATCHET_AUDIT_KEY or"
        " --audit-key-file; docs/security.md, \"The audit key\")")
