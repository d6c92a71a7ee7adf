"""Durable by default: with ``synchronous=FULL`` nothing leaves the process before the
commit it rests on is on disk, even when the committing task goes on at once.

The WAL syncer's sync is held by a gate (``sync=``), so each test checks the order of
things deterministically: what must wait cannot have happened while the gate is shut.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from ratchet.actors.task import durability
from ratchet.persistence import NewTask, Store, TaskChange
from ratchet.persistence.connection import open_connection
from ratchet.persistence.txns import OutboxRow
from ratchet.persistence.writer import LoopWriter
from ratchet.protocol.catalogue import EventType
from ratchet.protocol.errors import StoreFileLost, StoreUnavailable
from ratchet.supervisors.cli.parser import parser
from ratchet.supervisors.node.config import NodeConfig


class SyncGate:
    """A sync the test holds shut: ``entered`` once a sync has begun (so every commit
    counted before it is written), and no sync returns before :meth:`open`."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail = fail
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise OSError(5, "Input/output error")
        os.fdatasync(fd)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "no sync began"

    def open(self) -> None:
        self.gate.set()


def _table(path: str) -> None:
    conn = open_connection(path, "NORMAL")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.close()


def _insert(conn: object) -> int:
    return conn.execute("INSERT INTO t VALUES (1)").lastrowid  # type: ignore[attr-defined, no-any-return]


async def _loop_writer(tmp_path: Path, gate: SyncGate) -> LoopWriter:
    path = str(tmp_path / "w.db")
    _table(path)
    writer = LoopWriter(path, "FULL", sync=gate)
    writer.start()
    return writer


async def test_a_commit_is_answered_only_once_the_wal_sync_after_it_returned(
        tmp_path: Path) -> None:
    gate = SyncGate()
    writer = await _loop_writer(tmp_path, gate)
    try:
        answer = writer.submit(_insert)
        await gate.wait_entered()  # the batch committed; its sync is under way, held
        assert not answer.done()
        gate.open()
        assert await answer == 1
        assert writer.stats.syncs >= 1 and writer.stats.batches_synced >= 1
    finally:
        gate.open()
        await writer.close()


async def test_a_pipelined_commit_is_answered_at_once_and_its_durability_later(
        tmp_path: Path) -> None:
    gate = SyncGate()
    writer = await _loop_writer(tmp_path, gate)
    try:
        value, durable = await writer.submit_pipelined(_insert)
        assert value == 1 and durable is not None
        await gate.wait_entered()
        barrier = asyncio.ensure_future(writer.synced())
        await asyncio.sleep(0)  # let the barrier register behind the held sync
        assert not durable.done() and not barrier.done()
        gate.open()
        await durable
        await barrier
    finally:
        gate.open()
        await writer.close()


async def test_one_sync_covers_every_batch_committed_while_the_previous_sync_ran(
        tmp_path: Path) -> None:
    gate = SyncGate()
    writer = await _loop_writer(tmp_path, gate)
    try:
        first = writer.submit(_insert)
        await gate.wait_entered()  # sync 1 holds; the next batches wait for sync 2
        later = []
        for _ in range(5):
            later.append(writer.submit(_insert))
            await asyncio.sleep(0)  # each its own batch (its own loop iteration)
        gate.open()
        await asyncio.gather(first, *later)
        assert writer.stats.batches >= 6
        assert writer.stats.syncs <= 2 < writer.stats.batches
    finally:
        gate.open()
        await writer.close()


async def test_a_failed_sync_fails_its_waiters_and_refuses_every_later_write(
        tmp_path: Path) -> None:
    gate = SyncGate(fail=True)
    writer = await _loop_writer(tmp_path, gate)
    try:
        _, durable = await writer.submit_pipelined(_insert)
        plain = writer.submit(_insert)
        gate.open()
        with pytest.raises(StoreUnavailable):
            await plain
        assert durable is not None
        with pytest.raises(StoreUnavailable):
            await durable
        with pytest.raises(StoreFileLost):  # never retried: the pages may be gone
            await writer.submit(_insert)
    finally:
        await writer.close()


def _new_task() -> NewTask:
    return NewTask(task_id="t1", tenant="acme", workflow="w", workflow_version=1,
                   idempotency_key="k1", request_hash="sha256:aa", input=b"\x80",
                   steps_total=3, deadline_at=None, now=1.0, producer="test", message_id="m",
                   start_mail=("ratchet.mail.0.t1.task", "start-t1", b"\x80"))


async def _store(tmp_path: Path, gate: SyncGate) -> Store:
    store = Store(tmp_path / "s.db")  # the default: FULL
    store._writer = store._syncing = LoopWriter(store.path, "FULL", sync=gate)
    await store._open()
    return store


async def test_a_pipelined_changes_events_are_published_only_once_it_is_durable(
        tmp_path: Path) -> None:
    gate = SyncGate()
    gate.open()  # the task's creation goes through
    store = await _store(tmp_path, gate)
    announced: list[list[OutboxRow]] = []
    store.add_outbox_listener(announced.append)
    try:
        await store.accept_submission(_new_task())
        announced.clear()
        gate.gate.clear()
        gate.entered.clear()
        result = await store.apply(TaskChange(
            task_id="t1", expected_version=1, producer="test", now=2.0, pipelined=True,
            events=[(EventType.TASK_PROGRESS, {"steps_completed": 1})]))
        assert result.version == 2 and result.durable is not None  # the caller goes on
        read = asyncio.ensure_future(store.events("t1"))  # a reply built on a read
        await gate.wait_entered()
        assert announced == [] and not read.done()  # held: not on disk yet
        gate.open()
        await result.durable
        assert [r.subject for rows in announced for r in rows][-1].endswith("task.progress")
        assert [e["type"] for e in await read][-1] == "task.progress"
    finally:
        gate.open()
        await store.close()


async def test_a_task_actor_answers_no_mail_before_its_last_change_is_durable() -> None:
    class Actor:
        undurable: asyncio.Future[None] | None = None

    actor = Actor()
    durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    durability.note(actor, durable)
    answer = asyncio.ensure_future(durability.settled(actor))
    await asyncio.sleep(0)
    assert not answer.done()
    durable.set_result(None)
    await answer
    durability.note(actor, None)  # a plain commit: durable on return
    await durability.settled(actor)


def test_full_is_the_default_of_the_store_the_node_and_serve(tmp_path: Path) -> None:
    assert Store(tmp_path / "d.db").synchronous == "FULL"
    assert NodeConfig(state_dir=tmp_path).synchronous == "FULL"
    args = parser().parse_args(["serve", "--app", "bench.app:app"])
    assert args.synchronous == "FULL"
    normal = parser().parse_args(["serve", "--app", "x:y", "--synchronous", "NORMAL"])
    assert normal.synchronous == "NORMAL"
