"""A tool session's state written by whichever node runs the call: the task's own, or the
node running a fan-out branch placed elsewhere (actors/task/branch_sessions.py serves that
branch's sessions there).

A call's change (the state before it → after it, read at a version) is written as a
change: the store writes it over the state now stored if another writer came first
(``persistence.session_rows``: key by key, in one transaction, migration 25). So a call's
changes are never lost to another's, nor do they erase the keys another changed. Calls of
one session on one node are serialized by its actor's mailbox; calls on two nodes at once
are not, so two that change the same key keep the later write's value (a warning is logged
for each write that found another before it).
"""

from __future__ import annotations

from typing import Any

import structlog

from ratchet.persistence.ports import TaskStore

__all__ = ["save_change"]

log = structlog.get_logger("ratchet.session")


async def save_change(store: TaskStore, task_id: str, session: str, before: dict[str, Any],
                      after: dict[str, Any], version: int, now: float
                      ) -> tuple[dict[str, Any], int]:
    """Store the state a call turned from ``before`` (read at ``version``) into ``after``;
    returns the state and version stored."""
    state, stored, raced = await store.merge_session_state(task_id, session, before, after,
                                                           version, now)
    if raced:
        log.warning("session state changed by another call meanwhile: this call's changes"
                    " applied over it", task_id=task_id, session=session, version=stored)
    return state, stored
