"""What a long-running node keeps is bounded: recent-id windows, JetStream streams."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js.api import DiscardPolicy, RetentionPolicy
from nats.js.errors import APIError

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.transport.bus import Bus, StreamLimits, stream_configs
from ratchet.actors.transport.tool_queues import tool_stream_config
from ratchet.persistence.store import Store
from ratchet.persistence.txns import NewTask, TaskChange, apply_change_txn
from ratchet.protocol.clock import FakeClock, SystemClock
from ratchet.protocol.codec import decode_map
from ratchet.protocol.mail_seal import MailSeal
from ratchet.protocol.subjects import STREAM_DLQ, STREAM_EVENTS, STREAM_SUBMIT
from ratchet.supervisors.services.mail_router import RecentIds
from ratchet.supervisors.services.outbox_relay import OutboxRelay


def test_recent_ids_forget_what_is_older_than_their_age() -> None:
    clock = FakeClock()
    recent = RecentIds(clock, max_age=120.0, max_count=1000)
    recent.add("m-1")
    clock.advance(100.0)
    recent.add("m-2")
    assert "m-1" in recent and "m-2" in recent
    clock.advance(30.0)
    recent.add("m-3")
    assert "m-1" not in recent
    assert "m-2" in recent and "m-3" in recent


def test_recent_ids_keep_at_most_their_count_however_fast_ids_arrive() -> None:
    recent = RecentIds(FakeClock(), max_age=120.0, max_count=100)
    for i in range(10_000):
        recent.add(f"m-{i}")
    assert len(recent) == 100
    assert "m-9999" in recent and "m-9899" not in recent


def test_every_stream_has_a_byte_limit_and_says_what_goes_at_it() -> None:
    configs = {c.name: c for c in stream_configs(StreamLimits())}
    for config in configs.values():
        assert config.max_bytes is not None and config.max_bytes > 0
    assert configs[STREAM_EVENTS].discard == DiscardPolicy.OLD
    assert configs[STREAM_DLQ].discard == DiscardPolicy.OLD
    assert configs[STREAM_DLQ].max_msgs == StreamLimits().dlq_max_msgs > 0
    queues = [c for c in configs.values() if c.retention == RetentionPolicy.WORK_QUEUE]
    assert len(queues) == 4  # submit, mail, external, decisions; tools per tenant:
    tools = tool_stream_config("acme", StreamLimits())
    assert tools.max_msgs == StreamLimits().tools_max_msgs > 0
    assert tools.max_bytes == StreamLimits().tools_max_bytes > 0
    assert all(c.discard == DiscardPolicy.NEW for c in [*queues, tools])


async def test_a_full_work_queue_refuses_new_messages_and_a_full_events_stream_drops_old(
    nats_url: str,
) -> None:
    bus = await Bus.connect(nats_url)
    try:
        limits = StreamLimits(events_max_bytes=64 * 1024, queue_max_bytes=64 * 1024)
        await bus.ensure_streams(stream_configs(limits))
        payload = b"x" * 1024
        with pytest.raises(APIError):  # the producer is told; nothing is dropped silently
            for i in range(200):
                await bus.js.publish("ratchet.submit.acme", payload,
                                     headers={"Nats-Msg-Id": f"s-{i}"})
        kept = (await bus.js.stream_info(STREAM_SUBMIT)).state.messages
        assert 0 < kept < 200
        for i in range(200):
            await bus.js.publish(f"ratchet.events.acme.t{i}.step.completed", payload)
        info = await bus.js.stream_info(STREAM_EVENTS)
        assert info.state.bytes <= 64 * 1024
        assert info.state.last_seq == 200 and info.state.first_seq > 1  # the oldest went
    finally:
        await bus.close()


async def _accept_t1(store: Store) -> None:
    """Task t1 of tenant acme accepted: its first event (sequence 1) is in the outbox."""
    await store.accept_submission(NewTask(
        task_id="t1", tenant="acme", workflow="w", workflow_version=1,
        idempotency_key="k1", request_hash="sha256:aa", input=b"\x80", steps_total=3,
        deadline_at=None, now=1.0, producer="test", message_id="m",
        start_mail=("ratchet.mail.0.t1.task", "start-t1", b"\x80")))


async def test_an_outbox_relay_holding_few_rows_still_publishes_every_event_in_order(
    nats_url: str, tmp_path: Path,
) -> None:
    bus = await Bus.connect(nats_url)
    # NORMAL: commits return without waiting for a sync, so they outrun the relay at once.
    store = await Store.open(tmp_path / "r.db", "NORMAL")
    system = ActorSystem(SystemClock())
    relay = OutboxRelay(bus, store, SystemClock(), MailSeal(await store.cluster_secret("mail")),
                        max_pending=5, linger=0)
    try:
        await bus.ensure_streams()
        ref = system.spawn(relay, "outbox")
        await _accept_t1(store)
        changes = [TaskChange(task_id="t1", expected_version=v, producer="test", now=2.0,
                              events=[("step.completed", {"i": v}), ("task.progress", {})])
                   for v in range(1, 41)]
        for change in changes:  # 81 events while the relay may hold 5: most wait in the table
            await store.apply(change)
        sub = await bus.js.subscribe("ratchet.events.acme.t1.>", ordered_consumer=True)
        seen = []
        while len(seen) < 81:
            msg = await sub.next_msg(timeout=10)
            seen.append(decode_map(msg.data)["sequence"])
        assert seen == list(range(1, 82))
        assert relay.overflows >= 1
        assert await relay.flush(timeout=10)
        await ref.stop_and_wait(timeout=10)
    finally:
        await store.close()
        await bus.close()


async def test_rows_committed_unannounced_go_out_before_later_ones_once_the_store_asks(
    nats_url: str, tmp_path: Path,
) -> None:
    """A PostgreSQL store that cannot vouch for a commit (the server went down) announces
    nothing of it, yet it may have survived: asked to read the table back, the relay takes
    no announcement until it has, so the task's events still go out in order."""
    bus = await Bus.connect(nats_url)
    store = await Store.open(tmp_path / "r.db", "NORMAL")
    system = ActorSystem(SystemClock())
    relay = OutboxRelay(bus, store, SystemClock(), MailSeal(await store.cluster_secret("mail")),
                        linger=0)  # sweep_interval 5 s: only the read back can find it soon
    try:
        await bus.ensure_streams()
        ref = system.spawn(relay, "outbox")
        await _accept_t1(store)
        sub = await bus.js.subscribe("ratchet.events.acme.t1.>", ordered_consumer=True)
        first = decode_map((await sub.next_msg(timeout=10)).data)["sequence"]
        assert first == 1  # the relay has swept the table at its start and published it
        unannounced = TaskChange(task_id="t1", expected_version=1, producer="test", now=2.0,
                                 events=[("step.completed", {"i": 1})])
        await store.run_txn(lambda c: apply_change_txn(c, unannounced))  # no announcement
        relay._read_back()  # what the store calls then (add_outbox_resync)
        await store.apply(TaskChange(task_id="t1", expected_version=2, producer="test",
                                     now=3.0, events=[("step.completed", {"i": 2})]))
        seen = [decode_map((await sub.next_msg(timeout=10)).data)["sequence"]
                for _ in range(2)]
        assert seen == [2, 3]
        await ref.stop_and_wait(timeout=10)
    finally:
        await store.close()
        await bus.close()
