"""The admin service's keyring verbs — ``grant``, ``revoke`` and ``keys`` — a mixin of
:class:`~supervisors.services.admin.AdminActor` (docs/security.md, "Keys and principals").

Cluster verbs: accepted only on ``ratchet.admin._system.<verb>``, so only a ``_system``
operator may change who acts as whom (a tenant's operator cannot grant itself ``_system``).
Each change writes its audit entry in the same transaction as the keyring row (the key,
the name, the tenant and the roles; a seed never reaches the node), then the node reads
the keyring again and its NATS server's users follow (supervisors/node/nats_auth.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.ports import KeyringStore
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.auth import ROLES, Principal, check_public_key
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import InvalidMessage, NotFound
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.subjects import check_token
from ratchet.supervisors.services.authn import Authenticator

__all__ = ["KeyVerbs", "KeyringHooks"]


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class KeyringHooks:
    """What the node does about a keyring change, and the keys that are never principals."""

    #: After a grant or a revoke: rewrite the NATS server's users and reload it. Awaited
    #: before the answer, so a key granted can connect once the grant is answered.
    changed: Callable[[], Awaitable[None]] = _nothing
    #: The nodes' own keys (they have every NATS permission; granting one is refused).
    reserved: frozenset[str] = field(default_factory=frozenset)


def _roles(value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not value or not all(isinstance(r, str) for r in value):
        raise InvalidMessage("args.roles must be a non-empty list of role names",
                             field="roles", known=sorted(ROLES))
    unknown = sorted(set(value) - ROLES)
    if unknown:
        raise InvalidMessage(f"unknown roles {unknown}", field="roles", known=sorted(ROLES))
    return frozenset(value)


def _expires_in(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidMessage("args.expires_in_s must be a positive number of seconds",
                             field="expires_in_s")
    return float(value)


def describe(who: Principal, now: float) -> dict[str, Any]:
    """A keyring entry as the verbs answer it: never a seed (the node has none)."""
    return {"name": who.name, "tenant": who.tenant, "roles": sorted(who.roles),
            "public_key": who.public_key, "expires_at": who.expires_at,
            "expired": who.expires_at is not None and now >= who.expires_at,
            "inbox_prefix": who.inbox_prefix}


class KeyVerbs:
    store: KeyringStore
    clock: Clock
    authn: Authenticator
    keyring: KeyringHooks

    @staticmethod
    def _token_arg(cmd: AdminCommand, name: str) -> str:
        value = cmd.args.get(name)
        if not isinstance(value, str):
            raise InvalidMessage(f"args.{name} is required", field=name)
        return check_token(value, name)

    async def _changed(self) -> None:
        self.authn.forget()  # the next request reads the keyring again
        await self.keyring.changed()

    async def _grant(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Add a public key to the keyring as ``name`` of ``tenant`` with ``roles``
        (``expires_in_s``: refused that many seconds from now). Granting a key again
        replaces its entry."""
        key = cmd.args.get("public_key")
        if not isinstance(key, str):
            raise InvalidMessage("args.public_key is required (a user nkey, U…)",
                                 field="public_key")
        check_public_key(key)
        if key in self.keyring.reserved:
            raise InvalidMessage("this is a node's key, not a principal's", field="public_key")
        name, target = self._token_arg(cmd, "name"), self._token_arg(cmd, "tenant")
        roles, expires_in = _roles(cmd.args.get("roles")), _expires_in(
            cmd.args.get("expires_in_s"))
        # Expiry is judged on the wall clock, as signatures are (supervisors/services/authn.py).
        wall = self.authn.clock.now()
        who = Principal(name=name, tenant=target, roles=roles, public_key=key,
                        expires_at=None if expires_in is None else wall + expires_in)
        by = cmd.principal.name if cmd.principal is not None else "unknown"
        at = self.clock.now()
        audit = AuditEntry(SYSTEM_TENANT, at, by, "grant", cmd.command_id, None, "ok",
                           {"name": name, "tenant": target, "roles": sorted(roles), "key": key,
                            "expires_at": who.expires_at})
        changed = await self.store.grant_principal(who, at, audit)
        await self._changed()
        return {**describe(who, wall), "changed": changed}

    async def _revoke(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Revoke every key of ``name`` in ``tenant``: its requests are refused at once and
        its NATS connections closed when the server reloads its users."""
        name, target = self._token_arg(cmd, "name"), self._token_arg(cmd, "tenant")
        keys = [p.public_key for p in await self.store.principals()
                if p.tenant == target and p.name == name]
        by = cmd.principal.name if cmd.principal is not None else "unknown"
        at = self.clock.now()
        audit = AuditEntry(SYSTEM_TENANT, at, by, "revoke", cmd.command_id, None, "ok",
                           {"name": name, "tenant": target, "keys": keys})
        revoked = await self.store.revoke_principal(target, name, at, audit)
        if not revoked:
            raise NotFound("no such key", name=name, tenant=target)
        await self._changed()
        return {"name": name, "tenant": target, "revoked": revoked, "keys": keys}

    async def _keys(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """The keyring (keys not revoked), optionally of one tenant (``args.tenant``)."""
        only = cmd.args.get("tenant")
        if only is not None:
            only = self._token_arg(cmd, "tenant")
        wall = self.authn.clock.now()
        found = sorted((p for p in await self.store.principals()
                        if only is None or p.tenant == only),
                       key=lambda p: (p.tenant, p.name, p.public_key))
        return {"keys": [describe(p, wall) for p in found]}
