"""The Store (SQLite, WAL, group commit), checkpoints with blob dedup, migrations."""

from persistence.checkpoints import BLOB_THRESHOLD, StateDelta, StateTracker
from persistence.store import LoadedState, Store, TaskRecord
from persistence.txns import (
    AcceptResult,
    ChangeResult,
    CheckpointWrite,
    DuplicateMessage,
    NewTask,
    OutboxRow,
    TaskChange,
)

__all__ = [
    "BLOB_THRESHOLD",
    "StateDelta",
    "StateTracker",
    "LoadedState",
    "Store",
    "TaskRecord",
    "AcceptResult",
    "ChangeResult",
    "CheckpointWrite",
    "DuplicateMessage",
    "NewTask",
    "OutboxRow",
    "TaskChange",
]
