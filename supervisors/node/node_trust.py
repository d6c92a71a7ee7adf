"""What a node sets up before it trusts anything, and checks once it serves: its state
dir locked down, the store opened with the audit chain's seal, the local admin's key
granted, the cluster's mail seal and the signature check, the secrets key; then the audit
chain verified (docs/security.md)."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from pathlib import Path

import structlog

from ratchet.persistence.audit_check import AuditReport
from ratchet.persistence.audit_seal import AuditSeal
from ratchet.persistence.ports import StorePort
from ratchet.persistence.records import Fence
from ratchet.persistence.store import Store  # the composition root: it opens the store
from ratchet.protocol.clock_guard import ClockGuard
from ratchet.protocol.errors import ErrorCode, StartRefused
from ratchet.protocol.mail_seal import MailSeal
from ratchet.protocol.secrets import Sealer
from ratchet.supervisors.node.audit_key import load_audit_key
from ratchet.supervisors.node.config import NodeConfig
from ratchet.supervisors.node.credentials import bootstrap_admin, secure_state_dir
from ratchet.supervisors.node.log_output import install_log_redaction
from ratchet.supervisors.node.node_events import NodeEvents
from ratchet.supervisors.node.pg_store import open_postgres
from ratchet.supervisors.node.secret_key import load_secret_key
from ratchet.supervisors.services.authn import Authenticator

__all__ = ["check_audit", "open_store", "trust", "unlock_secrets"]

log = structlog.get_logger("ratchet.node")


#: What the OS says of a file it will not let us write: no permission, an immutable
#: file (``chattr +i``, even for root), a read-only mount.
_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
#: SQLite's primary codes for the same: READONLY, CANTOPEN (no -wal or -shm beside it), PERM.
_SQLITE_UNWRITABLE = frozenset({8, 14, 3})


async def open_store(cfg: NodeConfig, fence: Fence) -> StorePort:
    """The store, in a private state dir, with the audit chain's key and head (which live
    in the state directory, not in the database).

    Raises:
        StartRefused: STORE_READ_ONLY, the state dir, the database or its WAL cannot be
            written; AUDIT_KEY_MISMATCH, the audit chain is under another key; for
            PostgreSQL (``cfg.store``) STORE_UNREACHABLE, SCHEMA_VERSION_MISMATCH
            (persistence/postgres/store.py); either way PARTITION_COUNT_MISMATCH later, at
            the leases' start.
    """
    key = load_audit_key(cfg.audit_key_file)  # None: the state dir's key file
    if cfg.store is not None:  # PostgreSQL: the state dir keeps the keys and the audit head
        return await _claim_audit_key(await open_postgres(cfg, fence, key))
    try:
        secure_state_dir(Path(cfg.state_dir), cfg.db_path)
        seal = await asyncio.to_thread(AuditSeal.open, Path(cfg.state_dir), key)
        store = await Store.open(cfg.db_path, cfg.synchronous, writer=cfg.writer,
                                 wal_limit=int(cfg.wal_limit_mb * 1024 * 1024), fence=fence,
                                 audit_seal=seal)
        store.dead_letter_limits = cfg.dead_letters
    except OSError as exc:
        if exc.errno not in _UNWRITABLE:
            raise
        raise _read_only(cfg, exc.strerror or repr(exc), exc.filename) from exc
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _SQLITE_UNWRITABLE:
            raise
        raise _read_only(cfg, str(exc), str(cfg.db_path)) from exc
    return await _claim_audit_key(store)


async def _claim_audit_key(store: StorePort) -> StorePort:
    """The store, once its audit chain is known to be under this node's key (the first
    start records the key's check value: persistence/audit_key.py).

    Raises:
        StartRefused: AUDIT_KEY_MISMATCH (the store is closed first).
    """
    try:
        await store.claim_audit_key()
    except StartRefused:
        await store.close()
        seal = getattr(store, "audit_seal", None)
        if seal is not None:  # what this start made under the refused key goes with it
            await asyncio.to_thread(seal.discard)
        raise
    return store


def _read_only(cfg: NodeConfig, reason: str, path: object) -> StartRefused:
    # A node that cannot write its store can do nothing: refuse at once, saying where.
    where = path or cfg.db_path
    return StartRefused(ErrorCode.STORE_READ_ONLY,
                        f"cannot write {where}: {reason}; the node needs its state dir and"
                        " database writable (check owner, mode, chattr +i, read-only mount)",
                        path=str(where), db=str(cfg.db_path))


async def trust(store: StorePort, cfg: NodeConfig,
                clock: ClockGuard) -> tuple[MailSeal, Authenticator]:
    """Grant the local admin key; the mail seal (the store's shared key) and the signature
    check; redacting logs. Not yet the secrets key: :func:`unlock_secrets`."""
    await bootstrap_admin(store, Path(cfg.state_dir), clock, cfg.node_id)
    seal = MailSeal(await store.cluster_secret("mail"))
    install_log_redaction()  # a secret of a live task never reaches a log line
    return seal, Authenticator(store, seal=seal, offsets=lambda: _clock_offsets(clock))


def _clock_offsets(clock: ClockGuard) -> tuple[float, ...]:
    clock.now()  # a step not yet noticed is noticed here, before the signature is judged
    last = clock.last_step
    return tuple(o for o in (clock.held, last.seconds if last else 0.0) if o)


async def unlock_secrets(store: StorePort, cfg: NodeConfig) -> None:
    """Raises SecretUnreadable when the key is not the one the store's secrets need."""
    key = load_secret_key(cfg.state_dir, sealed_under=await store.secret_key_ids())
    await store.use_secrets(Sealer(key))


async def check_audit(store: StorePort, events: NodeEvents) -> AuditReport | None:
    """Verify the audit chain against the seal, once, while the node already serves.

    A broken chain is logged (critical) and announced (``node.audit_tampered``), and the
    node goes on serving: refusing to start would hand whoever can edit the database a way
    to stop the service, and the evidence stays in the table for ``verify-audit``."""
    try:
        report = await store.verify_audit()
    except Exception as exc:  # the check is evidence, not a duty of the node
        log.error("audit chain not checked", error=repr(exc))
        return None
    if report.ok:
        log.info("audit chain verified", entries=report.entries, head_seq=report.head_seq)
        return report
    log.critical("audit chain tampered: entries edited, deleted or rewritten",
                 entries=report.entries, head_seq=report.head_seq,
                 problems=report.problems[:20], more=report.more_problems)
    events.audit_tampered(report)
    return report
