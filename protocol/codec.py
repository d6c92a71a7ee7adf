"""msgpack encoding, decoding with validation, and canonical bytes for hashing."""

from __future__ import annotations

from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Envelope

__all__ = ["encode", "decode_map", "decode_envelope", "parse_body", "canonical", "MAX_MESSAGE_BYTES"]

M = TypeVar("M", bound=BaseModel)

MAX_MESSAGE_BYTES = 1024 * 1024


def encode(value: BaseModel | dict[str, Any]) -> bytes:
    """msgpack bytes of a model (by field name, None included) or a plain map."""
    data = value.model_dump(mode="python") if isinstance(value, BaseModel) else value
    return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]


def decode_map(data: bytes) -> dict[str, Any]:
    """Decode msgpack bytes that must hold a map with string keys.

    Raises:
        InvalidMessage: not msgpack, not a map, or too large.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidMessage("message too large", size=len(data), limit=MAX_MESSAGE_BYTES)
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise InvalidMessage(f"not valid msgpack: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidMessage(f"expected a msgpack map, got {type(value).__name__}")
    return value


def _validate(model: type[M], value: Any, what: str) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problems = [
            {"field": ".".join(str(p) for p in err["loc"]), "problem": err["msg"]}
            for err in exc.errors()[:10]
        ]
        raise InvalidMessage(f"{what} failed validation", problems=problems) from None


def decode_envelope(data: bytes) -> Envelope:
    """Decode and validate an :class:`Envelope`. Raises InvalidMessage."""
    return _validate(Envelope, decode_map(data), "envelope")


def parse_body(envelope: Envelope, model: type[M]) -> M:
    """Validate an envelope's body as ``model``. Raises InvalidMessage."""
    return _validate(model, envelope.body, f"body of {envelope.type}")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """msgpack with map keys sorted at every depth: equal values give equal bytes."""
    return msgpack.packb(_sorted(value), use_bin_type=True)  # type: ignore[no-any-return]
