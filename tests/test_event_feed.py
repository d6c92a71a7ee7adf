"""The event feed behind ``Client.watch`` (actors/transport/event_feed.py) on a real
nats-server: a consumer the client creates itself reads a long history in stream order,
answering the server's flow control, and resumes after the last message it had."""

from __future__ import annotations

import asyncio

import nats
import pytest

from ratchet.actors.transport.bus import Bus
from ratchet.actors.transport.event_feed import EventFeed

SUBJECT = "ratchet.events.acme.tsk_a.step.completed"


async def _publish(bus: Bus, n: int, size: int) -> None:
    acks = [await bus.js.publish_async(SUBJECT, b"x" * size) for _ in range(n)]
    await asyncio.gather(*acks)


async def _next(feed: EventFeed, buffered: bool) -> int:
    """The next message's stream sequence, read as ``Client.watch`` reads (``buffered``:
    what has arrived without a timer, then a bounded wait) or by ``next`` alone."""
    msg = await feed.buffered() if buffered else None
    if msg is None:
        msg = await asyncio.wait_for(feed.next(), 10)
    return int(msg.metadata.sequence.stream)


@pytest.mark.parametrize("buffered", [False, True], ids=["next", "buffered-first"])
async def test_a_long_history_is_read_in_order_and_the_flow_control_answered(
        bus: Bus, nats_url: str, buffered: bool) -> None:
    await _publish(bus, 3000, 8000)  # 24 MB: more than the server sends unanswered
    answers = 0

    async def on_answer(_: object) -> None:
        nonlocal answers
        answers += 1

    await bus.nc.subscribe("$JS.FC.RATCHET_EVENTS.>", cb=on_answer)
    nc = await nats.connect(nats_url)
    feed = EventFeed(nc, "ratchet.events.acme.tsk_a.>")
    try:
        seen = [await _next(feed, buffered) for _ in range(3000)]
        assert seen == list(range(1, 3001))
        await nc.flush()
        await bus.nc.flush()
        assert answers > 0, "the server asked for no flow control: the test proves nothing"
    finally:
        await feed.close()
        await nc.close()


async def test_a_new_consumer_starts_after_the_last_message_seen(
        bus: Bus, nats_url: str) -> None:
    await _publish(bus, 5, 10)
    nc = await nats.connect(nats_url)
    feed = EventFeed(nc, "ratchet.events.acme.tsk_a.>")
    try:
        first = [(await asyncio.wait_for(feed.next(), 10)).metadata.sequence.stream
                 for _ in range(3)]
        await feed.close()  # as after a gap or a lost consumer: the next call opens anew
        await _publish(bus, 2, 10)
        rest = [(await asyncio.wait_for(feed.next(), 10)).metadata.sequence.stream
                for _ in range(4)]
        assert first + rest == [1, 2, 3, 4, 5, 6, 7]
    finally:
        await feed.close()
        await nc.close()
