"""Checkpoints that keep history without copying.

A task's state is a map of keys to msgpack-able values. At each step boundary only the
keys whose encoded value changed are written; a value larger than
:data:`BLOB_THRESHOLD` goes to the content-addressed blob table once and is referenced by
digest afterwards. A task carrying a 1 MB document that does not change therefore writes
the document once, not once per step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["BLOB_THRESHOLD", "ValueWrite", "StateDelta", "StateTracker", "decode_value",
           "decode_optional"]

#: Values whose encoding exceeds this many bytes are stored as blobs.
BLOB_THRESHOLD = 2048


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

    def __init__(self, encoded: dict[str, bytes] | None = None) -> None:
        self._encoded: dict[str, bytes] = dict(encoded or {})
        self._known_blobs: set[str] = set()

    def note_stored_blob(self, digest: str) -> None:
        self._known_blobs.add(digest)

    def diff(self, state: dict[str, Any]) -> StateDelta:
        """The delta from the last checkpoint to ``state``; advances the baseline.

        Raises:
            TypeError: a value msgpack cannot encode (the step's state must be plain data).
        """
        delta = StateDelta()
        for key, value in state.items():
            if not isinstance(key, str):
                raise TypeError(f"state keys must be str, got {type(key).__name__}")
            try:
                encoded = msgpack.packb(value, use_bin_type=True)
            except TypeError as exc:
                raise TypeError(f"state[{key!r}] is not plain data: {exc}") from None
            if self._encoded.get(key) == encoded:
                continue
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
