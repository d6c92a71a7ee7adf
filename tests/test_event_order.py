"""A task's events reach the stream out of order when several nodes' relays publish them (a
fan-out placed over nodes): ``Client.watch`` yields them strictly by sequence, holds the
terminal event until every earlier one came, and reads a gap that does not fill from the
store (actors/transport/event_watch.py). On a real nats-server; the store behind
``history`` is the node's (last test) or an in-memory one (the others)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import nats
from structlog.testing import capture_logs

import ratchet
from ratchet.actors.transport.bus import Bus
from ratchet.actors.transport.event_feed import EventFeed
from ratchet.actors.transport.event_watch import EventOrder, follow
from ratchet.protocol.errors import Unavailable
from ratchet.protocol.events import encode_event
from ratchet.protocol.messages import Event
from ratchet.protocol.subjects import STREAM_EVENTS, event_subject, task_events_filter
from tests.conftest import NodeFactory, assert_contiguous, wait_terminal

TASK = "tsk_order"


def _event(sequence: int, type_: str = "branch.step_completed") -> Event:
    return Event(event_id=f"evt_{sequence}", task_id=TASK, tenant="acme", sequence=sequence,
                 type=type_, aggregate_version=sequence, occurred_at=float(sequence),
                 producer="n1", payload={"n": sequence})


async def _publish(bus: Bus, *events: Event) -> None:
    for e in events:
        data = encode_event(event_id=e.event_id, task_id=e.task_id, tenant=e.tenant,
                            sequence=e.sequence, event_type=e.type,
                            aggregate_version=e.aggregate_version, occurred_at=e.occurred_at,
                            producer=e.producer, payload=e.payload)
        await bus.js.publish(event_subject("acme", TASK, e.type), data)


def _store(events: list[Event], asked: list[int]) -> Callable[[str, int, int], asyncio.Future[
        list[Event]]]:
    """An in-memory ``history``: the stored events after a sequence (``asked`` records
    each ``after``)."""
    async def history(task_id: str, after: int, limit: int) -> list[Event]:
        asked.append(after)
        return [e for e in events if e.sequence > after][:limit]
    return history  # type: ignore[return-value]


async def _watch(nats_url: str, history: Callable[..., asyncio.Future[list[Event]]],
                 into: list[int], gap_timeout: float = 5.0) -> None:
    nc = await nats.connect(nats_url)
    feed = EventFeed(nc, task_events_filter("acme", TASK))
    try:
        async for event in follow(feed, TASK, 0, follow_terminal=False, idle_timeout=30,
                                  history=history, gap_timeout=gap_timeout):
            into.append(event.sequence)
    finally:
        await feed.close()
        await nc.close()


def test_the_buffer_yields_by_sequence_drops_repeats_and_skips_only_when_told() -> None:
    order = EventOrder(after=1)
    for seq in (4, 2, 4, 1):
        order.add(_event(seq), now=10.0)
    assert [e.sequence for e in iter(lambda: order.pop(10.0), None)] == [2]
    assert order.gap() == (3, 3) and order.gap_since == 10.0
    order.add(_event(3), now=11.0)
    assert [e.sequence for e in iter(lambda: order.pop(11.0), None)] == [3, 4]
    assert order.gap() is None and order.gap_since is None
    order.add(_event(7), now=12.0)
    assert order.skip() == (5, 6)
    assert [e.sequence for e in iter(lambda: order.pop(12.0), None)] == [7]


async def test_events_published_out_of_order_are_yielded_in_order_and_the_terminal_one_last(
        bus: Bus, nats_url: str) -> None:
    asked: list[int] = []
    seen: list[int] = []
    # Another node's relay is late with 2 and 3: the terminal event (5) comes before them.
    await _publish(bus, _event(1), _event(4), _event(5, "task.succeeded"))
    watching = asyncio.create_task(_watch(nats_url, _store([], asked), seen))
    await bus.nc.flush()
    await _publish(bus, _event(3), _event(2))
    await asyncio.wait_for(watching, 10)
    assert seen == [1, 2, 3, 4, 5]
    assert asked == [], "the gap filled from the stream: the store was not asked"


async def test_a_gap_the_stream_never_fills_is_read_from_the_store(
        bus: Bus, nats_url: str) -> None:
    stored = [_event(1), _event(2), _event(3, "task.succeeded")]
    await _publish(bus, stored[0], stored[2])  # 2 never published (its node died)
    asked: list[int] = []
    seen: list[int] = []
    await asyncio.wait_for(_watch(nats_url, _store(stored, asked), seen, gap_timeout=0.2), 10)
    assert seen == [1, 2, 3]
    assert asked == [1]


async def test_a_gap_neither_the_stream_nor_the_store_fills_is_skipped_with_a_warning(
        bus: Bus, nats_url: str) -> None:
    await _publish(bus, _event(1), _event(3, "task.succeeded"))

    async def refused(task_id: str, after: int, limit: int) -> list[Event]:
        raise Unavailable("no node serves the admin subject")

    seen: list[int] = []
    with capture_logs() as logs:
        await asyncio.wait_for(_watch(nats_url, refused, seen, gap_timeout=0.2), 10)  # type: ignore[arg-type]
    assert seen == [1, 3]
    skipped = [entry for entry in logs if entry["event"].startswith("events skipped")]
    assert skipped and skipped[0]["missing"] == [2, 2]


async def test_a_watch_reads_an_event_missing_from_the_stream_from_the_nodes_store(
        start_node: NodeFactory, client: ratchet.Client, tmp_path: Path) -> None:
    await start_node()
    task_id = (await client.submit("three", {"x": 1}, key="order-1")).task_id
    events = await wait_terminal(client, task_id)
    assert len(events) >= 3
    # Lose one of its events from the stream (as if its relay never published it).
    js = client.nc.jetstream()
    second = await js.get_last_msg(STREAM_EVENTS, event_subject("acme", task_id,
                                                                events[1].type))
    await js.delete_msg(STREAM_EVENTS, second.seq)
    again: list[Event] = []

    async def collect() -> None:
        async for event in client.watch(task_id, gap_timeout=0.2):
            again.append(event)

    await asyncio.wait_for(collect(), 10)
    assert_contiguous(again)
    assert [e.type for e in again] == [e.type for e in events]
    assert again[1].producer == "store"
