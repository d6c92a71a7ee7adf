"""A node's own credentials under its state directory (docs/security.md).

``<state_dir>`` is 0700 and the database 0600. ``keys/local-admin.nk`` is the local operator's
key: created on first start, granted every role in every tenant (principal ``local-admin`` of
``_system``) with an audit entry, and used by the CLI on this machine without flags — as
``ssh-keygen`` does for a host, whoever can read the state dir is its administrator.
``keys/node.nk`` is the node's own NATS identity (every subject; supervisors/node/nats_auth.py):
never a principal, it signs no request.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ratchet.actors.transport.client import Client
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.ports import KeyringStore
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.auth import ROLES, Principal, Signer, new_seed, write_key_file
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.ids import new_id

__all__ = ["ADMIN_NAME", "admin_key_path", "bootstrap_admin", "ensure_key", "issue_key",
           "node_key_path", "secure_state_dir"]

ADMIN_NAME = "local-admin"


def admin_key_path(state_dir: Path) -> Path:
    return Path(state_dir) / "keys" / "local-admin.nk"


def node_key_path(state_dir: Path) -> Path:
    return (Path(state_dir) / "keys" / "node").with_suffix(".nk")


def ensure_key(path: Path) -> Signer:
    """The key in ``path``, created (0600) if there is none."""
    if not path.exists():
        write_key_file(path, new_seed())
    return Signer.from_file(path)


def secure_state_dir(state_dir: Path, db_path: Path) -> None:
    """The state dir 0700 and the database file 0600 (created empty, which SQLite takes as
    a new database, so it is never readable by others even for a moment)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state_dir, 0o700)
    fd = os.open(db_path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for path in (db_path, db_path.with_name(db_path.name + "-wal"),
                 db_path.with_name(db_path.name + "-shm")):
        if path.exists():
            os.chmod(path, 0o600)


async def bootstrap_admin(store: KeyringStore, state_dir: Path, clock: Clock,
                          node_id: str) -> Signer:
    """Grant this state dir's admin key every role everywhere (once; audited)."""
    signer = ensure_key(admin_key_path(state_dir))
    who = Principal(name=ADMIN_NAME, tenant=SYSTEM_TENANT, roles=ROLES,
                    public_key=signer.public_key)
    now = clock.now()
    audit = AuditEntry(SYSTEM_TENANT, now, f"node:{node_id}", "grant", new_id("boot"), None,
                       "ok", {"name": who.name, "tenant": who.tenant, "key": who.public_key,
                              "roles": sorted(who.roles), "reason": "bootstrap"})
    await store.grant_principal(who, now, audit)
    return signer


async def issue_key(admin: Client, out: Path, name: str, tenant: str, roles: list[str],
                    expires_in: float | None = None) -> dict[str, Any]:
    """``ratchet creds``: a new key pair made here, its public key granted through
    ``admin`` (a client of tenant ``_system`` signing as an operator of it), its seed
    written to ``out`` (0600). The seed never leaves this machine.

    The file is written first (an existing one is never replaced) and removed if the grant
    is refused, so a key is either granted with its seed on disk or not at all."""
    if out.exists():
        raise InvalidMessage(f"{out} exists: choose another --out (a key is never replaced)",
                             field="out")
    seed = new_seed()
    write_key_file(out, seed)
    public_key = Signer(seed).public_key
    args: dict[str, Any] = {"public_key": public_key, "name": name, "tenant": tenant,
                            "roles": roles}
    if expires_in is not None:
        args["expires_in_s"] = expires_in
    try:
        granted = await admin.request_admin("grant", {"command_id": new_id("cmd"),
                                                      "args": args})
    except BaseException:
        with contextlib.suppress(OSError):
            out.unlink()
        raise
    return {"name": granted["name"], "tenant": granted["tenant"], "roles": granted["roles"],
            "public_key": public_key, "expires_at": granted["expires_at"],
            "file": str(out), "inbox_prefix": granted["inbox_prefix"]}
