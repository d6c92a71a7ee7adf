"""An event as its stream carries it: the one encoder (the store's outbox) and the one decoder
(the client, and anyone following a task in Python).

The wire form is the msgpack map of :class:`~ratchet.protocol.messages.Event`, keys in the
model's order. The events table keeps every payload whole; the stream cannot carry more than
NATS's maximum payload, so a payload over :data:`MAX_EVENT_PAYLOAD` is published as
``{"truncated": true, "bytes": n}`` (``docs/protocol.md``, Events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ratchet.protocol.codec import decode_map
from ratchet.protocol.messages import SCHEMA_VERSION, Event
from ratchet.protocol.redaction import pack_redacted

__all__ = ["MAX_EVENT_PAYLOAD", "decode_event", "encode_event", "encode_event_parts",
           "pack_payload"]

#: Event payloads whose msgpack encoding is larger than this are published truncated.
MAX_EVENT_PAYLOAD = 256 * 1024


def pack_payload(payload: Mapping[str, Any]) -> bytes:
    """A payload's msgpack bytes, as the events table stores them: a secret object left in
    it is redacted (protocol/redaction.py), here and on the stream."""
    return pack_redacted(payload)


def encode_event(
    *,
    event_id: str,
    task_id: str,
    tenant: str,
    sequence: int,
    event_type: str,
    aggregate_version: int,
    occurred_at: float,
    producer: str,
    payload: Mapping[str, Any],
    packed_payload: bytes | None = None,
) -> bytes:
    """The event's bytes on its stream.

    Args:
        packed_payload: ``pack_payload(payload)`` if the caller already has it (the store
            does, for its events table): it decides the truncation without packing twice.
    """
    size = len(packed_payload if packed_payload is not None else pack_payload(payload))
    published = payload if size <= MAX_EVENT_PAYLOAD else {"truncated": True, "bytes": size}
    # A plain dict built by hand, not Event(...).model_dump(): this runs for every event in
    # the writer's transaction, and the test pins it to the model's keys and order.
    return pack_redacted(
        {
            "schema_version": SCHEMA_VERSION,
            "event_id": event_id,
            "task_id": task_id,
            "tenant": tenant,
            "sequence": sequence,
            "type": event_type,
            "aggregate_version": aggregate_version,
            "occurred_at": occurred_at,
            "producer": producer,
            "payload": published,
        },
    )


def encode_event_parts(
    *,
    event_id: str,
    task_id: str,
    tenant: str,
    event_type: str,
    occurred_at: float,
    producer: str,
    payload: Mapping[str, Any],
    packed_payload: bytes,
) -> tuple[bytes, bytes, bytes]:
    """:func:`encode_event`'s bytes but for the sequence and the aggregate version, which
    are known only inside the store's transaction: ``(head, mid, tail)`` such that the
    event's bytes are ``head + packb(sequence) + mid + packb(aggregate_version) + tail``
    (the PostgreSQL store splices the two in on the server: persistence/postgres/
    change_sql.py).

    Packed once with two markers in their places (uint64s whose bytes UTF-8 text never
    holds: only text comes before them), then cut there."""
    wire = encode_event(event_id=event_id, task_id=task_id, tenant=tenant,
                        sequence=_SEQ_MARK, event_type=event_type,
                        aggregate_version=_VERSION_MARK, occurred_at=occurred_at,
                        producer=producer, payload=payload, packed_payload=packed_payload)
    at = wire.index(_SEQ_BYTES)
    to = wire.index(_VERSION_BYTES, at + len(_SEQ_BYTES))
    return wire[:at], wire[at + len(_SEQ_BYTES):to], wire[to + len(_VERSION_BYTES):]


_SEQ_MARK, _VERSION_MARK = 2**64 - 1, 2**64 - 2
_SEQ_BYTES = b"\xcf" + _SEQ_MARK.to_bytes(8, "big")
_VERSION_BYTES = b"\xcf" + _VERSION_MARK.to_bytes(8, "big")


def decode_event(data: bytes) -> Event:
    """An event from its stream bytes.

    Raises:
        InvalidMessage: not a msgpack map, or too large.
        pydantic.ValidationError: a map that is not an event.
    """
    return Event.model_validate(decode_map(data))
