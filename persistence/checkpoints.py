"""Checkpoints that keep history without copying.

A task's state is a map of keys to msgpack-able values. At each step boundary only the
keys whose encoded value changed are written; a value larger than
:data:`BLOB_THRESHOLD` goes to the content-addressed blob store once
(``persistence/blobs.py``) and is referenced by digest afterwards. A task carrying a 1 MB
document that does not change therefore writes the document once, not once per step.

Values are bounded: one value's encoding by ``max_value_bytes`` (default 16 MiB), the
values one checkpoint writes by ``max_checkpoint_bytes`` (default 64 MiB). A value over
its limit, or one msgpack cannot encode, is refused with :class:`InvalidStateValue`
naming the key — for a str or bytes value before it is encoded at all.

Memory: a large value is encoded once, into the packer's own buffer, and that buffer (not
a bytes copy of it) is what the checkpoint writes, chunk by chunk; the tracker then keeps
only its digest, not its encoding. At the next boundary an unchanged str or bytes value
(the same object) is not encoded again; any other large value is, and compared by digest.
So a step returning a value of n bytes costs the node about the value plus one encoding
at the boundary that writes it, and the value alone after.

A value holding secrets (``SecretStr``) is encoded with them sealed: the tracker is given
the store's ``Sealer.default`` as msgpack's hook. Sealing is deterministic
(protocol/secrets.py), so an unchanged secret encodes to the same bytes and is not
written again; its blob digest is of the sealed bytes, never of the clear value.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.protocol.errors import InvalidStateValue

__all__ = ["BLOB_THRESHOLD", "MAX_VALUE_BYTES", "MAX_CHECKPOINT_BYTES", "Encoded",
           "ValueWrite", "StateDelta", "StateTracker", "decode_value", "decode_optional"]

#: Values whose encoding exceeds this many bytes are stored as blobs.
BLOB_THRESHOLD = 2048
#: Default bounds: one state value's encoding, and the values one checkpoint writes.
MAX_VALUE_BYTES = 16 * 1024 * 1024
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024
#: Characters of a long non-ASCII str encoded at a time (StateTracker._pack_text).
_TEXT_SLICE = 256 * 1024

#: A value's msgpack encoding: bytes, or (a large one) a view of the packer's buffer.
Encoded = bytes | memoryview


@dataclass(frozen=True, slots=True)
class ValueWrite:
    key: str
    inline: bytes | None = None
    blob: str | None = None
    deleted: bool = False


@dataclass(slots=True)
class StateDelta:
    """What one checkpoint writes: changed values, and blobs not yet known to be stored."""

    values: list[ValueWrite] = field(default_factory=list)
    blobs: dict[str, Encoded] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Blob:
    """The baseline of a large value: its digest, and the value itself when it is
    immutable (str, bytes), so that the same object is known unchanged without encoding."""

    digest: str
    same: Any = None


def decode_value(data: bytes | bytearray) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def decode_optional(data: bytes | None) -> Any:
    """:func:`decode_value` of a nullable column (None stays None)."""
    return None if data is None else decode_value(data)


def _digest(data: Encoded) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _key_hash(key: str, content: Encoded) -> int:
    """64 bits of one key's content: an order-free state digest xors them."""
    h = hashlib.blake2b(key.encode(), digest_size=8)
    h.update(b"\0")
    h.update(content)
    return int.from_bytes(h.digest(), "big")


def _immutable(value: Any) -> Any:
    return value if type(value) in (str, bytes) else None


