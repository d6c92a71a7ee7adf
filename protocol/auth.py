"""Identity from credentials (docs/security.md): keys, roles and signed requests.

A principal is an ed25519 key in NATS's nkey form (a user seed ``SU…`` kept by its holder,
a public key ``U…`` in the node's keyring) with a name, a home tenant and roles. The same
seed authenticates the NATS connection and signs requests: a request on an API, admin,
decision or external subject carries three headers, and the node verifies them against
the keyring before it reads the payload. Nothing in a payload says who sent it.

The signed bytes, in full (any language reproduces them with a hash and ed25519)::

    b"ratchet-sig-v1\\n" + subject + b"\\n" + issued_ms + b"\\n" + hex(sha256(payload))
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from ratchet.protocol.admin_verbs import SYSTEM_TENANT, VERB_ROLES
from ratchet.protocol.errors import InvalidMessage, Unauthenticated
from ratchet.protocol.private_files import write_private

__all__ = [
    "KEY_HEADER",
    "ROLES",
    "SIG_HEADER",
    "SIGNATURE_WINDOW_S",
    "TIME_HEADER",
    "Principal",
    "ReplayGuard",
    "Signer",
    "check_public_key",
    "inbox_prefix",
    "new_seed",
    "read_key_file",
    "redact_url",
    "required_role",
    "signing_bytes",
    "verify_signature",
    "write_key_file",
]

KEY_HEADER = "Ratchet-Key"
TIME_HEADER = "Ratchet-Time"
SIG_HEADER = "Ratchet-Sig"
#: A signed request is accepted this many seconds either side of the node's clock; a
#: repeat of the same signature within the window is refused (ReplayGuard).
SIGNATURE_WINDOW_S = 300.0
_DOMAIN = b"ratchet-sig-v1\n"

#: Every role. ``_IMPLIES``: an operator or an approver may also read (viewer).
ROLES = frozenset({"producer", "subscriber", "viewer", "operator", "approver", "confirmer",
                   "tool_worker"})
_IMPLIES = {"operator": frozenset({"viewer"}), "approver": frozenset({"viewer"})}
#: The role a request on each signed service needs (admin: by verb, protocol/admin_verbs).
_SERVICE_ROLES = {"api": "producer", "decisions": "approver", "external": "confirmer"}


def required_role(service: str, verb: str) -> str:
    """The role a request on ``ratchet.<service>.<tenant>[.<verb>]`` needs."""
    role = VERB_ROLES.get(verb) if service == "admin" else _SERVICE_ROLES.get(service)
    if role is None:
        raise InvalidMessage(f"unknown verb {verb!r} of {service!r}", verb=verb)
    return role


@dataclass(frozen=True, slots=True)
class Principal:
    """Who holds a key: what the keyring says, never what a payload claims."""

    name: str
    tenant: str  # a tenant token, or SYSTEM_TENANT: the platform's own, acting everywhere
    roles: frozenset[str]
    public_key: str
    expires_at: float | None = None
    granted: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        implied = frozenset().union(*(_IMPLIES.get(r, frozenset()) for r in self.roles))
        object.__setattr__(self, "granted", self.roles | implied)

    def acts_in(self, tenant: str) -> bool:
        return self.tenant in (tenant, SYSTEM_TENANT)

    def has(self, role: str) -> bool:
        return role in self.granted

    @property
    def inbox_prefix(self) -> str:
        """Replies to this principal go under it, and nowhere else (docs/security.md)."""
        return inbox_prefix(self.public_key)


def inbox_prefix(public_key: str) -> str:
    """The reply subjects of the holder of ``public_key``: ``_INBOX.<key>.>``, which NATS
    lets only that holder subscribe to and the node replies under alone."""
    return f"_INBOX.{public_key}"


def signing_bytes(subject: str, issued_ms: int, data: bytes) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    return b"%s%s\n%d\n%s" % (_DOMAIN, subject.encode(), issued_ms, digest.encode())


class Signer:
    """Holds a principal's seed; signs requests and authenticates its NATS connection."""

    def __init__(self, seed: bytes) -> None:
        self.seed = bytes(seed).strip()
        pair = nkeys.from_seed(bytearray(self.seed))
        self.public_key = pair.public_key.decode()
        self._key = SigningKey(nkeys.decode_seed(bytearray(self.seed))[1])

    @classmethod
    def from_file(cls, path: Path | str) -> Signer:
        return cls(read_key_file(Path(path)))

    def headers(self, subject: str, data: bytes, now: float) -> dict[str, str]:
        issued_ms = int(now * 1000)
        signature = self._key.sign(signing_bytes(subject, issued_ms, data)).signature
        return {KEY_HEADER: self.public_key, TIME_HEADER: str(issued_ms),
                SIG_HEADER: base64.urlsafe_b64encode(signature).rstrip(b"=").decode()}

    def __repr__(self) -> str:  # never the seed
        return f"Signer({self.public_key})"


