"""A task change and an acceptance as one server-side call on PostgreSQL
(persistence/postgres/change_sql.py, change_call.py, accept_call.py), and the durability of
commits that do not wait for their WAL flush (postgres/syncer.py). The contract both stores
keep runs in test_store.py and test_leases.py; here: what only this path can get wrong.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import psycopg
import pytest

from ratchet.persistence.checkpoints import StateDelta, ValueWrite
from ratchet.persistence.postgres import PostgresStore
from ratchet.persistence.postgres import store as pg_store
from ratchet.persistence.store_select import open_store
from ratchet.persistence.txns import CheckpointWrite, NewTask, TaskChange
from ratchet.protocol.errors import StoreUnavailable
from ratchet.protocol.events import decode_event, encode_event, encode_event_parts, pack_payload
from ratchet.protocol.states import TaskEvent
from ratchet.testing.pg import PgServer

#: Where msgpack's unsigned integer changes form, and either side of it.
BOUNDARIES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40, 2**62]


def _new_task(task_id: str) -> NewTask:
    return NewTask(task_id=task_id, tenant="acme", workflow="w", workflow_version=1,
                   idempotency_key=task_id, request_hash="h", input=b"\x80", steps_total=3,
                   deadline_at=None, now=1.0, producer="test", message_id=None,
                   start_mail=("ratchet.mail.0.t.task", f"start-{task_id}", b"\x80"))


def _step(task_id: str, version: int, index: int, **extra: Any) -> TaskChange:
    return TaskChange(
        task_id=task_id, expected_version=version, producer="p", now=2.0 + index,
        events=[("step.completed", {"step": f"s{index}", "index": index}),
                ("task.progress", {"done": index + 1})],
        checkpoint=CheckpointWrite(step_index=index, step_name=f"s{index}",
                                   next_step=index + 1, delta=StateDelta(
                                       values=[ValueWrite("n", msgpack.packb(index)),
                                               ValueWrite("big", blob="d1")],
                                       blobs={"d1": msgpack.packb(b"\x01" * 3000)})),
        **extra)


def test_an_events_wire_form_cut_around_its_sequence_and_version_is_whole_again() -> None:
    fields = dict(event_id="evt_1", task_id="tsk_1", tenant="acme", event_type="step.done",
                  occurred_at=1.5, producer="n")
    for payload in ({"a": 1}, {"bytes": b"\xcf" + b"\xff" * 8}, {"big": "x" * 300_000}):
        head, mid, tail = encode_event_parts(**fields, payload=payload,
                                             packed_payload=pack_payload(payload))
        for sequence in BOUNDARIES[1:]:
            whole = head + msgpack.packb(sequence) + mid + msgpack.packb(7) + tail
            assert whole == encode_event(**fields, payload=payload, sequence=sequence,
                                         aggregate_version=7)


async def test_the_server_packs_an_unsigned_integer_as_msgpack_does(pg_url: str) -> None:
    await (await open_store(pg_url)).close()  # migrated: the function is migration 22
    with psycopg.connect(pg_url) as conn:
        for n in BOUNDARIES:
            row = conn.execute("SELECT ratchet_mp_uint(%s)", (n,)).fetchone()
            assert row is not None and bytes(row[0]) == msgpack.packb(n), n


async def test_a_change_by_the_call_writes_the_rows_the_transaction_writes(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await open_store(pg_url)
    try:
        for task_id in ("by-call", "by-txn"):
            await store.accept_submission(_new_task(task_id))
        await store.apply(_step("by-call", 1, 0, status_event=TaskEvent.DISPATCHED))
        await store.apply(_step("by-call", 2, 1, control={"pause": True}))
        monkeypatch.setattr(pg_store, "fast_path", lambda change: False)
        await store.apply(_step("by-txn", 1, 0, status_event=TaskEvent.DISPATCHED))
        await store.apply(_step("by-txn", 2, 1, control={"pause": True}))
        call, txn = await store.load_task("by-call"), await store.load_task("by-txn")
        assert (call.version, call.status, call.last_event_seq, call.last_checkpoint,
                call.next_step, call.control) == (
            txn.version, txn.status, txn.last_event_seq, txn.last_checkpoint, txn.next_step,
            txn.control)
        for task_id in ("by-call", "by-txn"):
            assert [e["type"] for e in await store.events(task_id)] == [
                "task.queued", "step.completed", "task.progress", "step.completed",
                "task.progress"]
            assert (await store.load_state(task_id)).values == {"n": 1, "big": b"\x01" * 3000}
        rows = await store.pending_outbox()
        published = [decode_event(r.payload) for r in rows if r.subject.startswith(
            "ratchet.events.") and r.msg_id.startswith("evt")]
        by_task = {t: [(e.sequence, e.aggregate_version, e.type) for e in published
                       if e.task_id == t] for t in ("by-call", "by-txn")}
        assert by_task["by-call"] == by_task["by-txn"] == [
            (1, 1, "task.queued"), (2, 2, "step.completed"), (3, 2, "task.progress"),
            (4, 3, "step.completed"), (5, 3, "task.progress")]
    finally:
        await store.close()


async def test_a_refused_call_leaves_the_calls_behind_it_on_its_connection_alone(
        pg_url: str) -> None:
    store = await open_store(pg_url)
    try:
        await asyncio.gather(*(store.accept_submission(_new_task(f"t{i}")) for i in range(40)))
        results = await asyncio.gather(
            *(store.apply(_step(f"t{i}", 5 if i % 3 == 0 else 1, 0)) for i in range(40)),
            return_exceptions=True)
        refused = [i for i, r in enumerate(results) if isinstance(r, Exception)]
        assert refused == [i for i in range(40) if i % 3 == 0]
        versions = [(await store.load_task(f"t{i}")).version for i in range(40)]
        assert versions == [1 if i % 3 == 0 else 2 for i in range(40)]
    finally:
        await store.close()


async def test_a_pipelined_change_is_returned_at_its_commit_and_its_events_wait_for_durability(
        pg_url: str) -> None:
    store = await open_store(pg_url)
    announced: list[str] = []
    store.add_outbox_listener(lambda rows: announced.extend(r.msg_id for r in rows))
    try:
        await store.accept_submission(_new_task("t1"))
        result = await store.apply(_step("t1", 1, 0, pipelined=True))
        assert result.durable is not None
        await asyncio.wait_for(result.durable, 10)
        assert len(announced) == 2 + 2  # the acceptance's two rows, then the step's events
    finally:
        await store.close()


async def test_nothing_read_or_committed_before_a_server_restart_is_vouched_for_after_it(
) -> None:
    with PgServer() as pg:
        store = await open_store(pg.database("restarts"))
        assert isinstance(store, PostgresStore)
        try:
            await store.accept_submission(_new_task("t1"))
            read_back: list[bool] = []
            store.add_outbox_resync(lambda: read_back.append(True))
            writer = store._pg_writer
            before = writer.syncer.generation  # what a commit made now would carry
            await asyncio.to_thread(pg.restart, "immediate")
            with pytest.raises(StoreUnavailable):
                await writer.synced(before)  # its WAL may have been lost: not durable
            assert not read_back  # a read was refused, no commit: nothing to read back
            # A commit it cannot vouch for: the relay must read the outbox back.
            before = writer.syncer.generation
            await asyncio.to_thread(pg.restart, "immediate")
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            writer.syncer.after(before, [(done, (True, None))], commits=1)
            with pytest.raises(StoreUnavailable):
                await done
            assert read_back == [True]
            # Writes made after it go on without an error (the reconnect window).
            await store.accept_submission(_new_task("t2"))
            assert (await store.load_task("t2")).version == 1
        finally:
            await store.close()
