"""A tool session's state written under its version (migration 25), by whichever node runs
the call: the task's own, or the node running a fan-out branch placed elsewhere
(actors/task/branch_host.py serves that branch's sessions there).

Every write is a compare-and-set on the version the writer read. A writer that loses the
race (another node's call changed the state meanwhile) reads the state again and applies
*its call's* changes to it key by key — the keys the call set, changed or removed — then
tries again: so a call's changes are never lost to another's, nor do they erase the keys
another changed. Calls of one session on one node are serialized by its actor's mailbox;
calls on two nodes at once are not, so two that change the same key keep the later
write's value (a warning is logged for each such merge).
"""

from __future__ import annotations

from typing import Any

import structlog

from ratchet.persistence.ports import TaskStore
from ratchet.protocol.errors import RatchetError

__all__ = ["MAX_MERGES", "merged", "save_change"]

log = structlog.get_logger("ratchet.session")

#: Compare-and-set attempts before a write gives up (raised: the call's step fails, and
#: its retry runs it again): each lost one means another call wrote in between.
MAX_MERGES = 8


def merged(fresh: dict[str, Any], before: dict[str, Any],
           after: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` with the changes that turned ``before`` into ``after`` (top-level keys)."""
    out = dict(fresh)
    for key in before.keys() - after.keys():
        out.pop(key, None)
    for key, value in after.items():
        if key not in before or before[key] != value:
            out[key] = value
    return out


async def save_change(store: TaskStore, task_id: str, session: str, before: dict[str, Any],
                      after: dict[str, Any], version: int, now: float
                      ) -> tuple[dict[str, Any], int]:
    """Store the state a call turned from ``before`` (read at ``version``) into ``after``;
    returns the state and version stored.

    Raises:
        RatchetError: (retryable) ``MAX_MERGES`` writes in a row lost to other writers.
    """
    state = after
    for _ in range(MAX_MERGES):
        if await store.save_session_state_if(task_id, session, state, now, version):
            return state, version + 1
        fresh, version = await store.session_state_at(task_id, session)
        log.warning("session state changed by another call meanwhile: this call's changes"
                    " applied over it", task_id=task_id, session=session, version=version)
        state = merged(fresh, before, after)
    raise RatchetError(f"session {session}: state not written, {MAX_MERGES} writes lost to"
                       " other writers", task_id=task_id, retryable=True)
