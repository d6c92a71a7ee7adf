"""Group settlement of fan-out branches (``Store.finish_branches``) on a real store: a group
settles each RUNNING branch once, leaves settled ones alone, numbers its events on, and
returns the results as a read of the rows would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from ratchet.actors.task.fanout import branch_settlement
from ratchet.persistence import NewTask, Store, TaskChange
from ratchet.persistence.branch_rows import BranchProgress, BranchSettlement
from ratchet.persistence.graph_rows import BranchStep, BranchWrites
from ratchet.persistence.store_select import open_store
from ratchet.persistence.txns import OutboxRow
from ratchet.persistence.writer import LoopWriter
from ratchet.protocol.errors import BranchSettled
from tests.test_durability import SyncGate


@pytest.fixture(params=["NORMAL", "FULL", "postgres"])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "postgres":
        s = await open_store(request.getfixturevalue("pg_url"))
    else:
        s = await Store.open(tmp_path / "r.db", request.param)
    yield s
    await s.close()


async def _fanout(store: Store, branches: list[str]) -> None:
    await store.accept_submission(NewTask(
        task_id="t1", tenant="acme", workflow="w", workflow_version=1, idempotency_key="k1",
        request_hash="sha256:aa", input=b"\x80", steps_total=1, deadline_at=None, now=1.0,
        producer="test", message_id="m", start_mail=("ratchet.mail.0.t1.task", "s-t1", b"\x80")))
    await store.apply(TaskChange(task_id="t1", expected_version=None, producer="test", now=2.0,
                                 branches=BranchWrites("spread#0", start=branches)))


def _done(branch: str, result: object = None, status: str = "SUCCEEDED") -> BranchSettlement:
    return branch_settlement("spread", branch, status, {"key": "spread#0"}, result)


async def test_a_group_settles_each_running_branch_once_and_leaves_settled_ones_alone(
    store: Store,
) -> None:
    await _fanout(store, ["a", "b", "c", "d"])
    assert await store.finish_branches("t1", "spread#0", "test", 3.0, [
        _done("c", status="TIMED_OUT")]) == {"c": None}
    settled = await store.finish_branches("t1", "spread#0", "test", 4.0, [
        _done("a", {"n": 1}), _done("c", {"n": 3}), _done("b", (2,)), _done("a", {"n": 9})])
    assert list(settled.items()) == [("a", {"n": 1}), ("b", [2])]  # as a read gives: (2,) -> [2]
    rows = await store.branches("t1", "spread#0")
    assert {b: r["status"] for b, r in rows.items()} == {
        "a": "SUCCEEDED", "b": "SUCCEEDED", "c": "TIMED_OUT", "d": "RUNNING"}
    assert rows["a"]["result"] == {"n": 1} and rows["b"]["result"] == [2]
    assert rows["c"].get("result") is None
    events = await store.events("t1")
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    ended = [(e["type"], e["payload"]["branch"]) for e in events if e["type"].startswith("branch.")]
    assert ended == [("branch.timed_out", "c"), ("branch.completed", "a"),
                     ("branch.completed", "b")]


async def test_a_group_of_settled_branches_writes_nothing(store: Store) -> None:
    await _fanout(store, ["a", "b"])
    assert await store.finish_branches("t1", "spread#0", "test", 3.0,
                                       [_done("a"), _done("b")]) == {"a": None, "b": None}
    before = await store.events("t1")
    assert await store.finish_branches("t1", "spread#0", "test", 4.0,
                                       [_done("b"), _done("a")]) == {}
    assert await store.events("t1") == before


async def test_a_pipelined_group_returns_at_its_commit_and_its_events_leave_once_durable(
    tmp_path: Path,
) -> None:
    gate = SyncGate()
    gate.open()  # the task and its fan-out go through
    store = Store(tmp_path / "s.db")  # FULL
    store._writer = store._syncing = LoopWriter(store.path, "FULL", sync=gate)
    await store._open()
    announced: list[OutboxRow] = []
    store.add_outbox_listener(announced.extend)
    try:
        await _fanout(store, ["a", "b"])
        await gate.wait_entered()
        gate.gate.clear()
        gate.entered.clear()
        announced.clear()
        settled = await store.finish_branches("t1", "spread#0", "test", 3.0,
                                              [_done("a", 1), _done("b", 2)], pipelined=True)
        assert settled == {"a": 1, "b": 2}  # at the commit: the sync has not returned
        await gate.wait_entered()
        assert announced == []  # not on disk yet: not published
        gate.open()
        await store._syncing.synced()
        assert [r.subject.rsplit(".", 2)[-2:] for r in announced] == [
            ["branch", "completed"], ["branch", "completed"]]
    finally:
        gate.open()
        await store.close()


def _step(branch: str, next_node: str, state: dict[str, object], steps: int) -> BranchWrites:
    return BranchWrites("spread#0", steps=[BranchStep(
        branch, next_node, msgpack.packb(state), msgpack.packb({"s0": 1}), steps)])


async def test_a_branch_step_records_where_it_goes_on_and_a_settled_branch_takes_none(
    store: Store,
) -> None:
    await _fanout(store, ["a", "b", "c"])
    assert await store.branch_progress("t1", "spread#0") == {}  # nothing committed yet
    for steps in (1, 2):
        await store.apply(TaskChange(
            task_id="t1", expected_version=None, producer="test", now=3.0,
            branches=_step("a", f"s{steps}", {"done": list(range(steps))}, steps),
            events=[("branch.step_completed", {"branch": "a", "steps": steps})]))
    await store.finish_branches("t1", "spread#0", "test", 4.0, [_done("c")])
    assert await store.branch_progress("t1", "spread#0") == {
        "a": BranchProgress("s2", {"done": [0, 1]}, {"s0": 1}, 2)}
    assert await store.branch_progress("t1", "spread#0", ["b", "c"]) == {}
    before = await store.events("t1")
    with pytest.raises(BranchSettled):  # its join decided, its timeout fired: it stops
        await store.apply(TaskChange(
            task_id="t1", expected_version=None, producer="test", now=5.0,
            branches=_step("c", "s1", {}, 1),
            events=[("branch.step_completed", {"branch": "c", "steps": 1})]))
    assert await store.events("t1") == before  # rolled back whole: no event either


async def test_a_group_of_branch_steps_records_the_running_ones_with_their_events(
    store: Store,
) -> None:
    await _fanout(store, ["a", "b", "c"])
    await store.finish_branches("t1", "spread#0", "test", 3.0, [_done("c")])

    def write(branch: str) -> tuple[BranchStep, tuple[str, dict[str, object]]]:
        return (BranchStep(branch, "s1", msgpack.packb({"x": branch}), msgpack.packb({}), 1),
                ("branch.step_completed", {"branch": branch, "steps": 1}))

    assert await store.record_branch_steps("t1", "spread#0", "test", 4.0,
                                           [write("a"), write("c"), write("b")]) == {"a", "b"}
    progress = await store.branch_progress("t1", "spread#0")
    assert {b: p.state for b, p in progress.items()} == {"a": {"x": "a"}, "b": {"x": "b"}}
    events = await store.events("t1")
    assert [e["payload"]["branch"] for e in events if e["type"] == "branch.step_completed"] \
        == ["a", "b"]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
