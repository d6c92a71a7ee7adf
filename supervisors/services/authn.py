"""Who sent a request: the node's check of signed requests against the keyring.

Requests on the API, admin, decision and external subjects must carry the signature
headers of protocol/auth.py. The key names the principal (from the store's keyring, cached
for a few seconds); the principal must act in the subject's tenant and hold the role the
service and verb need. A principal field in a payload decides nothing.

Signatures are judged on the host's wall clock (as TLS certificates are), not on the
node's injected business clock: the window is about the real time between a client and a
node. After a step of the node's wall clock (protocol/clock_guard.py), the time before the
step (and, for a forward step it still holds, the time it believes) is accepted too: an
operator must still be able to reach a node whose clock jumped, if only to ``clock-ack``
it, whichever of the two clocks is wrong.

Replies go only under the signer's own inbox (``_INBOX.<key>.``), so a request cannot make
the node publish on another tenant's or the runtime's own subjects; the answer to a
JetStream submit, which is not signed, only under the inbox of a key of the submit's
tenant (:meth:`Authenticator.may_answer`).

Messages one node passes on to another (``ratchet.node.<node>.…``) carry the cluster's
mail seal (protocol/mail_seal.py) on top of the requester's signature:
:meth:`Authenticator.check_sealed`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import structlog
from nats.aio.msg import Msg

from ratchet.persistence.ports import KeyringStore
from ratchet.protocol.auth import (
    KEY_HEADER,
    SIG_HEADER,
    TIME_HEADER,
    Principal,
    ReplayGuard,
    required_role,
    verify_signature,
)
from ratchet.protocol.clock import Clock, SystemClock
from ratchet.protocol.errors import PermissionDenied, Unauthenticated
from ratchet.protocol.mail_seal import MailSeal

__all__ = ["Authenticator", "may_reply"]

log = structlog.get_logger("ratchet.auth")

#: How long the keyring cache serves before it is read again; an unknown key reads it at
#: once (at most every ``_MISS_REREAD_S``), so a new grant acts within milliseconds.
_REFRESH_S = 2.0
_MISS_REREAD_S = 0.2


#: A reply subject a submit may name: ``_INBOX.<user nkey>.<tokens>``; no wildcard,
#: whitespace or empty token (the subject comes from a payload, not from NATS).
_SUBMIT_INBOX = re.compile(r"^_INBOX\.(U[A-Z2-7]{55})(\.[A-Za-z0-9_-]+)+$")


def may_reply(reply: str | None, who: Principal | None) -> bool:
    """Whether the node may answer on ``reply``: only NATS inboxes, and for a verified
    principal only its own."""
    if not reply or not reply.startswith("_INBOX."):
        return False
    return who is None or reply.startswith(who.inbox_prefix + ".")


def _issued_s(headers: dict[str, str]) -> float | None:
    issued = headers.get(TIME_HEADER, "")
    return int(issued) / 1000 if issued.isdigit() and len(issued) <= 16 else None


class Authenticator:
    def __init__(self, store: KeyringStore, clock: Clock | None = None, *,
                 seal: MailSeal | None = None,
                 offsets: Callable[[], tuple[float, ...]] | None = None) -> None:
        self.store = store
        self.seal = seal
        self.clock = clock or SystemClock()
        #: Seconds the node's wall clock may be off after a step (the step, what is held).
        self.offsets = offsets or (lambda: ())
        self.replays = ReplayGuard()
        self._keys: dict[str, Principal] = {}
        self._read_at = float("-inf")
        #: Refusals by reason, for the node's stats.
        self.refused: dict[str, int] = {}

    async def _lookup(self, key: str) -> Principal | None:
        now = self.clock.monotonic()
        stale = now - self._read_at > _REFRESH_S
        if stale or (key not in self._keys and now - self._read_at > _MISS_REREAD_S):
            self._keys = {p.public_key: p for p in await self.store.principals()}
            self._read_at = now
        return self._keys.get(key)

    def _reference(self, headers: dict[str, str], now: float) -> float:
        """The node's time to judge the signature's by: its wall clock, or that clock less
        its last step or what it holds — whichever is nearest the signed time."""
        issued, offsets = _issued_s(headers), self.offsets()
        if issued is None or not offsets:
            return now
        return min((now, *(now - o for o in offsets)), key=lambda ref: abs(ref - issued))

    async def may_answer(self, reply: str | None, tenant: str) -> bool:
        """Whether the node may publish the answer to a submit of ``tenant`` on ``reply``,
        the envelope's ``reply_to``: only under the inbox of a key in the keyring, not
        expired, acting in ``tenant`` (any role: the answer says no more than ``get``).
        A submit is not signed, so nothing else tells where its answer may go; a refusal
        is logged and counted, and the submit stands."""
        match = _SUBMIT_INBOX.match(reply or "")
        who = await self._lookup(match.group(1)) if match else None
        if who is not None and who.acts_in(tenant) \
                and (who.expires_at is None or self.clock.now() < who.expires_at):
            return True
        self.refused["reply_to"] = self.refused.get("reply_to", 0) + 1
        log.warning("no answer: the submit's reply_to is not an inbox of its tenant's keys",
                    tenant=tenant, reply_to=(reply or "")[:200])
        return False

    def check_sealed(self, msg: Msg) -> None:
        """Raises Unauthenticated (logged; counted by the seal) unless ``msg`` carries the
        cluster's mail seal: a request another node passed on."""
        try:
            if self.seal is None:
                raise Unauthenticated("this node holds no mail key to check the seal with")
            self.seal.check(msg.subject, msg.data, msg.headers)
        except Unauthenticated as exc:
            log.warning("node-internal message refused", subject=msg.subject,
                        reason=exc.message)
            raise

    def seal_headers(self, subject: str, data: bytes) -> dict[str, str]:
        """The seal of a message this node passes on to another (none without a key: the
        receiver then refuses it)."""
        return self.seal.headers(subject, data) if self.seal is not None else {}

    def forget(self) -> None:
        """Read the keyring again on the next request (after a grant or a revoke)."""
        self._read_at = float("-inf")

    async def check(self, msg: Msg, service: str, tenant: str, verb: str = "",
                    replay: bool = True) -> Principal:
        """The verified principal of ``msg`` on ``ratchet.<service>.<tenant>[.<verb>]``.

        ``replay``: refuse a signature seen before (off for JetStream deliveries, whose
        redeliveries repeat it legitimately; their ids are one-time instead)."""
        try:
            return await self._check(msg, service, tenant, verb, replay)
        except (Unauthenticated, PermissionDenied) as exc:
            reason = exc.code.value
            self.refused[reason] = self.refused.get(reason, 0) + 1
            log.warning("request refused", subject=msg.subject, code=reason,
                        reason=exc.message, key=(msg.headers or {}).get(KEY_HEADER))
            raise

    async def _check(self, msg: Msg, service: str, tenant: str, verb: str,
                     replay: bool) -> Principal:
        headers = msg.headers or {}
        key = headers.get(KEY_HEADER)
        if not key:
            raise Unauthenticated("this subject takes signed requests only (docs/security.md)")
        who = await self._lookup(key)
        if who is None:
            raise Unauthenticated("unknown or revoked key", key=key)
        now = self.clock.now()
        if who.expires_at is not None and now >= who.expires_at:
            raise Unauthenticated("the key has expired", key=key, principal=who.name)
        subject = f"ratchet.{service}.{tenant}" + (f".{verb}" if verb else "")
        verify_signature(key, subject, msg.data, headers, self._reference(headers, now))
        if replay:
            self.replays.check(headers[SIG_HEADER], now)
        if not who.acts_in(tenant):
            raise PermissionDenied("the key does not act in this tenant", principal=who.name,
                                   tenant=tenant)
        role = required_role(service, verb)
        if not who.has(role):
            raise PermissionDenied(f"this needs the {role} role", principal=who.name,
                                   role=role)
        return who
