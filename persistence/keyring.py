"""The keyring: which public keys act as whom (docs/security.md), the cluster's own
secrets, and the key the store's sealed secrets need (docs/security-secrets.md). Changed only through audited admin verbs (grant, revoke) and a node's bootstrap
of its local operator key; every change writes its audit entry in the same transaction.
A mixin of :class:`~ratchet.persistence.store.Store`."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from ratchet.persistence.admin_rows import AuditEntry, append_audit_txn
from ratchet.persistence.audit_key import claim_audit_key_txn
from ratchet.persistence.audit_seal import AuditHead, AuditSeal
from ratchet.persistence.store_rows import _StoreParts
from ratchet.protocol.auth import Principal
from ratchet.protocol.errors import SecretUnreadable
from ratchet.protocol.secrets import Sealer

__all__ = ["KeyringRows"]

_COLUMNS = "public_key, name, tenant, roles, expires_at"


def _principal(row: Any) -> Principal:
    return Principal(name=row[1], tenant=row[2], roles=frozenset(row[3].split()),
                     public_key=row[0], expires_at=row[4])


def _grant_txn(conn: sqlite3.Connection, who: Principal, at: float, audit: AuditEntry,
               seal: AuditSeal | None) -> AuditHead | None:
    """Add (or re-grant) a key; the audit head to advance to, or None if the key was
    already granted exactly so (nothing written)."""
    row = conn.execute(f"SELECT {_COLUMNS}, revoked_at FROM principals WHERE public_key = ?",
                       (who.public_key,)).fetchone()
    if row is not None and row[5] is None and _principal(row) == who:
        return None
    conn.execute(
        "INSERT OR REPLACE INTO principals(public_key, name, tenant, roles, expires_at,"
        " created_at, revoked_at, granted_by) VALUES (?,?,?,?,?,?,NULL,?)",
        (who.public_key, who.name, who.tenant, " ".join(sorted(who.roles)), who.expires_at,
         at, audit.principal))
    return append_audit_txn(conn, audit, seal)


def _revoke_txn(conn: sqlite3.Connection, tenant: str, name: str, at: float,
                audit: AuditEntry, seal: AuditSeal | None) -> tuple[int, AuditHead | None]:
    cur = conn.execute("UPDATE principals SET revoked_at = ? WHERE tenant = ? AND name = ?"
                       " AND revoked_at IS NULL", (at, tenant, name))
    if not cur.rowcount:
        return 0, None
    return int(cur.rowcount), append_audit_txn(conn, audit, seal)


def _secret_txn(conn: sqlite3.Connection, name: str) -> bytes:
    row = conn.execute("SELECT value FROM cluster_secrets WHERE name = ?", (name,)).fetchone()
    if row is not None:
        return bytes(row[0])
    value = os.urandom(32)
    conn.execute("INSERT INTO cluster_secrets(name, value) VALUES (?, ?)", (name, value))
    return value


class KeyringRows(_StoreParts):

    async def principals(self) -> list[Principal]:
        """Every key not revoked (expired ones included: the caller checks expiry)."""
        rows = await self._rows(f"SELECT {_COLUMNS} FROM principals WHERE revoked_at IS NULL")
        return [_principal(r) for r in rows]

    async def grant_principal(self, who: Principal, at: float, audit: AuditEntry) -> bool:
        head: AuditHead | None = await self._writer.submit(
            lambda c: _grant_txn(c, who, at, audit, self.audit_seal))
        if head is not None:
            await self._advance_head(head)
        return head is not None

    async def revoke_principal(self, tenant: str, name: str, at: float,
                               audit: AuditEntry) -> int:
        revoked, head = await self._writer.submit(
            lambda c: _revoke_txn(c, tenant, name, at, audit, self.audit_seal))
        if head is not None:
            await self._advance_head(head)
        return int(revoked)

    async def cluster_secret(self, name: str) -> bytes:
        """A random 32-byte secret shared by every node of this store (created once)."""
        value: bytes = await self._writer.submit(lambda c: _secret_txn(c, name))
        return value

    async def claim_audit_key(self) -> bool:
        """Check the audit seal's key against the store's (persistence/audit_key.py),
        recording it on the first start; True when recorded now, False without a seal.

        Raises:
            StartRefused: AUDIT_KEY_MISMATCH, the chain is sealed under another key.
        """
        seal = self.audit_seal
        if seal is None:
            return False
        recorded: bool = await self._writer.submit(lambda c: claim_audit_key_txn(c, seal))
        return recorded

    async def use_secrets(self, sealer: Sealer) -> None:
        """Seal and open secrets with ``sealer`` from now on. The first key a store is used
        with is recorded (``secret_keys``); another key is refused, before anything is read
        with it: what it would seal could not be read with the first, nor the reverse.

        Raises:
            SecretUnreadable: the store's secrets are sealed under another key.
        """
        key_id = sealer.key_id

        def txn(conn: sqlite3.Connection) -> None:
            known = [r[0] for r in conn.execute("SELECT key_id FROM secret_keys")]
            if known and key_id not in known:
                raise SecretUnreadable(
                    f"this store's secrets are sealed under key {known[0]}, and the key given"
                    f" is {key_id}: start with the store's key (RATCHET_SECRET_KEY, or"
                    " <state_dir>/keys/secrets.key)", key_id=key_id, store_key_ids=known)
            if not known:
                conn.execute("INSERT INTO secret_keys(key_id, created_at) VALUES (?,?)",
                             (key_id, time.time()))

        if key_id is not None:
            await self._writer.submit(txn)
        self.secrets = sealer

    async def secret_key_ids(self) -> list[str]:
        """The keys this store's secrets are sealed under (none before its first key)."""
        return [r[0] for r in await self._rows("SELECT key_id FROM secret_keys")]
