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


async def publish_sealed(client: ratchet.Client, node: ratchet.Node, subject: str,
                         data: bytes) -> None:
    """Publish mail as a node of ``node``'s cluster would: sealed with its mail key (for
    tests of what the mail routers and task actors do with mail the runtime sent)."""
    await client.js.publish(subject, data, headers=node.seal.headers(subject, data))
