"""The seal on mail between a cluster's nodes (docs/security.md, "Inside the node").

Actor mail (``ratchet.mail.<partition>.<task_id>.<actor>``) and requests one node passes
on to another (``ratchet.node.<node>.…``) say things only the runtime may say: a decision
was taken, a timer fired, a wait ended, a task is cancelled. NATS permissions keep tenants
off those subjects; this seal is the node's own check, for a server without them. Each
such message carries a MAC, and the receiving node drops one whose MAC is missing or
wrong::

    Ratchet-Mac: hex(hmac_sha256(key, b"ratchet-mail-v1\\n" + subject + b"\\n" + payload))

The key is the store's cluster secret ``mail``: every node of one store shares it, and
nobody else has it (whoever can read the database is the node itself). A symmetric MAC,
not a signature: the receiver is always another node holding the same key, and an HMAC
costs a microsecond or two where a signature check costs about a hundred.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from ratchet.protocol.errors import Unauthenticated

__all__ = ["MAC_HEADER", "MailSeal", "is_sealed_subject"]

MAC_HEADER = "Ratchet-Mac"
_DOMAIN = b"ratchet-mail-v1\n"
#: Subjects only nodes publish on, whose messages carry the seal.
_SEALED_PREFIXES = ("ratchet.mail.", "ratchet.node.")


def is_sealed_subject(subject: str) -> bool:
    """Whether messages on ``subject`` must carry the seal (node-internal subjects)."""
    return subject.startswith(_SEALED_PREFIXES)


class MailSeal:
    """Seals and checks node-internal messages with the cluster's mail key.

    ``refused`` counts the messages :meth:`check` turned away (for the node's heartbeat
    info): a non-zero figure means something without the key publishes on internal
    subjects."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the mail key must hold at least 16 bytes")
        # The key's padding is hashed once here; each MAC starts from a copy of it.
        self._base = hmac.new(key, _DOMAIN, hashlib.sha256)
        self.refused = 0

    def mac(self, subject: str, data: bytes) -> str:
        h = self._base.copy()
        h.update(subject.encode())
        h.update(b"\n")
        h.update(data)
        return h.hexdigest()

    def headers(self, subject: str, data: bytes) -> dict[str, str]:
        """The header that seals ``data`` published on ``subject``."""
        return {MAC_HEADER: self.mac(subject, data)}

    def check(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        """Raises Unauthenticated (and counts it) unless the message carries this cluster's
        seal for exactly this subject and payload."""
        given = (headers or {}).get(MAC_HEADER)
        expected = self.mac(subject, data).encode()
        if given is None or not hmac.compare_digest(given.encode(errors="replace"), expected):
            self.refused += 1
            raise Unauthenticated("node-internal message without a valid seal"
                                  " (docs/security.md)", subject=subject[:200],
                                  sealed=given is not None)
