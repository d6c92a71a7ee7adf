"""The one event encoder (protocol/events.py): the bytes the outbox publishes, the truncation
rule, and the one decoder the client uses."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.events import MAX_EVENT_PAYLOAD, decode_event, encode_event, pack_payload

FIELDS: dict[str, Any] = dict(event_id="evt_1", task_id="tsk_a", tenant="acme", sequence=3,
              event_type=EventType.STEP_COMPLETED, aggregate_version=4, occurred_at=12.5,
              producer="node-1")


def test_an_event_is_the_documented_map_in_the_models_key_order() -> None:
    wire = encode_event(**FIELDS, payload={"step": "a", "index": 0})
    expected = {
        "schema_version": 1, "event_id": "evt_1", "task_id": "tsk_a", "tenant": "acme",
        "sequence": 3, "type": "step.completed", "aggregate_version": 4, "occurred_at": 12.5,
        "producer": "node-1", "payload": {"step": "a", "index": 0},
    }
    decoded = msgpack.unpackb(wire, raw=False)
    assert decoded == expected
    assert list(decoded) == list(expected)
    assert wire == msgpack.packb(expected, use_bin_type=True)  # byte for byte


def test_a_payload_over_the_limit_is_published_truncated_and_one_at_it_whole() -> None:
    big = {"blob": b"x" * MAX_EVENT_PAYLOAD}
    size = len(pack_payload(big))
    assert size > MAX_EVENT_PAYLOAD
    wire = encode_event(**FIELDS, payload=big)
    assert msgpack.unpackb(wire)["payload"] == {"truncated": True, "bytes": size}
    # The caller's packed bytes decide the same way without a second packing.
    assert encode_event(**FIELDS, payload=big, packed_payload=pack_payload(big)) == wire
    at_limit = {"blob": b"x" * (MAX_EVENT_PAYLOAD - (size - MAX_EVENT_PAYLOAD) - 1)}
    assert len(pack_payload(at_limit)) <= MAX_EVENT_PAYLOAD
    assert decode_event(encode_event(**FIELDS, payload=at_limit)).payload == at_limit


def test_the_decoder_reads_what_the_encoder_wrote_and_refuses_what_is_not_a_map() -> None:
    event = decode_event(encode_event(**FIELDS, payload={"next": "END"}))
    assert (event.type, event.sequence, event.payload) == ("step.completed", 3, {"next": "END"})
    with pytest.raises(InvalidMessage):
        decode_event(msgpack.packb([1, 2]))
