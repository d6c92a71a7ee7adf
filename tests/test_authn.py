"""The node's check of signed requests against a real store's keyring: the key decides
who acts, in which tenant and with which roles; revoked, expired, unknown and replayed
keys are refused; replies go only under the signer's inbox."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

import ratchet
from ratchet.persistence.admin_rows import AuditEntry
from ratchet.persistence.store import Store
from ratchet.protocol.auth import Principal, Signer, new_seed
from ratchet.protocol.errors import PermissionDenied, Unauthenticated
from ratchet.supervisors.services.authn import Authenticator, may_reply


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "r.db")
    yield s
    await s.close()


async def _grant(store: Store, name: str, tenant: str, roles: list[str],
                 expires_at: float | None = None) -> Signer:
    signer = Signer(new_seed())
    who = Principal(name=name, tenant=tenant, roles=frozenset(roles),
                    public_key=signer.public_key, expires_at=expires_at)
    audit = AuditEntry("_system", 1.0, "test", "grant", f"g-{name}", None, "ok", {})
    assert await store.grant_principal(who, 1.0, audit)
    return signer


def _msg(signer: Signer | None, subject: str, data: bytes = b"x", now: float = 1000.0,
         **headers: Any) -> Msg:
    signed = signer.headers(subject, data, now) if signer else {}
    return Msg(_client=None, subject=subject, reply="", data=data,  # type: ignore[arg-type]
               headers={**signed, **headers})


async def test_the_key_decides_tenant_and_role(store: Store) -> None:
    clock = ratchet.FakeClock(start=1000.0)
    authn = Authenticator(store, clock)
    viewer = await _grant(store, "vic", "acme", ["viewer"])
    who = await authn.check(_msg(viewer, "ratchet.admin.acme.get"), "admin", "acme", "get")
    assert who.name == "vic" and who.tenant == "acme"
    with pytest.raises(PermissionDenied):
        await authn.check(_msg(viewer, "ratchet.admin.acme.cancel"), "admin", "acme", "cancel")
    with pytest.raises(PermissionDenied):
        await authn.check(_msg(viewer, "ratchet.admin.globex.get"), "admin", "globex", "get")
    with pytest.raises(PermissionDenied):  # approving takes an approver
        await authn.check(_msg(viewer, "ratchet.decisions.acme"), "decisions", "acme",
                          replay=False)
    root = await _grant(store, "root", "_system", ["operator"])
    clock.advance(0.3)  # a key unknown to the cache makes it read the keyring again
    assert (await authn.check(_msg(root, "ratchet.admin.globex.cancel"), "admin", "globex",
                              "cancel")).name == "root"


async def test_unknown_revoked_expired_and_replayed_keys_are_refused(store: Store) -> None:
    clock = ratchet.FakeClock(start=1000.0)
    authn = Authenticator(store, clock)
    with pytest.raises(Unauthenticated):  # unsigned
        await authn.check(_msg(None, "ratchet.api.acme.get"), "api", "acme", "get")
    with pytest.raises(Unauthenticated):  # never granted
        await authn.check(_msg(Signer(new_seed()), "ratchet.api.acme.get"), "api", "acme",
                          "get")
    short = await _grant(store, "tmp", "acme", ["producer"], expires_at=1500.0)
    authn.forget()
    msg = _msg(short, "ratchet.api.acme.get")
    await authn.check(msg, "api", "acme", "get")
    with pytest.raises(Unauthenticated):  # the same signed request again
        await authn.check(msg, "api", "acme", "get")
    clock.advance(600.0)
    with pytest.raises(Unauthenticated):  # expired
        await authn.check(_msg(short, "ratchet.api.acme.get", now=1600.0), "api", "acme", "get")
    kept = await _grant(store, "pat", "acme", ["producer"])
    authn.forget()  # as the grant verb does
    await authn.check(_msg(kept, "ratchet.api.acme.get", now=1600.0), "api", "acme", "get")
    audit = AuditEntry("_system", 1.0, "test", "revoke", "r-pat", None, "ok", {})
    assert await store.revoke_principal("acme", "pat", 1600.0, audit) == 1
    authn.forget()
    with pytest.raises(Unauthenticated):
        await authn.check(_msg(kept, "ratchet.api.acme.get", now=1601.0), "api", "acme", "get")
    assert authn.refused == {"UNAUTHENTICATED": 5}


def test_replies_go_only_under_the_signers_inbox() -> None:
    signer = Signer(new_seed())
    who = Principal(name="p", tenant="acme", roles=frozenset({"producer"}),
                    public_key=signer.public_key)
    assert may_reply(f"_INBOX.{signer.public_key}.abc.1", who)
    assert not may_reply("_INBOX.UOTHER.abc", who)
    assert not may_reply("ratchet.events.acme.tsk_1.task.succeeded", who)
    assert not may_reply("ratchet.events.acme.tsk_1.task.succeeded", None)
    assert may_reply("_INBOX.anything", None)  # an unsigned request's error answer
    assert not may_reply(None, who)


async def test_a_node_holding_a_forward_step_still_takes_requests_signed_on_real_time(
    store: Store
) -> None:
    clock = ratchet.FakeClock(start=1000.0 + 3600.0)  # the node's wall clock, an hour ahead
    held = 3600.0
    authn = Authenticator(store, clock, offsets=lambda: (held,) if held else ())
    signer = await _grant(store, "olga", "_system", ["operator"])
    # Signed by an operator whose clock is right: accepted while the node holds the step
    # (so clock-ack can reach it), refused once the node believes its clock again.
    await authn.check(_msg(signer, "ratchet.admin._system.clock-ack", now=1000.0), "admin",
                      "_system", "clock-ack")
    held = 0.0
    with pytest.raises(Unauthenticated):
        await authn.check(_msg(signer, "ratchet.admin._system.clock-ack", now=1001.0),
                          "admin", "_system", "clock-ack")
