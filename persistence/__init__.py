"""The Store (SQLite, WAL, group commit), checkpoints with blob dedup, migrations."""

from ratchet.persistence.checkpoints import BLOB_THRESHOLD, StateDelta, StateTracker
from ratchet.persistence.store import LoadedState, Store, TaskRecord
from ratchet.persistence.txns import (
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
