"""The state a task actor starts from, without a read when there can be none.

A task that never committed a checkpoint (``last_checkpoint`` 0: every fresh task) has no
state rows: ``checkpoint_values`` rows are written with their checkpoint (seq ≥ 1), and
``last_checkpoint`` only grows, or is set by a fork together with the rows it copies. So
its start skips the store's state read — one reader round trip of the two a task start
cost (docs/operations.md, "Where the time goes", W2).
"""

from __future__ import annotations

from ratchet.persistence import LoadedState, TaskRecord
from ratchet.persistence.ports import TaskStore

__all__ = ["initial_state"]


async def initial_state(store: TaskStore, rec: TaskRecord) -> LoadedState:
    """The task's state at its last checkpoint (empty, with no read, before the first)."""
    if rec.last_checkpoint == 0:
        return LoadedState({}, {}, {})
    return await store.load_state(rec.task_id)
