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
    # Two characters (10 bits) per lookup: a third of a per-character loop's cost, and
    # every event and message of every commit takes an id.
    return f"{prefix}_{''.join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])}"


_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
_SHIFTS = range(120, -1, -10)  # 13 pairs: the 26 characters, most significant first


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
