"""Checkpoints that keep history without copying.

A task's state is a map of keys to msgpack-able values. At each step boundary only the
keys whose encoded value changed are written; a value larger than
:data:`BLOB_THRESHOLD` goes to the content-addressed blob table once and is referenced by
digest afterwards. A task carrying a 1 MB document that does not change therefore writes
the document once, not once per step.

Values are bounded: one value's encoding by ``max_value_bytes`` (default 16 MiB), the
values one checkpoint writes by ``max_checkpoint_bytes`` (default 64 MiB). A value over
its limit, or one msgpack cannot encode, is refused with :class:`InvalidStateValue`
naming the key — for a str or bytes value before it is encoded at all.

A value holding secrets (``SecretStr``) is encoded with them sealed: the tracker is given
the store's ``Sealer.default`` as msgpack's hook. Sealing is deterministic
(protocol/secrets.py), so an unchanged secret encodes to the same bytes and is not
written again; its blob digest is of the sealed bytes, never of the clear value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ratchet.protocol.errors import InvalidStateValue

__all__ = ["BLOB_THRESHOLD", "MAX_VALUE_BYTES", "MAX_CHECKPOINT_BYTES", "ValueWrite",
           "StateDelta", "StateTracker", "decode_value", "decode_optional"]

#: Values whose encoding exceeds this many bytes are stored as blobs.
BLOB_THRESHOLD = 2048
#: Default bounds: one state value's encoding, and the values one checkpoint writes.
MAX_VALUE_BYTES = 16 * 1024 * 1024
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024


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
    blobs: dict[str, bytes] = field(default_factory=dict)


def decode_value(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def decode_optional(data: bytes | None) -> Any:
    """:func:`decode_value` of a nullable column (None stays None)."""
    return None if data is None else decode_value(data)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class StateTracker:
    """Remembers the encoding of every key at the last checkpoint, to diff against."""

    def __init__(self, encoded: dict[str, bytes] | None = None, *,
                 max_value_bytes: int = MAX_VALUE_BYTES,
                 max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
                 default: Callable[[Any], Any] | None = None) -> None:
        """``default``: msgpack's hook for other objects (a store's ``secrets.default``
        seals secrets; without it a secret in the state is not plain data)."""
        self._encoded: dict[str, bytes] = dict(encoded or {})
        self._default = default
        self._known_blobs: set[str] = set()
        self.max_value_bytes = max_value_bytes
        self.max_checkpoint_bytes = max_checkpoint_bytes

    def note_stored_blob(self, digest: str) -> None:
        self._known_blobs.add(digest)

    def diff(self, state: dict[str, Any]) -> StateDelta:
        """The delta from the last checkpoint to ``state``; advances the baseline, only
        when it returns.

        Raises:
            InvalidStateValue: a key that is not a str, a value msgpack cannot encode, a
            value over ``max_value_bytes``, or changed values over ``max_checkpoint_bytes``
            in all (the step's state must be plain data of bounded size).
        """
        delta = StateDelta()
        changed: dict[str, bytes] = {}
        total = 0
        for key, value in state.items():
            encoded = self._encode(key, value)
            if self._encoded.get(key) == encoded:
                continue
            changed[key] = encoded
            total += len(encoded)
            if total > self.max_checkpoint_bytes:
                raise InvalidStateValue(
                    f"the values this checkpoint writes exceed {self.max_checkpoint_bytes}"
                    f" bytes (at state[{key!r}])", key=key, size=total,
                    limit=self.max_checkpoint_bytes)
        for key, encoded in changed.items():
            self._encoded[key] = encoded
            if len(encoded) > BLOB_THRESHOLD:
                digest = _digest(encoded)
                if digest not in self._known_blobs:
                    delta.blobs[digest] = encoded
                    self._known_blobs.add(digest)
                delta.values.append(ValueWrite(key, blob=digest))
            else:
                delta.values.append(ValueWrite(key, inline=encoded))
        for key in [k for k in self._encoded if k not in state]:
            del self._encoded[key]
            delta.values.append(ValueWrite(key, deleted=True))
        return delta

    def _encode(self, key: Any, value: Any) -> bytes:
        if not isinstance(key, str):
            raise InvalidStateValue(f"state keys must be str, got {type(key).__name__}",
                                    key=repr(key)[:200], type=type(key).__name__)
        # A str or bytes value is measured before it is encoded (its encoding is at least
        # as long): a 100 MB string is refused without another 100 MB copy.
        if isinstance(value, str | bytes | bytearray) and len(value) > self.max_value_bytes:
            raise self._too_large(key, len(value))
        try:
            encoded = self._pack(value)
        except (TypeError, ValueError, OverflowError) as exc:  # a type, depth or int range
            raise InvalidStateValue(
                f"state[{key!r}] is not plain data msgpack can encode: a"
                f" {type(value).__name__} ({exc})", key=key, type=type(value).__name__
            ) from None
        if len(encoded) > self.max_value_bytes:
            raise self._too_large(key, len(encoded))
        return encoded

    def _pack(self, value: Any) -> bytes:
        try:
            # Plain data first: passing the hook costs ~0.2 µs per value even when it is
            # never called, at every step; only a value holding a secret is packed twice.
            return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
        except TypeError:
            if self._default is None:
                raise
            return msgpack.packb(value, use_bin_type=True,  # type: ignore[no-any-return]
                                 default=self._default)

    def _too_large(self, key: str, size: int) -> InvalidStateValue:
        return InvalidStateValue(
            f"state[{key!r}] is {size} bytes, over the limit of {self.max_value_bytes}"
            " bytes per value", key=key, size=size, limit=self.max_value_bytes)
