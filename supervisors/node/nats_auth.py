"""The NATS side of a node's credentials (docs/security.md, "NATS permissions").

The embedded server runs with ``<state_dir>/nats/nats.conf`` (0600), written here from the
keyring: the node's own key (``keys/node.nk``) with every permission, and one nkey user per
principal with the subjects of its tenant and roles (protocol/nats_permissions.py). There
is no anonymous user, so a connection without one of these keys is refused.

The file follows the keyring: after a grant or a revoke (the admin verbs await it), and at
every lease tick (keys that expired, grants made through another node of the same state
dir), the node renders it again and, if it changed, writes it and has the server reload it
(SIGHUP). A node that joined another's embedded server signals that server the same way.

A node on an external NATS authenticates with ``--nats-creds`` (an nkey seed, or a NATS
``.creds`` file of a JWT and a seed); ``ratchet nats-config`` prints the authorization
block of the keyring for that server's operator to include.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from ratchet.persistence.ports import KeyringStore
from ratchet.persistence.store import Store  # nats-config reads the keyring itself
from ratchet.persistence.store_select import open_store
from ratchet.protocol.auth import Signer, read_key_file
from ratchet.protocol.clock import SystemClock
from ratchet.protocol.nats_permissions import authorization_block
from ratchet.protocol.private_files import write_private
from ratchet.supervisors.node.credentials import (
    bootstrap_admin,
    ensure_key,
    node_key_path,
    secure_state_dir,
)
from ratchet.supervisors.node.embedded_nats import EmbeddedNats

__all__ = ["NatsAuthorization", "keyring_config", "nats_auth_options", "render_authorization"]

log = structlog.get_logger("ratchet.nats")

_HEADER = ("# Written by Ratchet from its keyring (docs/security.md) and rewritten at each\n"
           "# change: edit the keyring (ratchet creds, ratchet admin revoke), not this file.\n")


def nats_auth_options(creds: Path) -> dict[str, Any]:
    """``nats.connect`` options that authenticate with ``creds``: a user nkey seed
    (``SU…``, e.g. ``keys/node.nk``) or a NATS ``.creds`` file (a user JWT and its seed,
    for a server with decentralized auth)."""
    if "BEGIN NATS USER JWT" in Path(creds).read_text(errors="replace"):
        return {"user_credentials": str(creds)}
    return {"nkeys_seed_str": read_key_file(Path(creds)).decode()}


async def render_authorization(store: KeyringStore, node_key: str) -> str:
    """The authorization block for ``store``'s keyring and the node key ``node_key``."""
    return _HEADER + authorization_block(await store.principals(), [node_key])


class NatsAuthorization:
    """The embedded server's users: :meth:`write` before it starts, :meth:`refresh` after."""

    def __init__(self, state_dir: Path, store: KeyringStore) -> None:
        self.path = Path(state_dir) / "nats" / "nats.conf"
        self.node: Signer = ensure_key(node_key_path(Path(state_dir)))
        self.store = store
        self._lock = asyncio.Lock()  # a tick and a grant may refresh at once
        self._unloaded = False  # written, and the server's reload not confirmed yet

    def connect_options(self) -> dict[str, Any]:
        """How the node's own connection authenticates (its key: every permission)."""
        return {"nkeys_seed_str": self.node.seed.decode()}

    async def write(self) -> bool:
        """Write the file if the keyring (or an expiry) changed it; True if it did."""
        text = await render_authorization(self.store, self.node.public_key)
        try:
            if self.path.read_text() == text:
                return False
        except OSError:
            pass  # none yet
        write_private(self.path, text.encode())
        return True

    async def refresh(self, server: EmbeddedNats) -> None:
        """Bring the file up to date and, if it changed, have ``server`` reload it."""
        async with self._lock:
            if await self.write() or self._unloaded:
                self._unloaded = True  # until the server says it read it: retried next time
                await server.reload()
                self._unloaded = False
                log.info("nats users reloaded from the keyring", config=str(self.path))


async def keyring_config(state_dir: Path, store_url: str | None = None) -> str:
    """``ratchet nats-config``: the authorization block of the store's keyring, for an
    external nats-server. Read from the store directly (no node or NATS needed), after the
    bootstrap a node's first start does (its key, the local admin's), so that the block
    already admits the node and the local CLI. ``store_url``: a ``postgresql://`` store
    (``RATCHET_STORE``), else the state dir's SQLite file."""
    if store_url:
        Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        store = await open_store(store_url)
    else:
        db_path = Path(state_dir) / "ratchet.db"
        secure_state_dir(Path(state_dir), db_path)
        store = await Store.open(db_path)
    try:
        await bootstrap_admin(store, Path(state_dir), SystemClock(), "nats-config")
        return await render_authorization(store, ensure_key(node_key_path(state_dir)).public_key)
    finally:
        await store.close()
