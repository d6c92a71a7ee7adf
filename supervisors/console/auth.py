"""Who uses the console: a login by a keyring key's signature over a one-time challenge,
then a session cookie; the principal is read from the keyring again on every request.

The console holds no password and no seed. ``GET /login`` shows a challenge (random, one
use, five minutes); the user signs it on their own machine with the key they hold
(``ratchet console-login CHALLENGE --creds alice.nk`` prints the login code) and pastes the
code. The node checks the signature against the keyring (docs/security.md): an unknown,
revoked or expired key is refused as a signed NATS request would be. The session is a
random 32-byte token in an ``HttpOnly``, ``SameSite=Strict`` cookie; the node keeps only
its SHA-256, with the public key it stands for, so a revoked key's session ends at its next
request. Every page and action checks the principal's tenant and roles like
supervisors/services/authn.py does for NATS requests (``required_role``); a form that
changes something also carries the session's CSRF token.

Sessions live in the node's memory: a restarted node asks everyone to log in again
(a session of one node is not valid on another).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from ratchet.persistence.ports import KeyringStore
from ratchet.protocol.auth import Principal, Signer, check_public_key, required_role
from ratchet.protocol.clock import Clock
from ratchet.protocol.errors import InvalidMessage, PermissionDenied, Unauthenticated

__all__ = ["COOKIE", "Challenges", "Session", "Sessions", "authorize", "login_code",
           "signed_login_bytes"]

#: The session cookie's name.
COOKIE = "ratchet_console"
#: A challenge is good for this many seconds, once.
CHALLENGE_TTL_S = 300.0
#: A session ends after this long without a request, and after ``SESSION_MAX_S`` anyway.
SESSION_IDLE_S = 3600.0
SESSION_MAX_S = 12 * 3600.0
#: Bounds on what an anonymous visitor can make the node remember.
MAX_CHALLENGES = 10_000
MAX_SESSIONS = 10_000
_DOMAIN = b"ratchet-console-login-v1\n"


def signed_login_bytes(challenge: str, node_id: str) -> bytes:
    """What a login signs: the domain, the node's id and the challenge (a signature made
    for one node's console is no login on another, nor a signed request anywhere)."""
    return _DOMAIN + node_id.encode() + b"\n" + challenge.encode()


def login_code(signer: Signer, challenge: str, node_id: str) -> str:
    """The code a user pastes into the login form: ``<public key>.<signature>`` (base64url,
    no padding). Made where the seed is, by ``ratchet console-login``."""
    key = SigningKey(nkeys.decode_seed(bytearray(signer.seed))[1])
    sig = key.sign(signed_login_bytes(challenge, node_id)).signature
    return f"{signer.public_key}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Challenges:
    """One-time login challenges, each good for ``CHALLENGE_TTL_S``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._open: OrderedDict[str, float] = OrderedDict()

    def new(self) -> str:
        now = self.clock.monotonic()
        while self._open and (len(self._open) >= MAX_CHALLENGES
                              or next(iter(self._open.values())) < now):
            self._open.popitem(last=False)
        challenge = secrets.token_urlsafe(24)
        self._open[challenge] = now + CHALLENGE_TTL_S
        return challenge

    def take(self, challenge: str) -> None:
        """Use ``challenge`` up; Unauthenticated when it is unknown, used or expired."""
        until = self._open.pop(challenge, None)
        if until is None or until < self.clock.monotonic():
            raise Unauthenticated("the login challenge is unknown, used or expired: reload"
                                  " the login page")


@dataclass(slots=True)
class Session:
    public_key: str
    csrf: str
    started: float
    seen: float = field(default=0.0)
    #: What the last action said, shown once by the next page: (``done`` or ``error``, text).
    #: Kept here, not in the URL, so that a link cannot make the console say something.
    flash: tuple[str, str] | None = None


class Sessions:
    """Logged-in users, by the SHA-256 of their cookie's token."""

    def __init__(self, store: KeyringStore, clock: Clock, node_id: str) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.challenges = Challenges(clock)
        self._by_digest: OrderedDict[str, Session] = OrderedDict()

    async def principal(self, public_key: str) -> Principal:
        """The keyring's principal for ``public_key``, read now (a revoke acts at once)."""
        for who in await self.store.principals():
            if who.public_key == public_key:
                if who.expires_at is not None and self.clock.now() >= who.expires_at:
                    raise Unauthenticated("the key has expired", principal=who.name)
                return who
        raise Unauthenticated("unknown or revoked key")

    async def login(self, challenge: str, code: str) -> tuple[str, Principal]:
        """Check a login code against a challenge; returns (cookie token, principal)."""
        self.challenges.take(challenge)
        key, _, sig_text = code.strip().partition(".")
        try:
            check_public_key(key)
            sig = base64.urlsafe_b64decode(sig_text + "=" * (-len(sig_text) % 4))
            VerifyKey(_raw_key(key)).verify(signed_login_bytes(challenge, self.node_id), sig)
        except (InvalidMessage, BadSignatureError, binascii.Error, ValueError):
            raise Unauthenticated("the login code does not verify for this challenge") \
                from None
        who = await self.principal(key)
        token = secrets.token_urlsafe(32)
        now = self.clock.monotonic()
        while len(self._by_digest) >= MAX_SESSIONS:
            self._by_digest.popitem(last=False)
        self._by_digest[_digest(token)] = Session(key, secrets.token_urlsafe(24), now, now)
        return token, who

    async def resolve(self, token: str | None) -> tuple[Session, Principal]:
        """The session and the principal (read from the keyring now) of a cookie's token;
        Unauthenticated when there is none, it ended, or its key is no longer granted."""
        session = self._by_digest.get(_digest(token)) if token else None
        now = self.clock.monotonic()
        if session is None or now - session.seen > SESSION_IDLE_S \
                or now - session.started > SESSION_MAX_S:
            if token:
                self._by_digest.pop(_digest(token), None)
            raise Unauthenticated("log in to the console")
        try:
            who = await self.principal(session.public_key)
        except Unauthenticated:
            self._by_digest.pop(_digest(token or ""), None)
            raise
        session.seen = now
        return session, who

    def logout(self, token: str | None) -> None:
        if token:
            self._by_digest.pop(_digest(token), None)

    @staticmethod
    def check_csrf(session: Session, given: str | None) -> None:
        if not given or not hmac.compare_digest(session.csrf, given):
            raise PermissionDenied("the form's CSRF token is missing or wrong: reload the page")


def _raw_key(public_key: str) -> bytes:
    raw = base64.b32decode(public_key)
    return raw[1:33]  # nkey: prefix byte, 32 key bytes, CRC-16


def authorize(who: Principal, tenant: str, verb: str) -> None:
    """The checks authn.py makes for ``ratchet.admin.<tenant>.<verb>``: the principal acts
    in ``tenant`` and holds the verb's role."""
    if not who.acts_in(tenant):
        raise PermissionDenied("the key does not act in this tenant", principal=who.name,
                               tenant=tenant)
    role = required_role("admin", verb)
    if not who.has(role):
        raise PermissionDenied(f"this needs the {role} role", principal=who.name, role=role)
