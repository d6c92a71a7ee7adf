"""msgpack encoding, decoding with validation, and canonical bytes for hashing."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, ValidationError

from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Envelope

__all__ = ["encode", "decode_map", "decode_envelope", "parse_body", "canonical",
           "reply_route", "MAX_MESSAGE_BYTES", "MAX_DEPTH"]

M = TypeVar("M", bound=BaseModel)

#: The largest inbound message, in bytes.
MAX_MESSAGE_BYTES = 1024 * 1024
#: The deepest nesting of maps and arrays in an inbound message, the outer map counting 1
#: (an envelope's body is at depth 2, a submit's input at 3). Checked before validation,
#: which recurses (a few hundred levels raise RecursionError there).
MAX_DEPTH = 64

#: A subject a reply can be published to: tokens without spaces or wildcards.
_SUBJECT = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")


def encode(value: BaseModel | dict[str, Any]) -> bytes:
    """msgpack bytes of a model (by field name, None included) or a plain map."""
    data = value.model_dump(mode="python") if isinstance(value, BaseModel) else value
    return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]


def decode_map(data: bytes) -> dict[str, Any]:
    """Decode msgpack bytes that must hold a map with string keys.

    Raises:
        InvalidMessage: not msgpack, not a map, too large, or nested deeper than
        :data:`MAX_DEPTH`.
    """
    value = _unpack(data)
    if not isinstance(value, dict):
        raise InvalidMessage(f"expected a msgpack map, got {type(value).__name__}")
    depth = _depth(value)
    if depth > MAX_DEPTH:
        raise InvalidMessage(f"message nested deeper than {MAX_DEPTH} levels",
                             depth=depth, limit=MAX_DEPTH)
    return value


def _unpack(data: bytes) -> Any:
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidMessage("message too large", size=len(data), limit=MAX_MESSAGE_BYTES)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise InvalidMessage(f"not valid msgpack: {exc.__class__.__name__}: {exc}") from None


def _depth(value: Any) -> int:
    """How deep maps and arrays nest in ``value`` (a scalar is 0), walked without recursion;
    stops counting just past :data:`MAX_DEPTH`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, dict | list))
    return deepest


def reply_route(data: bytes) -> tuple[str | None, str | None]:
    """``(reply_to, correlation_id)`` salvaged from a message that failed to decode or
    validate, each None unless the raw map holds it as a valid value (a subject without
    wildcards of at most 256 characters; a str of 1 to 128 characters), so that the sender still gets
    its typed error."""
    try:
        value = _unpack(data)
    except InvalidMessage:
        return None, None
    if not isinstance(value, dict):
        return None, None
    reply_to, correlation_id = value.get("reply_to"), value.get("correlation_id")
    if not (isinstance(reply_to, str) and len(reply_to) <= 256 and _SUBJECT.match(reply_to)):
        reply_to = None
    if not (isinstance(correlation_id, str) and 1 <= len(correlation_id) <= 128):
        correlation_id = None
    return reply_to, correlation_id


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


def canonical(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """msgpack with map keys sorted at every depth: equal values give equal bytes.
    ``default``: msgpack's hook for other objects (protocol/secrets.py seals secrets)."""
    return msgpack.packb(_sorted(value), use_bin_type=True,  # type: ignore[no-any-return]
                         default=default)
