"""Identifiers: time-ordered random ids, and the deterministic task id of a request."""

from __future__ import annotations

import base64
import hashlib
import random
import secrets
import time

__all__ = ["new_id", "task_id_for", "request_hash"]

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"

# Seeded once from the OS; one urandom syscall per id cost ~10 µs on the step path.
# Ids need uniqueness, not secrecy: nothing here is a credential.
_rng = random.Random(secrets.randbits(128))


def new_id(prefix: str) -> str:
    """A ULID-style id: 48 bits of milliseconds then 80 random bits, Crockford base32.

    Ids sort by creation time, which keeps index inserts local and logs readable.
    """
    value = (time.time_ns() // 1_000_000) << 80 | _rng.getrandbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def task_id_for(tenant: str, idempotency_key: str) -> str:
    """The task id a submission creates: a hash of (tenant, idempotency key).

    Deterministic so that a producer knows the id before any reply (it can start watching
    events at once) and so that resubmitting under the same key names the same task.
    """
    digest = hashlib.sha256(f"{tenant}\x00{idempotency_key}".encode()).digest()
    return "tsk_" + base64.b32encode(digest[:15]).decode().lower()


def request_hash(canonical: bytes) -> str:
    """``sha256:<hex>`` of a canonical encoding (see :func:`protocol.codec.canonical`)."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()