@lru_cache(maxsize=4096)
def _verify_key(public_key: str) -> VerifyKey:
    return VerifyKey(_decode_public(public_key))


def _decode_public(public_key: str) -> bytes:
    try:
        raw = base64.b32decode(public_key)
    except (binascii.Error, ValueError):
        raise Unauthenticated("the key is not an nkey") from None
    if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER:
        raise Unauthenticated("the key is not a user nkey (U…)")
    if nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        raise Unauthenticated("the key's checksum is wrong")
    return raw[1:33]


def check_public_key(public_key: str) -> str:
    """``public_key`` if it is a well-formed user nkey; INVALID_ARGUMENT otherwise."""
    try:
        _decode_public(public_key)
    except Unauthenticated as exc:
        raise InvalidMessage(exc.message, field="public_key") from None
    return public_key


def verify_signature(public_key: str, subject: str, data: bytes,
                     headers: Mapping[str, str], now: float) -> int:
    """Check the request's signature headers; returns the issued time (ms).

    Raises Unauthenticated: a header missing, a time outside the window, a bad signature."""
    issued, sig = headers.get(TIME_HEADER), headers.get(SIG_HEADER)
    if not issued or not sig or not issued.isdigit() or len(issued) > 16:
        raise Unauthenticated(f"{TIME_HEADER} and {SIG_HEADER} headers are required")
    issued_ms = int(issued)
    if abs(issued_ms / 1000 - now) > SIGNATURE_WINDOW_S:
        raise Unauthenticated("the request's time is outside the accepted window",
                              window_s=SIGNATURE_WINDOW_S)
    try:
        raw_sig = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
        _verify_key(public_key).verify(signing_bytes(subject, issued_ms, data), raw_sig)
    except (BadSignatureError, binascii.Error, ValueError):
        raise Unauthenticated("bad signature") from None
    return issued_ms


class ReplayGuard:
    """Signatures seen within the window: the same signed request twice is refused.

    Bounded: at most ``capacity`` entries, the oldest dropped first (a request older than
    the window is refused by its time anyway)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()

    def check(self, signature: str, now: float) -> None:
        horizon = now - 2 * SIGNATURE_WINDOW_S
        while self._seen and (len(self._seen) >= self.capacity
                              or next(iter(self._seen.values())) < horizon):
            self._seen.popitem(last=False)
        if signature in self._seen:
            raise Unauthenticated("this signed request was already received (a replay)")
        self._seen[signature] = now


def new_seed() -> bytes:
    """A new user seed (``SU…``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def write_key_file(path: Path, seed: bytes) -> None:
    """Write a seed readable by its owner only (0600), replacing the file atomically."""
    write_private(path, seed + b"\n")


def read_key_file(path: Path) -> bytes:
    seed = path.read_bytes().strip()
    if not seed.startswith(b"SU"):
        raise InvalidMessage(f"{path} does not hold a user nkey seed (SU…)")
    return seed


#: ``scheme://user:password@`` or ``scheme://token@`` at the start of each URL of a list.
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/,]*)(?::[^/,]*)?@",
                       re.IGNORECASE)


def redact_url(url: str | None) -> str | None:
    """``url`` (or a comma-separated list) with passwords and tokens hidden:
    ``nats://user:***@host``, ``nats://***@host`` (a bare token) — for logs, the serving
    line and admin replies, which must never carry a secret."""
    if url is None:
        return None

    def hide(m: re.Match[str]) -> str:
        if ":" in m.group(0)[len(m.group("scheme")):]:
            return f"{m.group('scheme')}{m.group('user')}:***@"
        return f"{m.group('scheme')}***@"

    return _USERINFO.sub(hide, url)
