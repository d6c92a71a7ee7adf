"""Keys for tests: a principal with exactly the roles a test needs, granted in the node's
keyring (as ``ratchet admin grant`` does), and a client that signs with it."""

from __future__ import annotations

import ratchet
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.protocol.auth import Principal, Signer, new_seed
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


async def issued(admin: ratchet.Client, name: str, tenant: str, roles: list[str],
                 **args: object) -> Signer:
    """A key made here and granted through the ``grant`` verb (``admin``: a client of
    ``_system`` signing as its operator), as ``ratchet creds`` does."""
    signer = Signer(new_seed())
    await admin.request_admin("grant", {"command_id": new_id("cmd"), "args": {
        "public_key": signer.public_key, "name": name, "tenant": tenant, "roles": roles,
        **args}})
    return signer
