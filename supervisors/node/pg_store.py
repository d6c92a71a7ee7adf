"""A node's store on PostgreSQL (``serve --store postgresql://…``): the database holds
the tasks; the state dir still holds what is the node's own — its keys, the audit
chain's head and (unless the key is given, as nodes on several machines need) its key
(persistence/audit_seal.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ratchet.persistence.audit_seal import AuditSeal
from ratchet.persistence.ports import StorePort
from ratchet.persistence.records import Fence
from ratchet.persistence.store_select import open_store
from ratchet.supervisors.node.config import NodeConfig

__all__ = ["open_postgres"]


async def open_postgres(cfg: NodeConfig, fence: Fence,
                        audit_key: bytes | None = None) -> StorePort:
    """The PostgreSQL store ``cfg.store`` names, migrated, with the audit seal.

    Raises:
        StartRefused: STORE_UNREACHABLE (no connection), SCHEMA_VERSION_MISMATCH (a newer
            release migrated the database).
    """
    assert cfg.store is not None
    state_dir = Path(cfg.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state_dir, 0o700)
    # The audit key given (supervisors/node/audit_key.py), else the state dir's own file.
    seal = await asyncio.to_thread(AuditSeal.open, state_dir, audit_key)
    store = await open_store(cfg.store, fence=fence, audit_seal=seal)
    store.dead_letter_limits = cfg.dead_letters
    return store