class StateTracker:
    """Remembers every key's value at the last checkpoint (the encoding of a small one, the
    digest of a large one), to diff against."""

    def __init__(self, encoded: Mapping[str, bytes] | None = None, *,
                 blobs: Mapping[str, str] | None = None,
                 values: Mapping[str, Any] | None = None,
                 max_value_bytes: int = MAX_VALUE_BYTES,
                 max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
                 default: Callable[[Any], Any] | None = None) -> None:
        """``encoded``: encodings of the last checkpoint's values; ``blobs``: key → digest
        of the values it holds as blobs (known to be stored); ``values``: the decoded
        values, whose str and bytes the next diff recognises by identity; ``default``:
        msgpack's hook for other objects (a store's ``secrets.default`` seals secrets;
        without it a secret in the state is not plain data)."""
        self._default = default
        self._encoded: dict[str, bytes] = {}
        self._blobs: dict[str, _Blob] = {}
        self._known_blobs: set[str] = set()
        for key, data in (encoded or {}).items():
            if len(data) > BLOB_THRESHOLD:
                self._blobs[key] = _Blob(_digest(data))
            else:
                self._encoded[key] = data
        for key, digest in (blobs or {}).items():
            self._blobs[key] = _Blob(digest, _immutable((values or {}).get(key)))
            self._known_blobs.add(digest)
        self.max_value_bytes = max_value_bytes
        self.max_checkpoint_bytes = max_checkpoint_bytes
        #: Each key's content hash, combined (xor) into ``digest``: the state's digest,
        #: kept up to date for the price of hashing what a diff writes (node loop detection
        #: compares states without encoding them again). ``seen``: the digest before the
        #: last diff, that is of the state the node that diffed saw.
        self._hashes = {k: _key_hash(k, d) for k, d in self._encoded.items()}
        self._hashes.update((k, _key_hash(k, b.digest.encode())) for k, b in self._blobs.items())
        self.digest = functools.reduce(operator.xor, self._hashes.values(), 0)
        self.seen = self.digest

    def diff(self, state: dict[str, Any]) -> StateDelta:
        """The delta from the last checkpoint to ``state``; advances the baseline, only
        when it returns.

        Raises:
            InvalidStateValue: a key that is not a str, a value msgpack cannot encode, a
            value over ``max_value_bytes``, or changed values over ``max_checkpoint_bytes``
            in all (the step's state must be plain data of bounded size).
        """
        changed: list[tuple[str, Encoded, _Blob | None]] = []
        refreshed: dict[str, _Blob] = {}
        total = 0
        for key, value in state.items():
            known = self._blobs.get(key)
            if known is not None and known.same is not None and known.same is value:
                continue  # the very str or bytes object checkpointed: not encoded again
            encoded = self._encode(key, value)
            blob = None
            if len(encoded) > BLOB_THRESHOLD:
                blob = _Blob(_digest(encoded), _immutable(value))
                if known is not None and known.digest == blob.digest:
                    refreshed[key] = blob  # equal, another object: remember this one
                    continue
            elif self._encoded.get(key) == encoded:
                continue
            changed.append((key, encoded, blob))
            total += len(encoded)
            if total > self.max_checkpoint_bytes:
                raise InvalidStateValue(
                    f"the values this checkpoint writes exceed {self.max_checkpoint_bytes}"
                    f" bytes (at state[{key!r}])", key=key, size=total,
                    limit=self.max_checkpoint_bytes)
        self._blobs.update(refreshed)
        return self._advance(state, changed)

    def _advance(self, state: dict[str, Any],
                 changed: list[tuple[str, Encoded, _Blob | None]]) -> StateDelta:
        delta = StateDelta()
        self.seen = self.digest
        for key, encoded, blob in changed:
            self._rehash(key, bytes(encoded) if blob is None else blob.digest.encode())
            if blob is None:  # small: bytes already (bytes() of bytes is the same object)
                self._encoded[key] = inline = bytes(encoded)
                self._blobs.pop(key, None)
                delta.values.append(ValueWrite(key, inline=inline))
                continue
            self._blobs[key] = blob
            self._encoded.pop(key, None)
            if blob.digest not in self._known_blobs:
                delta.blobs[blob.digest] = encoded
                self._known_blobs.add(blob.digest)
            delta.values.append(ValueWrite(key, blob=blob.digest))
        for key in [k for k in (*self._encoded, *self._blobs) if k not in state]:
            self._rehash(key, None)
            self._encoded.pop(key, None)
            self._blobs.pop(key, None)
            delta.values.append(ValueWrite(key, deleted=True))
        return delta

    def _rehash(self, key: str, content: bytes | None) -> None:
        """Swap ``key``'s hash in ``digest`` for that of ``content`` (None: deleted)."""
        self.digest ^= self._hashes.pop(key, 0)
        if content is not None:
            self._hashes[key] = _key_hash(key, content)
            self.digest ^= self._hashes[key]

    def _encode(self, key: Any, value: Any) -> Encoded:
        """``value``'s encoding: bytes when small, else a view of the buffer it was packed
        into (a bytes copy of it would double the peak for a large value)."""
        if not isinstance(key, str):
            raise InvalidStateValue(f"state keys must be str, got {type(key).__name__}",
                                    key=repr(key)[:200], type=type(key).__name__)
        # A str or bytes value is measured before it is encoded (its encoding is at least
        # as long): a 100 MB string is refused without another 100 MB copy.
        if isinstance(value, str | bytes | bytearray) and len(value) > self.max_value_bytes:
            raise self._too_large(key, len(value))
        try:
            if type(value) is str and len(value) > BLOB_THRESHOLD and not value.isascii():
                view = self._pack_text(key, value)
            else:
                view = self._pack(value)
        except (TypeError, ValueError, OverflowError) as exc:  # a type, depth or int range
            raise InvalidStateValue(
                f"state[{key!r}] is not plain data msgpack can encode: a"
                f" {type(value).__name__} ({exc})", key=key, type=type(value).__name__
            ) from None
        if len(view) > self.max_value_bytes:
            raise self._too_large(key, len(view))
        return view.tobytes() if len(view) <= BLOB_THRESHOLD else view

    def _pack(self, value: Any) -> memoryview:
        """``value`` packed into a packer's own buffer (no bytes copy of it). Plain data
        first: passing the hook costs ~0.2 µs per value even when it is never called, at
        every step; only a value holding a secret is packed twice."""
        packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        try:
            packer.pack(value)
        except TypeError:
            if self._default is None:
                raise
            packer = msgpack.Packer(use_bin_type=True, autoreset=False, default=self._default)
            packer.pack(value)
        return memoryview(packer.getbuffer())

    def _pack_text(self, key: str, text: str) -> memoryview:
        """msgpack of a long non-ASCII str, encoded to UTF-8 a slice at a time into one
        buffer. Why not msgpack: it keeps the whole UTF-8 copy cached inside the str
        object for as long as the str lives (msgpack needs that copy; we do not).

        Raises:
            InvalidStateValue: over ``max_value_bytes`` (before the buffer is made).
            UnicodeEncodeError: a lone surrogate (as msgpack would).
        """
        slices = range(0, len(text), _TEXT_SLICE)
        size = sum(len(text[i:i + _TEXT_SLICE].encode()) for i in slices)
        if size > self.max_value_bytes:
            raise self._too_large(key, size)
        head = (b"\xda" + size.to_bytes(2, "big") if size < 1 << 16
                else b"\xdb" + size.to_bytes(4, "big"))  # msgpack's str 16 / str 32
        buffer = bytearray(len(head) + size)
        buffer[:len(head)] = head
        at = len(head)
        for i in slices:
            part = text[i:i + _TEXT_SLICE].encode()
            buffer[at:at + len(part)] = part
            at += len(part)
        return memoryview(buffer)

    def _too_large(self, key: str, size: int) -> InvalidStateValue:
        return InvalidStateValue(
            f"state[{key!r}] is {size} bytes, over the limit of {self.max_value_bytes}"
            " bytes per value", key=key, size=size, limit=self.max_value_bytes)
