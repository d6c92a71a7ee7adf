"""Keys for tests: a principal with exactly the roles a test needs, granted in the node's
keyring (as ``ratchet admin grant`` does), and a client that signs with it; a node whose
embedded NATS runs with the users it wrote (:class:`Secured`), and a raw NATS connection
holding a key, as an attacker would (:class:`Spy`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client as NATS

import ratchet
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.auth import Principal, Signer, inbox_prefix, new_seed
from ratchet.protocol.ids import new_id


async def grant(node: ratchet.Node, name: str, tenant: str, roles: list[str]) -> Signer:
    signer = Signer(new_seed())
    who = Principal(name=name, tenant=tenant, roles=frozenset(roles),
                    public_key=signer.public_key)
    assert node.store is not None
    now = node.clock.now()
    await node.store.grant_principal(who, now, AuditEntry(
        "_system", now, "test", "grant", new_id("cmd"), None, "ok", {"name": name}))
    node.authn.forget()  # as the grant verb does
    return signer


async def client_as(node: ratchet.Node, url: str, name: str, tenant: str,
                    roles: list[str], home: str | None = None) -> ratchet.Client:
    """A client of ``tenant`` signing as ``name`` (of ``home``, default the same tenant)."""
    signer = await grant(node, name, home or tenant, roles)
    return await ratchet.Client.connect(url, tenant, creds=signer)


async def publish_sealed(client: ratchet.Client, node: ratchet.Node, subject: str,
                         data: bytes) -> None:
    """Publish mail as a node of ``node``'s cluster would: sealed with its mail key (for
    tests of what the mail routers and task actors do with mail the runtime sent)."""
    await client.js.publish(subject, data, headers=node.seal.headers(subject, data))


async def issued(admin: ratchet.Client, name: str, tenant: str, roles: list[str],
                 **args: object) -> Signer:
    """A key made here and granted through the ``grant`` verb (``admin``: a client of
    ``_system`` signing as its operator), as ``ratchet creds`` does."""
    signer = Signer(new_seed())
    await admin.request_admin("grant", {"command_id": new_id("cmd"), "args": {
        "public_key": signer.public_key, "name": name, "tenant": tenant, "roles": roles,
        **args}})
    return signer


@dataclass
class Secured:
    node: ratchet.Node
    admin: ratchet.Client  # the state dir's local admin: _system, every role
    state: Path

    @property
    def url(self) -> str:
        assert self.node.url is not None
        return self.node.url

    def as_tenant(self, tenant: str) -> ratchet.Client:
        """The local admin acting in ``tenant`` (same connection and key)."""
        return ratchet.Client(self.admin.nc, tenant, self.admin.signer, self.admin.refusals)


class Spy:
    """A raw NATS connection holding a key, as an attacker would use it; it records the
    server's refusals."""

    def __init__(self, nc: NATS, errors: list[str], new: asyncio.Event,
                 closed: asyncio.Event) -> None:
        self.nc, self.errors, self._new, self.closed = nc, errors, new, closed

    @classmethod
    async def connect(cls, url: str, signer: Signer) -> Spy:
        errors: list[str] = []
        new, closed = asyncio.Event(), asyncio.Event()

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())
            new.set()

        async def on_closed() -> None:
            closed.set()

        nc = await nats.connect(url, nkeys_seed_str=signer.seed.decode(), error_cb=on_error,
                                inbox_prefix=inbox_prefix(signer.public_key),
                                allow_reconnect=False, closed_cb=on_closed)
        return cls(nc, errors, new, closed)

    async def refused(self, subject: str, timeout: float = 5.0) -> None:
        """Wait (bounded) for the server's permissions violation naming ``subject``."""
        quoted = f'"{subject.lower()}"'

        async def seen() -> None:
            while True:
                self._new.clear()
                if any("permissions violation" in e and quoted in e for e in self.errors):
                    return
                await self._new.wait()

        await asyncio.wait_for(seen(), timeout)

    async def close(self) -> None:
        await self.nc.close()
