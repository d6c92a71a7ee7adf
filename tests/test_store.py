"""The Store on a real SQLite file: migrations, compare-and-set, group commit,
request idempotency, checkpoints without copying, inbox dedup."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from ratchet.persistence import (
    CheckpointWrite,
    NewTask,
    StateDelta,
    StateTracker,
    Store,
    TaskChange,
)
from ratchet.persistence.blobs import CHUNK_BYTES
from ratchet.persistence.checkpoints import ValueWrite
from ratchet.persistence.migrations import MIGRATIONS, migrate
from ratchet.persistence.store_select import open_store
from ratchet.protocol import IllegalTransition, TaskEvent, VersionConflict
from ratchet.protocol.errors import DuplicateMessage


def _new_task(task_id: str = "t1", key: str = "k1", digest: str = "sha256:aa") -> NewTask:
    return NewTask(task_id=task_id, tenant="acme", workflow="w", workflow_version=1,
                   idempotency_key=key, request_hash=digest, input=b"\x80", steps_total=3,
                   deadline_at=None, now=1.0, producer="test", message_id="m",
                   start_mail=("ratchet.mail.0.t1.task", f"start-{task_id}", b"\x80"))


@pytest.fixture(params=["NORMAL", "FULL", "FULL-thread", "postgres"])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    # NORMAL commits on the event loop, FULL too with the WAL synced on a thread of its own,
    # FULL-thread on a writer thread (serve --writer thread), "postgres" on PostgreSQL
    # (persistence/postgres/): all must behave alike.
    if request.param == "postgres":
        s = await open_store(request.getfixturevalue("pg_url"))
    else:
        synchronous, _, writer = request.param.partition("-")
        s = await Store.open(tmp_path / "r.db", synchronous, writer or "auto")
    yield s  # type: ignore[misc]
    await s.close()


def _change(version: int, **kw: object) -> TaskChange:
    return TaskChange(task_id="t1", expected_version=version, producer="test", now=2.0, **kw)  # type: ignore[arg-type]


def test_migrations_run_once_and_are_recorded(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    assert migrate(conn) == MIGRATIONS[-1][0]
    assert migrate(conn) == MIGRATIONS[-1][0]
    rows = conn.execute("SELECT version FROM schema_migrations").fetchall()
    assert rows == [(v,) for v, _, _ in MIGRATIONS]


def test_a_database_made_by_the_first_release_gains_the_later_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    monkeypatch.setattr("ratchet.persistence.migrations.MIGRATIONS", MIGRATIONS[:1])
    assert migrate(conn) == 1  # as the first release left it
    monkeypatch.undo()
    assert migrate(conn) == MIGRATIONS[-1][0]
    columns = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
    assert "step_failures" in columns


async def test_the_same_request_twice_makes_one_task(store: Store) -> None:
    first = await store.accept_submission(_new_task())
    second = await store.accept_submission(_new_task())
    assert first.created and not second.created
    assert second.task_id == first.task_id
    assert await store.count("tasks") == 1


async def test_the_same_key_with_another_body_is_a_recorded_conflict(store: Store) -> None:
    await store.accept_submission(_new_task())
    result = await store.accept_submission(_new_task(digest="sha256:bb"))
    assert result.conflict and not result.created
    assert await store.count("tasks") == 1
    assert await store.count("request_conflicts") == 1


async def test_a_stale_version_is_rejected_and_changes_nothing(store: Store) -> None:
    await store.accept_submission(_new_task())
    await store.apply(_change(1, status_event=TaskEvent.DISPATCHED, events=[("task.started", {})]))
    with pytest.raises(VersionConflict):
        await store.apply(_change(1, events=[("x", {})]))
    rec = await store.load_task("t1")
    assert (rec.version, rec.status, rec.last_event_seq) == (2, "RUNNING", 2)


async def test_an_illegal_transition_rolls_back_the_whole_change(store: Store) -> None:
    await store.accept_submission(_new_task())
    with pytest.raises(IllegalTransition):
        await store.apply(_change(1, status_event=TaskEvent.SUCCEEDED, events=[("x", {})]))
    assert (await store.load_task("t1")).version == 1
    assert [e["type"] for e in await store.events("t1")] == ["task.queued"]


async def test_concurrent_changes_share_commits_and_a_failure_spares_its_neighbours(
    store: Store,
) -> None:
    for i in range(50):
        await store.accept_submission(_new_task(f"t{i}", f"k{i}"))
    batches_before = store.writer_stats.batches

    async def dispatch(i: int, version: int) -> object:
        change = TaskChange(task_id=f"t{i}", expected_version=version, producer="p", now=3.0,
                            status_event=TaskEvent.DISPATCHED, events=[("task.started", {})])
        return await store.apply(change)

    results = await asyncio.gather(
        *(dispatch(i, 99 if i == 7 else 1) for i in range(50)), return_exceptions=True
    )
    assert isinstance(results[7], VersionConflict)
    assert sum(not isinstance(r, Exception) for r in results) == 49
    assert store.writer_stats.batches - batches_before < 50
    assert store.writer_stats.largest_batch > 1
    assert (await store.load_task("t8")).status == "RUNNING"
    assert (await store.load_task("t7")).status == "QUEUED"


async def test_event_sequences_are_contiguous_per_task(store: Store) -> None:
    await store.accept_submission(_new_task())
    version = 1
    for _ in range(5):
        version = (await store.apply(_change(version, events=[("a", {}), ("b", {})]))).version
    assert [e["sequence"] for e in await store.events("t1")] == list(range(1, 12))


async def test_a_repeated_inbox_message_is_not_applied_twice(store: Store) -> None:
    await store.accept_submission(_new_task())
    await store.apply(_change(1, inbox_message_id="mail-1", events=[("a", {})]))
    with pytest.raises(DuplicateMessage):
        await store.apply(_change(2, inbox_message_id="mail-1", events=[("a", {})]))
    assert (await store.load_task("t1")).last_event_seq == 2


async def test_an_unchanged_large_value_is_stored_once_and_not_rewritten(
    store: Store, tmp_path: Path
) -> None:
    await store.accept_submission(_new_task())
    document = os.urandom(1024 * 1024)
    state: dict[str, object] = {"doc": document, "n": 0}
    tracker = StateTracker()
    version = 1
    for step in range(20):
        state["n"] = step
        delta = tracker.diff(state)
        version = (await store.apply(_change(version, checkpoint=CheckpointWrite(
            step, f"s{step}", step + 1, delta)))).version
    assert await store.count("blobs") == 1
    # step 0 wrote doc + n; every later step wrote only n
    assert await store.count("checkpoint_values") == 2 + 19
    assert await store.count("checkpoints") == 20
    loaded = await store.load_state("t1")
    assert loaded.values == {"doc": document, "n": 19}


async def test_a_value_over_a_chunk_is_stored_in_chunks_and_loads_whole(store: Store) -> None:
    await store.accept_submission(_new_task())
    raw, text = os.urandom(3 * CHUNK_BYTES + 5), "é€😀" * (CHUNK_BYTES // 3)
    delta = StateTracker().diff({"raw": raw, "text": text, "n": 1})
    await store.apply(_change(1, checkpoint=CheckpointWrite(0, "s0", 1, delta)))
    assert await store.count("blobs") == 2
    # 3 MiB and a few bytes each (the text: 9 bytes of UTF-8 every 3 characters): 4 chunks
    assert await store.count("blob_chunks") == 4 + 4
    loaded = await store.load_state("t1")
    assert loaded.values == {"raw": raw, "text": text, "n": 1}
    assert set(loaded.blobs) == {"raw", "text"} and "raw" not in loaded.encoded


def test_a_large_value_is_compared_by_digest_unless_it_is_the_same_str_or_bytes() -> None:
    tracker = StateTracker()
    document, rows = "d" * 10_000, [{"i": i} for i in range(1000)]
    tracker.diff({"doc": document, "rows": rows})
    assert tracker.diff({"doc": document, "rows": rows}).values == []
    assert tracker.diff({"doc": "d" * 10_000, "rows": list(rows)}).values == []  # equal
    rows.append({"i": 1000})  # changed in place: the same object, encoded again
    delta = tracker.diff({"doc": document, "rows": rows})
    assert [v.key for v in delta.values] == ["rows"] and len(delta.blobs) == 1
    delta = tracker.diff({"doc": "small", "rows": rows})  # a blob becomes an inline value
    assert [(v.key, v.inline) for v in delta.values] == [("doc", b"\xa5small")]
    assert [v.key for v in tracker.diff({"rows": rows}).values if v.deleted] == ["doc"]


async def test_blobs_written_before_chunks_existed_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn)
    document = os.urandom(2 * CHUNK_BYTES)  # one row, as every blob was before
    encoded = bytes(StateTracker().diff({"doc": document}).blobs.popitem()[1])
    conn.execute("INSERT INTO blobs(digest, size, data, created_at) VALUES ('sha256:x', ?, ?, 1)",
                 (len(encoded), encoded))
    conn.close()
    store = await Store.open(path, "NORMAL")
    try:
        await store.accept_submission(_new_task())
        await store.apply(_change(1, checkpoint=CheckpointWrite(0, "s0", 1, StateDelta(
            values=[ValueWrite("doc", blob="sha256:x")]))))
        assert (await store.load_state("t1")).values == {"doc": document}
    finally:
        await store.close()


async def test_any_historical_checkpoint_can_be_loaded(store: Store) -> None:
    await store.accept_submission(_new_task())
    tracker = StateTracker()
    version = 1
    for step, state in enumerate([{"a": 1}, {"a": 2, "b": "x"}, {"b": "y"}]):
        delta = tracker.diff(state)
        version = (await store.apply(_change(version, checkpoint=CheckpointWrite(
            step, f"s{step}", step + 1, delta)))).version
    assert (await store.load_state("t1", checkpoint=1)).values == {"a": 1}
    assert (await store.load_state("t1", checkpoint=2)).values == {"a": 2, "b": "x"}
    assert (await store.load_state("t1")).values == {"b": "y"}


async def test_a_restarted_tracker_does_not_rewrite_known_blobs(store: Store) -> None:
    await store.accept_submission(_new_task())
    big = "x" * 100_000
    delta = StateTracker().diff({"big": big})
    await store.apply(_change(1, checkpoint=CheckpointWrite(0, "s0", 1, delta)))
    loaded = await store.load_state("t1")
    tracker = StateTracker(loaded.encoded, blobs=loaded.blobs, values=loaded.values)
    delta = tracker.diff({"big": loaded.values["big"], "n": 1})
    assert delta.blobs == {} and [v.key for v in delta.values] == ["n"]
