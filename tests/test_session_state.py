"""A tool session's state shared by nodes (actors/effects/session_state.py): written under
its version, so that a write that lost the race applies its call's changes over the other
writer's instead of erasing them; a session served on another node reads the state before
each call. Real SQLite store; the "nodes" are two session actors on one store, as two node
processes on one file are."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ratchet.actors.core.actor import ActorSystem
from ratchet.actors.effects.session_state import save_change
from ratchet.actors.effects.tool_calls import Invoke
from ratchet.actors.effects.tool_session import ToolSession
from ratchet.actors.task.branch_sessions import BranchSessions
from ratchet.persistence import Store
from ratchet.persistence.session_rows import merged
from ratchet.persistence.store_select import open_store
from ratchet.protocol import FakeClock
from tests.test_tool_sessions import PageArgs, read_page, through_the_local_worker


def test_a_merge_applies_the_keys_a_call_set_changed_or_removed_and_keeps_the_others() -> None:
    fresh = {"a": 1, "b": 2, "c": 3, "theirs": 9}
    before = {"a": 1, "b": 2, "c": 3}
    after = {"a": 1, "b": 20, "mine": 7}  # b changed, c removed, mine added
    assert merged(fresh, before, after) == {"a": 1, "b": 20, "mine": 7, "theirs": 9}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_write_that_lost_the_race_keeps_the_winners_changes_and_adds_its_own(
        tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    store = await (Store.open(tmp_path / "s.db") if backend == "sqlite"
                   else open_store(request.getfixturevalue("pg_url")))
    try:
        assert await store.session_state_at("t1", "s") == ({}, 0)
        state, version = await save_change(store, "t1", "s", {}, {"cursor": 1}, 0, 1.0)
        assert (state, version) == ({"cursor": 1}, 1)
        # Two writers read version 1; the first wins, the second is merged over it.
        assert await store.merge_session_state("t1", "s", {"cursor": 1}, {"cursor": 1, "a": 1},
                                               1, 2.0) == ({"cursor": 1, "a": 1}, 2, False)
        with capture_logs() as logs:
            state, version = await save_change(store, "t1", "s", {"cursor": 1},
                                               {"cursor": 1, "b": 2}, 1, 3.0)
        assert (state, version) == ({"cursor": 1, "a": 1, "b": 2}, 3)
        assert await store.session_state_at("t1", "s") == ({"cursor": 1, "a": 1, "b": 2}, 3)
        assert any(entry["event"].startswith("session state changed") for entry in logs)
        # A removal is a change too; the keys the call did not touch are kept.
        assert await store.merge_session_state("t1", "s", {"cursor": 1, "a": 1}, {"a": 1},
                                               2, 4.0) == ({"a": 1, "b": 2}, 4, True)
    finally:
        await store.close()


async def test_sessions_of_one_task_on_two_nodes_each_see_the_cursor_the_other_moved(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    system = ActorSystem()
    try:
        here, there = (system.spawn(ToolSession("t1", "acme", "pages", store, FakeClock(), {},
                                                shared=lambda: True), name)
                       for name in ("here", "there"))
        pages = []
        for session, size in ((here, 3), (there, 2), (here, 1), (there, 4)):
            ok, page = await through_the_local_worker(session)(
                Invoke(read_page, PageArgs(size=size), None, 1, 5.0))
            assert ok
            pages.append(page.items)
        assert pages == [[0, 1, 2], [3, 4], [5], [6, 7, 8, 9]]
        assert await store.session_state_at("t1", "pages") == ({"cursor": 10}, 4)
        for session in (here, there):
            await session.stop_and_wait(5)
    finally:
        await store.close()


def test_the_tasks_own_session_reads_the_state_while_its_branches_run_elsewhere_and_once_after(
        ) -> None:
    sessions = BranchSessions(ActorSystem(), None)  # type: ignore[arg-type]  # no spawn here
    reads = sessions.home_reads("t1")
    assert not reads()  # never spread: the session's own state is the truth
    sessions.spread_to_others("t1")
    assert reads() and reads()  # other nodes may write: read before every call
    sessions.spread.discard("t1")  # the visit is over
    assert reads()  # their last writes may have come after this session's last call
    assert not reads()
    sessions.forget("t1")
    assert reads() and not reads()  # forgotten: one read more, never one less
